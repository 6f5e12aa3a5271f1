"""Rank 0's trace events to its parent, a batch at a time (``EventBatch``)."""

from __future__ import annotations

import time

from ..trace.events import EndEvent, Event

BATCH_SECONDS = 0.02  # rank 0 sends its trace events at most this late (the end event at once)


class EventBatch:
    """Rank 0's trace events to its parent, a batch at a time: a message (pickled, sent, received, unpickled) each
    round would cost the round loop and the parent a wake-up per round (rounds of a GPU stage last about a
    millisecond). An event goes at once when ``BATCH_SECONDS`` have passed since the last message (so a round
    slower than that is never held back), else with the next one that does, or with the end event."""

    def __init__(self, send, request_id: int, clock=time.monotonic):
        self.send, self.id, self.clock = send, request_id, clock
        self.events: list[Event] = []
        self.last = clock()

    def add(self, event: Event) -> None:
        self.events.append(event)
        now = self.clock()
        if isinstance(event, EndEvent) or now - self.last >= BATCH_SECONDS:
            self.send("events", self.id, self.events)
            self.events, self.last = [], now
