"""Requests in flight at once on an explorer group (``Flights``): the parent's side of shared rounds.

Each request goes to every rank; the ranks agree each step which requests share the round (``roster``), and rank 0's
events come back tagged with the request's id. No thread of its own: whichever consumer needs an event reads the
group's connections, under one lock, and files every event for its own request's consumer. Past ``most`` in flight, a
new request stops the oldest, which ends with ``DexError`` (as on the sequential schedule: ``runtime.crew``). A
consumer that stops early cancels its request (the ranks drop it at their next step; its late events are dropped).
When the group fails (a dead rank, a rank that raised, every rank silent), every request in flight ends with the same
``ExplorerError``, and the next request starts a fresh group. ``Tally``: what the ranks' shared rounds ran, for
``/metrics``.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections import deque
from dataclasses import dataclass, field

from ..runtime.crew import replaced
from ..runtime.request import Request
from ..trace.events import EndEvent
from ..values import DexError


@dataclass(eq=False)
class Flight:
    """One request in flight: its events waiting for its consumer, whether its end came, why it stopped without."""

    events: deque = field(default_factory=deque)
    done: bool = False
    error: Exception | None = None


class Flights:
    """The requests in flight on ``group`` (an ``ExplorerGroup`` whose ranks share rounds), at most ``most``."""

    def __init__(self, group, most: int):
        self.group, self.most = group, most
        self.flying: dict[int, Flight] = {}  # request id -> its flight, oldest first
        self.lock = threading.RLock()  # one reader of the group's connections at a time, a message at a time
        self._cancels: list[int] = []  # requests stopped early while another thread was sending: sent next

    def run(self, request: Request):
        """``request``'s trace events, its rounds shared with every request in flight."""
        with self.lock:
            rid, flight = self._launch(request)
        try:
            while True:
                with (
                    self.lock
                ):  # one message a hold: a consumer whose event is filed does not wait for others'
                    if flight.events:
                        event = flight.events.popleft()
                    elif flight.error is not None:
                        raise type(flight.error)(str(flight.error))
                    elif flight.done:
                        return
                    else:
                        self._read()
                        continue
                yield event
        finally:
            if self.flying.pop(rid, None) is not None:  # stopped early: the ranks drop it
                self._cancel(rid)

    def _launch(self, request: Request) -> tuple[int, Flight]:
        """Send ``request`` to every rank (a fresh group first, when the last one failed), the oldest in flight
        stopped while ``most`` are."""
        group = self.group
        if not group.alive:
            group.start()
        while len(self.flying) >= self.most:
            oldest = next(iter(self.flying))
            self.flying.pop(oldest).error = DexError(replaced(self.most))
            self._cancel(oldest)
        rid, group._next_id = group._next_id, group._next_id + 1
        flight = self.flying[rid] = Flight()
        group._activity = time.monotonic()
        group._send_all(("request", dataclasses.replace(request, id=rid)))
        return rid, flight

    def _read(self) -> None:
        """The group's next message, filed for its request; when the group fails, every request in flight ends with
        its error."""
        self._cancel()
        try:
            kind, rid, events = self.group._get(self.group._check_run)
        except (
            Exception
        ) as err:  # the group's ExplorerError (it ended every rank), or what else ended the read
            if self.group.alive:
                self.group.close()
            for flight in list(self.flying.values()):
                flight.error = err
            self.flying.clear()
            return
        flight = self.flying.get(rid) if kind == "events" else None
        if flight is not None:
            flight.events.extend(events)
            if isinstance(events[-1], EndEvent):
                flight.done = True
                self.flying.pop(rid, None)

    def _cancel(self, rid: int | None = None) -> None:
        """Tell the ranks to drop request ``rid`` and any whose cancel waited; without waiting for a thread that is
        sending (a stream closed by the collector inside a send): the cancel then goes with the next one."""
        if rid is not None:
            self._cancels.append(rid)
        sending = self.group._sending
        if not self._cancels or not sending.acquire(blocking=False):
            return
        try:
            while self._cancels and self.group.alive:
                self.group._send_all(("cancel", self._cancels.pop(0)))
        finally:
            sending.release()


class Tally:
    """Rank 0's count of its group's shared rounds, read off the board's last two slots: the ``rows`` the last one ran
    (every stage's and every lane's, padding included, as the sequential schedule counts them: ``crew.rows_run``), and
    the ``rounds`` run since the ranks last began sharing them (0 while no group is alive)."""

    def __init__(self, group):
        self.group = group

    def _slot(self, k: int) -> int:
        return self.group._rounds[self.group.count + k] if self.group.alive else 0

    @property
    def rows(self) -> int:
        return self._slot(0)

    @property
    def rounds(self) -> int:
        return self._slot(1)
