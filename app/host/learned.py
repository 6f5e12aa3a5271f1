"""What the host learns from finished runs for the next run's first estimate (``Learned``, one per K), and the
threshold past which a run's expected time earns a warning (``SLOW_SECONDS``). The page's estimate of a run in
progress is ``app.ui.estimate.Pace``."""

from __future__ import annotations

from dex_core.analysis.forecast import Forecast, forecast
from dex_core.trace.stats import GenerationStats

SLOW_SECONDS = 60  # a run expected to take longer gets a warning before it, or a notice during it
LEARNED_RUNS = 4  # finished runs whose rounds a token the next first estimate averages


class Learned:
    """What finished runs at one K teach the next run's first estimate: seconds a token, averaged over the last
    ``LEARNED_RUNS`` runs. Per token, not per round: draft chains trade rounds for rows (code that repeats
    itself takes fewer, fuller rounds a token than prose), so a run's seconds a round and rounds a token each
    mislead the next run by up to 1.9x here, while their product holds within 10-20 %. The rounds a token
    (the last runs' and the prior (K + 1) / 2 as one more) only split it for ``Pace``'s revisions."""

    def __init__(self, K: int):
        self.K, self.runs = K, []  # (seconds a token, rounds a token past the pipeline's fill) per run

    def add(self, stats: GenerationStats, seconds: float) -> None:
        """A finished run's end-event stats and its ``seconds`` as the page saw them (its frames drawn too)."""
        if stats.rounds >= self.K and stats.tokens and stats.stop != "cancelled":
            own = (stats.rounds - (self.K - 1)) / stats.tokens
            self.runs = [*self.runs, (seconds / stats.tokens, own)][-LEARNED_RUNS:]

    def forecast(self, max_new_tokens: int) -> Forecast | None:
        if not self.runs:
            return None
        per_token = sum(s for s, _ in self.runs) / len(self.runs)
        rpt = ((self.K + 1) / 2 + sum(r for _, r in self.runs)) / (1 + len(self.runs))
        n = len(self.runs)
        basis = f"the last {n} runs at K={self.K}" if n > 1 else f"the last run at K={self.K}"
        per_round = per_token * max_new_tokens / (self.K + (max_new_tokens - 1) * rpt)  # per_token x n in all
        return forecast(per_round, self.K, max_new_tokens, rpt, basis)
