"""What a generation returns: its tokens, its statistics (rounds, matched stages, timings) and its trace."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Literal

from ..config import DexError
from ..trace.schema import Stopped
from ..trace.typed import EndEvent, parse_event

Stop = Literal["running", Stopped]
"""Why a generation stopped (``Stopped``): "eos" (the model's EOS token), "length" (``max_new_tokens``),
"cancelled" (the caller stopped a distributed stream early); "running" until then, never in a finished run's
stats or a trace."""


def matched_histogram(matched_stages, explorers: int) -> list[int]:
    """How many committed tokens were matched at each stage 0..K-1."""
    counts = [0] * explorers
    for k in matched_stages:
        counts[k] += 1
    return counts


@dataclass
class GenerationStats:
    explorers: int
    depths: list[int]
    tokens: int = 0
    rounds: int = 0
    rounds_per_token: float = 0.0
    depth_speedup: float = 0.0  # K / (rounds/token); AR through K stages = 1
    matched_stages: list[int] = field(default_factory=list)  # per committed token
    drafted: int = 0  # tokens committed from draft-chain slots (looked-up inputs), in the round before them
    batch_sizes: list[list[int]] = field(default_factory=list)  # per round, per explorer
    compute_seconds: list[float] = field(default_factory=list)  # per explorer, expansion only
    bookkeeping_seconds: float = 0.0  # plan + masks + commit + collapse
    communication_seconds: float = 0.0  # waiting on other explorers (distributed schedule)
    round_seconds: float = 0.0  # all rounds, end to end
    projected_seconds: float = 0.0  # sum over rounds of the round's projected time (trace/events.py)
    prefill_seconds: float = 0.0
    wall_seconds: float = 0.0
    tokens_per_second: float = 0.0
    stop: Stop = "running"

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def bookkeeping_share(self) -> float:
        return self.bookkeeping_seconds / self.round_seconds if self.round_seconds else 0.0

    def matched_histogram(self) -> list[int]:
        return matched_histogram(self.matched_stages, self.explorers)

    def add_round(self, timings: dict, batch_sizes: list[int]) -> None:
        """Account one round's timings (a round event's ``timings``) and batch sizes."""
        self.rounds += 1
        self.batch_sizes.append(batch_sizes)
        self.compute_seconds = [a + b for a, b in zip(self.compute_seconds, timings["expand"])]
        self.bookkeeping_seconds += timings["bookkeeping"]
        self.communication_seconds += timings["communication"]
        self.round_seconds += timings["round"]
        self.projected_seconds += timings["projected"]

    def finish(self, tokens: int, wall_seconds: float) -> None:
        """The run's totals once it stopped; still "running" at this point means it ran to its length."""
        self.stop = "length" if self.stop == "running" else self.stop
        self.tokens = tokens
        self.rounds_per_token = self.rounds / max(tokens, 1)
        self.depth_speedup = self.explorers / self.rounds_per_token if tokens else 0.0
        self.wall_seconds = wall_seconds
        self.tokens_per_second = tokens / wall_seconds if wall_seconds else 0.0


@dataclass
class GenerationResult:
    tokens: list[int]  # new tokens only; includes the EOS token when generation stopped there
    stats: GenerationStats
    trace: list[dict]

    @classmethod
    def from_trace(cls, trace: list[dict]) -> GenerationResult:
        """A finished run's result from its trace (the events a run streamed, in this process or from explorer
        processes, or a saved trace's): its end event, parsed once (``dex_core.trace.typed``)."""
        end = parse_event(trace[-1]) if trace else None
        if not isinstance(end, EndEvent):
            raise DexError("the trace has no end event (the run stopped early): it has no result")
        return cls(end.tokens, GenerationStats(**end.stats), trace)
