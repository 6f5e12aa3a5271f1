"""How long a run takes on this machine before it runs: DEX on the sequential schedule (``run_forecast``, a
``Forecast`` with a range) and AR beside it (``ar_seconds``), from the one-row seconds of a decoder layer, the full
head and a light head (``profile.one_row_seconds``).

On CPU the sequential schedule runs the K explorers one after another each round; a pruned lattice computes about
one row an explorer a round. So a round costs every decoder layer at one row, a light proposal head at each
non-final stage and the full LM head at the last; a token costs ``rounds_per_token`` rounds after the K that fill
the pipeline: what earlier runs at that K measured, or (K + 1) / 2 (a token matched, on average, half-way down)
before any ran. The range: every token at the first stage (1 round; draft chains can beat it) to every token at
the last (K rounds, AR through K stages). An AR token costs every layer and the head at one row."""

from __future__ import annotations

from dataclasses import dataclass

from ..runtime.settings import RunSettings

BASIS = "this machine's profile"  # what a first forecast is made from


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


def round_seconds(one_row: dict, layers: int, K: int) -> float:
    """One sequential round at one row per explorer: ``one_row`` holds the seconds of a decoder layer, the full
    head and a light head at one row (``profile.one_row_seconds``)."""
    return layers * one_row["layer"] + (K - 1) * one_row["proposal"] + one_row["head"]


def forecast(
    seconds_per_round: float, K: int, max_new_tokens: int, rounds_per_token: float | None, basis: str
) -> Forecast:
    """A run of ``max_new_tokens`` at ``seconds_per_round`` and ``rounds_per_token`` (None: (K + 1) / 2)."""
    rpt = rounds_per_token or (K + 1) / 2

    def run(per_token: float) -> float:
        return seconds_per_round * (K + (max_new_tokens - 1) * per_token)

    return Forecast(run(rpt), run(1), run(K), seconds_per_round, rpt, basis)


def run_forecast(settings: RunSettings, max_new_tokens: int, one_row: dict) -> Forecast:
    """The first estimate of a sequential run of ``settings`` (its K stages over the model's layers) making
    ``max_new_tokens`` tokens, from this machine's ``one_row`` seconds (the light head's at the run's rows)."""
    layers = settings.depths[-1]  # the exploration set ends at the model's layer count
    return forecast(round_seconds(one_row, layers, settings.K), settings.K, max_new_tokens, None, BASIS)


def ar_seconds(one_row: dict, layers: int, tokens: int) -> float:
    """AR over the whole model for ``tokens`` tokens: every layer and the full head at one row, per token."""
    return tokens * (layers * one_row["layer"] + one_row["head"])
