"""What a generation returns: its tokens, its statistics (rounds, matched stages, timings: ``GenerationStats``, as its
end event records them) and its trace."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..config import DexError
from ..trace.events import EndEvent, Event
from ..trace.stats import GenerationStats


@dataclass
class GenerationResult:
    tokens: list[int]  # new tokens only; includes the EOS token when generation stopped there
    stats: GenerationStats
    trace: list[Event]

    @classmethod
    def from_trace(cls, trace: list[Event]) -> GenerationResult:
        """A finished run's result from its typed trace (the events a run streamed, or a loaded trace's): its end
        event's tokens and stats."""
        end = trace[-1] if trace else None
        if not isinstance(end, EndEvent):
            raise DexError("the trace has no end event (the run stopped early): it has no result")
        return cls(list(end.tokens), dataclasses.replace(end.stats), trace)
