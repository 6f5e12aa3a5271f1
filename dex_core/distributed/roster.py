"""Requests sharing rounds on explorer ranks: which requests are in each round, agreed by every rank (``serve_shared``).

The parent sends every rank the same messages in the same order (requests, then the switch back to one request at a
time, or close); cancels go to a set the rank's reader thread fills. Ranks receive them at different moments, so
before each step rank 0 decides the **roster** (the requests that leave: cancelled; those that join: received since;
whether the shared rounds end) and broadcasts it on the gloo control group; every rank then applies it, in order, to
its own ``Crew``: the same seats taken and freed, the same prompt chunk, the same round. A rank that has not yet
received a request the roster names waits for it in its inbox (the parent sent it to every rank). With nothing in
flight and nothing received, every rank waits on its own inbox, not in a collective, so an idle group never times out.

Rank 0 sends each request's trace events to the parent (``event_batch.EventBatch``), its end event made at its last
round. A rank that fails raises, and the group ends: every request in flight ends with the parent's one error
(``group.ExplorerGroup``).
"""

from __future__ import annotations

import queue
from collections import deque
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ..runtime.crew import Crew
from ..runtime.engine import ended
from .crew_wire import rank_crew
from .event_batch import EventBatch

ALONE = ("share", 1)  # the parent's message that ends the shared rounds: one request at a time again


@dataclass(frozen=True)
class Roster:
    """One step's membership, as rank 0 decided it: request ids leaving, ids joining, and how the shared rounds end
    ("close", "alone"), if they do."""

    leave: tuple[int, ...] = ()
    join: tuple[int, ...] = ()
    end: str | None = None


class Inbox:
    """A rank's messages from its parent in the order sent (``messages``: the reader thread's queue): those taken but
    not used yet (``filed``), and the ids of requests that left before this rank received them (``dropped``)."""

    def __init__(self, messages: queue.Queue):
        self.messages, self.filed, self.dropped = messages, deque(), set()
        self.pending: dict = {}  # rank 0's: requests its roster let join, by id, until they do

    def _take(self, block: bool = True) -> bool:
        """File the next message from the queue (False: none, without ``block``); a dropped request is skipped."""
        try:
            msg = self.messages.get(block)
        except queue.Empty:
            return False
        if msg[0] != "request" or msg[1].id not in self.dropped:
            self.filed.append(msg)
        return True

    def next(self):
        """The next message to act on (waits for one)."""
        while not self.filed:
            self._take()
        return self.filed.popleft()

    def drain(self) -> None:
        while self._take(block=False):
            pass

    def wait(self) -> None:
        """Wait until a message is filed."""
        while not self.filed:
            self._take()

    def find(self, match):
        """The first message for which ``match`` holds, taken out (waiting for it)."""
        while True:
            found = next((msg for msg in self.filed if match(msg)), None)
            if found is not None:
                self.filed.remove(found)
                return found
            self._take()

    def drop(self, rid: int) -> None:
        """Request ``rid`` left before it joined: out of the filed ones, or skipped when it comes."""
        kept = [msg for msg in self.filed if msg[0] != "request" or msg[1].id != rid]
        if len(kept) == len(self.filed):
            self.dropped.add(rid)
        self.filed = deque(kept)


def decided(inbox: Inbox, cancelled: set, members: list) -> Roster:
    """Rank 0's roster: the members and received requests cancelled leave; the other requests received join, in
    order, up to the first message that ends the shared rounds (taken)."""
    inbox.drain()
    leave = [m.run.request.id for m in members if m.run.request.id in cancelled]
    join, end = [], None
    while inbox.filed and end is None:
        msg = inbox.filed.popleft()
        if msg[0] == "request" and msg[1].id in cancelled:
            leave.append(msg[1].id)
        elif msg[0] == "request":
            join.append(msg[1].id)
            inbox.pending[msg[1].id] = msg[1]
        elif msg[0] == "close" or msg == ALONE:
            end = "close" if msg[0] == "close" else "alone"
    return Roster(tuple(leave), tuple(join), end)


def agreed(roster: Roster | None, control) -> Roster:
    """Rank 0's ``roster`` on every rank (a broadcast on the gloo ``control`` group; None there: the world's)."""
    box = [roster]
    dist.broadcast_object_list(box, src=0, group=control)
    return box[0]


def serve_shared(view, explorer, link, settings, inbox: Inbox, cancel, send, board=None) -> str:
    """Serve requests in shared rounds on this rank until the parent ends them: returns "alone" (one request at a
    time again) or "close". Rank 0 keeps the last round's rows and the rounds run in the last two slots of the
    group's ``board`` of rounds (``group.Tally``)."""
    crew = rank_crew(view, settings, explorer, link)  # the parent bounds the requests in flight
    rank, batches = link.rank, {}
    with torch.no_grad():
        while True:
            if not crew.members:
                inbox.wait()  # idle: on this rank's own inbox, in no collective
            roster = agreed(decided(inbox, cancel.ids, crew.members) if rank == 0 else None, link.ctrl)
            _apply(crew, inbox, roster, rank)
            for rid in roster.leave:  # cancelled: what its consumer no longer reads is not sent
                batches.pop(rid, None)
            if roster.end is not None:
                for m in list(crew.members):
                    crew._leave(m)
                return roster.end
            before = list(crew.members)
            crew._advance()
            if board is not None and rank == 0:
                board[len(board) - 2], board[len(board) - 1] = crew.rows, crew.rounds
            for m in before:
                _report(m, batches, send, rank)


def _apply(crew: Crew, inbox: Inbox, roster: Roster, rank: int) -> None:
    """``roster`` on this rank's crew: leavers out (or dropped before they come), joiners in, in order."""
    for rid in roster.leave:
        member = next((m for m in crew.members if m.run.request.id == rid), None)
        if member is not None:
            crew._leave(member)
        elif rank:
            inbox.drop(rid)
    for rid in roster.join:
        msg = inbox.find(lambda m: m[0] == "request" and m[1].id == rid) if rank else None
        crew._join(msg[1] if rank else inbox.pending.pop(rid))
    if roster.end == "alone" and rank:
        inbox.find(lambda m: m == ALONE)


def _report(member, batches: dict, send, rank: int) -> None:
    """Rank 0 sends ``member``'s new events (its end event after its last round); the others drop theirs."""
    if rank:
        member.events.clear()
        return
    rid = member.run.request.id
    batch = batches.get(rid) or batches.setdefault(rid, EventBatch(send, rid))
    while member.events:
        batch.add(member.events.popleft())
    if member.finished and not member.done:
        member.done = True
        batch.add(ended(member.run, None))
        del batches[rid]
