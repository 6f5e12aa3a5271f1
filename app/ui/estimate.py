"""How long a Live run takes, as its status line says: the first estimate from what this server's last runs at
the same K took (``app.host.learned.Learned``; before any ran, the library's ``dex_core.analysis.forecast``
from a round of the run's settings timed here, plus the page's share), then from the run's own measured rounds as
it goes (``Pace``). One figure of time left for the page; the host's bound on a request's model time said once,
plainly; a notice in the status line as soon as the measured pace passes the slow threshold."""

from __future__ import annotations

import time

from dex_core.analysis.forecast import Forecast

from ..host.learned import SLOW_SECONDS

PRIOR_WEIGHT = 8  # tokens' worth of belief in the prior rounds/token while the run's own count is small
PRIOR_ROUNDS = 4  # rounds' worth of belief in the forecast's seconds a round
SETTLE_ROUNDS = 10  # rounds after which the figures shown move at most STEADY a round
STEADY = 0.1  # a draft chain commits tokens in bursts: the raw figures would jump by a third in a round


class Pace:
    """A run's time left, revised after every round from its own measured seconds a round and rounds a token,
    the forecast's figures weighing in while the run has few of its own. ``clock`` is injectable (tests)."""

    def __init__(self, first: Forecast, K: int, max_new_tokens: int, bound: float = 0, clock=time.monotonic):
        self.first, self.K, self.max_new_tokens = first, K, max_new_tokens
        self.bound, self.clock = bound, clock
        self.start = clock()
        self.rounds = self.tokens = 0
        self.first_round = None  # when the first round ended: its seconds carry the prompt's prefill
        self.shown = None  # (rounds, the run's end in seconds since its start, the near token) as last shown
        self.warned = first.seconds > SLOW_SECONDS  # the warning before the run said so already

    def update(self, rounds: int, tokens: int) -> None:
        self.rounds, self.tokens = rounds, tokens
        if self.first_round is None:
            self.first_round = (self.clock(), rounds)
        end, near = self.elapsed() + self.left(), self._near_token()
        if self.shown is not None and rounds > SETTLE_ROUNDS:  # past the first rounds, STEADY a round at most
            ran, last_end, last_near = rounds - self.shown[0], self.shown[1], self.shown[2]
            end, near = _toward(last_end, end, ran), _toward(last_near, near, ran)
        self.shown = (rounds, end, near)

    def round_seconds(self) -> float:
        """Seconds a round: measured since the first round ended, the forecast's weighing in while few ran."""
        at, rounds = self.first_round
        ran = self.rounds - rounds
        measured = (self.clock() - at) / ran if ran else self.first.round_seconds
        return (self.first.round_seconds * PRIOR_ROUNDS + measured * ran) / (PRIOR_ROUNDS + ran)

    def elapsed(self) -> float:
        return self.clock() - self.start

    def left(self) -> float:
        """Seconds until the run reaches its token count, at this run's pace."""
        if self.rounds == 0:
            return max(0.0, self.first.seconds - self.elapsed())
        own = max(0, self.rounds - (self.K - 1))  # the rounds that made its tokens, past the pipeline's fill
        rpt = (self.first.rounds_per_token * PRIOR_WEIGHT + own) / (PRIOR_WEIGHT + self.tokens)
        fill = max(0, self.K - 1 - self.rounds)
        return self.round_seconds() * (fill + rpt * (self.max_new_tokens - self.tokens))

    def bounded(self) -> bool:
        """Whether the host's bound ends the run before its last token, at this pace."""
        return bool(self.bound) and self.elapsed() + self.left() > self.bound

    def _near_token(self) -> float:
        left = max(0.0, self.bound - self.elapsed())
        return self.tokens + (self.max_new_tokens - self.tokens) * left / max(self.left(), 1e-9)

    def near_token(self) -> float:
        """The token the host's bound ends the run near, as shown (steadied past the first rounds)."""
        return self.shown[2] if self.shown else self._near_token()

    def shown_left(self) -> float:
        """Seconds left to the run's last token, as shown (steadied past the first rounds)."""
        return max(0.0, self.shown[1] - self.elapsed()) if self.shown else self.left()

    def status(self) -> str:
        """The one time-left figure: to the last token, or to the host's bound when that comes first."""
        if self.bounded():
            left = max(0.0, self.bound - self.elapsed())
            return f"about {left:.0f} s left: this host's limit ends the run then, near token {self.near_token():.0f}"
        return f"about {self.shown_left():.0f} s left"

    def notice(self) -> str | None:
        """Once per run, from its 2K-th round on (a pace, not the pipeline's fill): the measured pace passes the
        slow threshold the forecast was under (None otherwise)."""
        if self.warned or self.rounds < 2 * self.K:
            return None
        total = self.elapsed() + self.left()
        if total <= SLOW_SECONDS:
            return None
        self.warned = True
        end = f" This host ends it after {self.bound:.0f} s with what it made." if self.bounded() else ""
        return (
            f"at this run's measured pace it takes about {total:.0f} s in all, more than the "
            f"{self.first.seconds:.0f} s first estimated; Stop ends it now with what it made.{end}"
        )


def _toward(last: float, new: float, rounds: int) -> float:
    """``new``, moved from ``last`` by at most ``STEADY`` a round over ``rounds`` rounds."""
    most = (1 + STEADY) ** max(1, rounds)
    return min(max(new, last / most), last * most)
