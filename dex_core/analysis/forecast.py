"""How long a run takes on this machine before it runs: DEX on the sequential schedule (``forecast``, a ``Forecast``
with a range, from what a round costs here: ``time_rounds``) and AR beside it (``ar_seconds``, from the one-row
seconds of a decoder layer and the full head: ``profile.one_row_seconds``).

A round is timed, not added up from layers: a short real run of the decoder at the run's own settings (its rows a
round, its heads and adapters, DEX's host work: plan, masks, commit, collapse, the trace record) on a fixed prompt,
past the K rounds that fill its pipeline. Layers timed one at a time at one row miss most of that (in a loop they
also run from warm caches): first estimates made that way were 7-10x low on the default model
(``benchmarks/live_estimates.py``). A token costs ``rounds_per_token`` rounds after the K that fill the pipeline:
what earlier runs at that K measured, or (K + 1) / 2 (a token matched, on average, half-way down) before any ran.
The range: every token at the first stage (1 round; draft chains can beat it) to every token at the last (K rounds,
AR through K stages). An AR token costs every layer and the head at one row."""

from __future__ import annotations

from dataclasses import dataclass

from ..trace.events import RoundEvent

BASIS = "a round timed on this machine"  # what a first forecast is made from


@dataclass(frozen=True)
class Forecast:
    seconds: float  # the whole run, expected
    low: float
    high: float
    round_seconds: float
    rounds_per_token: float
    basis: str  # what it was made from: this machine's profile, or the last runs at this K

    def text(self) -> str:
        return f"about {self.seconds:.0f} s (between {self.low:.0f} and {self.high:.0f} s; from {self.basis})"


@dataclass(frozen=True)
class RoundCost:
    """What a round costs here at one run's settings (``time_rounds``): model seconds a round past the pipeline's
    fill, the prompt's prefill, and the short run's events (the page times drawing them)."""

    round_seconds: float
    prefill_seconds: float
    events: list


TIMED_ROUNDS = 4  # rounds timed past the pipeline's fill: the lattice holds its rows by then


def time_rounds(decoder, ids: list[int]) -> RoundCost:
    """A short real run of ``decoder`` on ``ids`` (greedy), stopped after its K - 1 filling rounds and
    ``TIMED_ROUNDS`` more; the mean model seconds of those (each round's own ``timings``: its reader left out)."""
    stream = decoder.stream(ids, max_new_tokens=decoder.K + TIMED_ROUNDS * 8)
    events, rounds = [], []
    try:
        for event in stream:
            events.append(event)
            if isinstance(event, RoundEvent):
                rounds.append(event.timings)
            if len(rounds) >= decoder.K - 1 + TIMED_ROUNDS:
                break
    finally:
        stream.close()
    timed = rounds[decoder.K - 1 :] or rounds
    per_round = sum(t["round"] for t in timed) / max(1, len(timed))
    return RoundCost(per_round, sum(t["prefill"] for t in rounds), events)


def forecast(
    seconds_per_round: float,
    K: int,
    max_new_tokens: int,
    rounds_per_token: float | None,
    basis: str,
    prefill: float = 0.0,
) -> Forecast:
    """A run of ``max_new_tokens`` at ``seconds_per_round`` and ``rounds_per_token`` (None: (K + 1) / 2), after a
    ``prefill`` of that many seconds."""
    rpt = rounds_per_token or (K + 1) / 2

    def run(per_token: float) -> float:
        return prefill + seconds_per_round * (K + (max_new_tokens - 1) * per_token)

    return Forecast(run(rpt), run(1), run(K), seconds_per_round, rpt, basis)


def ar_seconds(one_row: dict, layers: int, tokens: int) -> float:
    """AR over the whole model for ``tokens`` tokens: every layer and the full head at one row, per token."""
    return tokens * (layers * one_row["layer"] + one_row["head"])
