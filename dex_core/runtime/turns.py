"""One run at a time on a schedule's explorers (``Turns``).

A decoder's explorers hold one run's state: its caches, its lattice's rows, its explorer processes' place in the
request. Two runs that step in turn on them would each overwrite the other's. A caller can make that happen without
meaning to: a server whose visitor cancelled a streamed request frees its slot while the thread that was advancing the
stream finishes the step under way, and the next request's stream then starts beside it. ``Turns`` keeps every step of
a decoder's runs apart and gives the explorers to the newest run: a run's first step waits for the step under way and
closes the run it replaces (an explorer group is told to stop that request); the replaced run's next step raises
``DexError`` rather than read state it no longer owns.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator

from ..values import DexError

REPLACED = (
    "this decoder began another run before this one ended, and its explorers serve one run at a time: this run "
    "stopped. Run requests one after another on a decoder, or use a decoder each."
)


class Turns:
    """The steps of one decoder's runs, one at a time, the explorers the newest run's."""

    def __init__(self):
        self._step = threading.RLock()  # re-entrant: a replaced run collected mid-step closes under it
        self._book = threading.Lock()  # numbers runs without waiting for a step
        self._numbers = itertools.count(1)  # under _book
        self._newest = 0  # the number of the run that owns the explorers
        self._current: Iterator | None = None  # its steps

    def take(self, steps: Iterator) -> Iterator:
        """``steps`` (a schedule's run) as a run of its own: the explorers are its from its first step until a
        newer run's first step."""
        with self._book:  # from now an older run stops at its next step, without waiting for this one's
            number = next(self._numbers)
            self._newest = number
        try:
            while True:
                with self._step:
                    if self._newest != number:
                        raise DexError(REPLACED)
                    if self._current is not steps:
                        self._end(self._current)
                        self._current = steps
                    try:
                        event = next(steps)
                    except StopIteration:
                        return
                yield event
        finally:
            with self._step:
                if self._current is steps:
                    self._end(steps)
                    self._current = None

    @staticmethod
    def _end(steps: Iterator | None) -> None:
        close = getattr(steps, "close", None)
        if close is not None:
            close()
