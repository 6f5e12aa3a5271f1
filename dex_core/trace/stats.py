"""A run's statistics (``GenerationStats``): rounds, matched stages, batch sizes and seconds, as the run counts them
and as its end event records them (each field declared once, with its JSON Schema)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .schema import (
    STOPS,
    Stopped,
    TraceLimits,
    array,
    integer,
    k_range,
    number,
    one_of,
    scalar,
    schema_of,
    spec,
)

Stop = Literal["running", Stopped]
"""Why a generation stopped (``Stopped``): "eos" (the model's EOS token), "length" (``max_new_tokens``),
"cancelled" (the caller stopped a distributed stream early); "running" until then, never in a finished run's
stats or a trace."""


def matched_histogram(matched_stages, K: int) -> list[int]:
    """How many committed tokens were matched at each stage 0..K-1."""
    counts = [0] * K
    for k in matched_stages:
        counts[k] += 1
    return counts


_K = lambda lim: lim.max_explorers  # noqa: E731


def _seconds():
    return spec(number(), 0.0)


@dataclass
class GenerationStats:
    explorers: int = spec(k_range())
    depths: list[int] = spec(array(integer(1), _K))
    tokens: int = spec(integer(), 0)
    rounds: int = spec(integer(), 0)
    rounds_per_token: float = spec(number(), 0.0)
    depth_speedup: float = spec(number(), 0.0)  # K / (rounds/token); AR through K stages = 1
    matched_stages: list[int] = spec(  # per committed token
        array(k_range(0, 1), lambda lim: lim.max_tokens), factory=list
    )
    drafted: int = spec(integer(), 0)  # tokens committed from draft-chain slots (looked-up inputs)
    batch_sizes: list[list[int]] = spec(  # per round, per explorer
        array(array(integer(), _K), lambda lim: lim.max_rounds), factory=list
    )
    compute_seconds: list[float] = spec(array(number(), _K), factory=list)  # per explorer, expansion only
    bookkeeping_seconds: float = _seconds()  # plan + masks + commit + collapse
    communication_seconds: float = _seconds()  # waiting on other explorers (distributed schedule)
    round_seconds: float = _seconds()  # all rounds, end to end
    projected_seconds: float = _seconds()  # sum over rounds of the round's projected time (trace/build.py)
    prefill_seconds: float = _seconds()
    wall_seconds: float = _seconds()  # from the run's start to its end event, its reader's time included
    reader_seconds: float = (
        _seconds()
    )  # the run waiting for its reader (a page drawing its rounds), in wall_seconds
    model_seconds: float = _seconds()  # wall_seconds less reader_seconds: the run's own compute and host work
    tokens_per_second: float = _seconds()  # model tokens/s: tokens / model_seconds
    end_to_end_tokens_per_second: float = _seconds()  # tokens / wall_seconds, drawing and streaming included
    stop: Stop = spec(one_of(STOPS), "running")

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

    def finish(self, tokens: int, wall_seconds: float, reader_seconds: float = 0.0) -> None:
        """The run's totals once it stopped; still "running" at this point means it ran to its length. Its speed is
        the model's (``tokens_per_second``: tokens over the run's own seconds, what the Race's clock counts) and, where
        its reader took time between rounds, end to end (``end_to_end_tokens_per_second``)."""
        self.stop = "length" if self.stop == "running" else self.stop
        self.tokens = tokens
        self.rounds_per_token = self.rounds / max(tokens, 1)
        self.depth_speedup = self.explorers / self.rounds_per_token if tokens else 0.0
        self.wall_seconds = wall_seconds
        self.reader_seconds = min(reader_seconds, wall_seconds)
        self.model_seconds = wall_seconds - self.reader_seconds
        self.tokens_per_second = tokens / self.model_seconds if self.model_seconds else 0.0
        self.end_to_end_tokens_per_second = tokens / wall_seconds if wall_seconds else 0.0


def stats_schema(lim: TraceLimits) -> dict:
    """The end event's ``stats``: every key optional; a key this DEX does not know is a number, a string or a list of
    numbers (recorded by another version)."""
    other = {"anyOf": [scalar(lim), array(number(-1e15), lambda lim: lim.max_rounds)(lim)]}
    declared = {k: v for k, v in schema_of(GenerationStats, lim).items() if k != "required"}
    return {**declared, "maxProperties": 64, "additionalProperties": other}
