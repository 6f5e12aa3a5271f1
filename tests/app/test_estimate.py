"""The app's time estimates (``app.ui.estimate``) on an injected clock: the first one from this machine's one-row
profile, the revision from the run's measured rounds, one time-left figure, the mid-run notice, and what the
runtime learns from a finished run."""

from __future__ import annotations

from dataclasses import replace

import pytest

from app.ui import estimate
from app.ui.estimate import Pace
from dex_core.analysis.forecast import forecast
from dex_core.trace.events import RoundEvent


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_first_estimate_is_a_timed_round_times_the_expected_rounds_after_the_prefill_with_a_stated_range():
    first = forecast(
        0.365, K=4, max_new_tokens=128, rounds_per_token=None, basis="a round timed here", prefill=2.0
    )
    # the prefill, then K rounds fill the pipeline, then (K + 1) / 2 = 2.5 rounds a token; the range: 1 to K a token
    assert first.seconds == pytest.approx(2.0 + 0.365 * (4 + 127 * 2.5))
    assert (first.low, first.high) == pytest.approx((2.0 + 0.365 * (4 + 127), 2.0 + 0.365 * (4 + 127 * 4)))
    assert first.text() == "about 119 s (between 50 and 189 s; from a round timed here)"


def test_the_time_left_follows_the_runs_own_rounds_not_the_first_estimate():
    clock = Clock()
    first = forecast(
        0.1, K=4, max_new_tokens=100, rounds_per_token=None, basis="p"
    )  # 0.1 s a round, 2.5 a token
    pace = Pace(first, K=4, max_new_tokens=100, clock=clock)
    clock.now += 1.0
    assert pace.left() == pytest.approx(first.seconds - 1.0)  # no round yet: the forecast, counting down
    clock.now += 1.0
    pace.update(rounds=1, tokens=0)  # the first round carries the prompt's prefill: its time is not a pace
    assert pace.left() == pytest.approx(0.1 * (2 + 2.5 * 100))  # 2 more rounds of fill, then 2.5 a token
    # the machine is four times slower than profiled, and tokens match early: 2 rounds a token
    clock.now += 43.6  # 109 more rounds at 0.4 s
    pace.update(rounds=110, tokens=(110 - 3) // 2)
    per_round = (0.1 * estimate.PRIOR_ROUNDS + 0.4 * 109) / (estimate.PRIOR_ROUNDS + 109)
    rpt = (2.5 * estimate.PRIOR_WEIGHT + (110 - 3)) / (estimate.PRIOR_WEIGHT + 53)  # past the pipeline's fill
    assert pace.left() == pytest.approx(per_round * rpt * (100 - 53))
    assert pace.status() == f"about {pace.left():.0f} s left"


def test_past_the_hosts_bound_the_status_gives_one_figure_and_names_the_bound_once():
    clock = Clock()
    pace = Pace(forecast(0.5, 2, 100, None, "p"), K=2, max_new_tokens=100, bound=30, clock=clock)
    pace.update(rounds=1, tokens=0)
    clock.now += 20.0
    pace.update(rounds=21, tokens=10)  # about 1 s a token at this pace: 90 s more, past the 30 s bound
    status = pace.status()
    assert status.startswith("about 10 s left: this host's limit ends the run then, near token ")
    assert status.count(" s ") == 1 and "limit" in status
    assert 15 <= int(status.rsplit(" ", 1)[1]) <= 25  # 10 more seconds at about one token a second


def test_on_a_steady_clock_the_time_left_and_the_near_token_hold_within_10_percent_a_round_after_10(llama):
    from dex_core import DexDecoder
    from dex_core.testing import tiny_tokenizer

    decoder = DexDecoder(llama, explorers=3, tokenizer=tiny_tokenizer())
    events = decoder.generate([1, 2, 3, 4], 120).trace
    made = [len(e.commits) for e in events if isinstance(e, RoundEvent)]  # tokens each round committed
    clock, per_round = Clock(), 0.05
    expected = per_round * len(made)
    pace = Pace(
        forecast(per_round, 3, 120, None, "p"), K=3, max_new_tokens=120, bound=expected / 2, clock=clock
    )
    tokens, figures = 0, []
    for rounds, n in enumerate(made, 1):
        clock.now += per_round
        tokens += n
        pace.update(rounds=rounds, tokens=tokens)
        if pace.bounded():
            figures.append((pace.elapsed() + pace.shown_left(), pace.near_token()))
    assert len(figures) > 20
    for (end, near), (next_end, next_near) in zip(figures[10:], figures[11:]):
        steady = 0.1 + 1e-9  # the bound itself, and a rounding of it
        assert abs(next_end - end) <= steady * end and abs(next_near - near) <= steady * near, (
            end,
            next_end,
            near,
        )


def test_a_local_run_has_no_host_bound_and_a_space_has_one(monkeypatch):
    from app.host.settings import HOSTED_SECONDS, AppSettings

    monkeypatch.delenv("SPACE_ID", raising=False)
    assert AppSettings().request_seconds == 0
    monkeypatch.setenv("SPACE_ID", "someone/dex")
    assert AppSettings().request_seconds == HOSTED_SECONDS == 180
    assert AppSettings.from_env({"DEX_REQUEST_SECONDS": "30"}).request_seconds == 30  # a setting wins


def test_a_notice_comes_once_when_the_measured_pace_passes_the_slow_threshold(monkeypatch):
    monkeypatch.setattr(estimate, "SLOW_SECONDS", 60)
    clock = Clock()
    first = forecast(0.05, 4, 128, None, "p")  # about 16 s: under the threshold, so no warning before the run
    assert first.seconds < 60
    pace = Pace(first, K=4, max_new_tokens=128, bound=50, clock=clock)
    pace.update(rounds=1, tokens=0)
    clock.now += 6.0
    pace.update(rounds=7, tokens=2)  # 1 s a round, but 7 rounds are the pipeline's fill, not a pace
    assert pace.notice() is None
    clock.now += 2.0
    pace.update(rounds=9, tokens=3)
    notice = pace.notice()
    assert notice.startswith("at this run's measured pace it takes about ")
    assert "more than the 16 s first estimated" in notice and "ends it after 50 s" in notice
    clock.now += 10.0
    pace.update(rounds=19, tokens=8)
    assert pace.notice() is None  # said once
    warned = Pace(forecast(1.0, 4, 128, None, "p"), K=4, max_new_tokens=128, clock=clock)
    warned.update(rounds=1, tokens=0)
    clock.now += 8.0
    warned.update(rounds=9, tokens=3)
    assert warned.notice() is None  # the warning before the run said it already


def test_the_runtime_estimates_from_a_round_timed_here_then_learns_from_a_finished_run(tiny_dir, monkeypatch):
    from app.host.settings import AppSettings
    from app.host.state import Runtime
    from dex_core import DexDecoder
    from dex_core.analysis.forecast import BASIS, TIMED_ROUNDS

    runtime = Runtime(AppSettings(model=str(tiny_dir)))
    model, _ = runtime.model()
    decoder = DexDecoder(model, explorers=3, tokenizer=runtime.tokenizer())
    assert not runtime.round_timed(decoder)
    drawn = []
    first = runtime.forecast(decoder, 20, page=lambda cost: drawn.append(cost) or 0.25)
    cost = runtime.round_cost(decoder)
    assert runtime.round_timed(decoder) and drawn == [cost]  # timed once, the page's share with it
    rounds = [e for e in cost.events if isinstance(e, RoundEvent)]
    assert len(rounds) == 3 - 1 + TIMED_ROUNDS  # the pipeline's fill, then the timed rounds
    assert cost.round_seconds == pytest.approx(sum(e.timings["round"] for e in rounds[2:]) / TIMED_ROUNDS)
    assert first.basis == BASIS and first.rounds_per_token == 2
    assert first.round_seconds == pytest.approx(cost.round_seconds + 0.25)  # the page's seconds a round added
    assert first.seconds == pytest.approx(cost.prefill_seconds + first.round_seconds * (3 + 19 * 2))
    assert runtime.forecast(decoder, 20, page=lambda cost: 1 / 0).round_seconds == first.round_seconds  # kept
    events = decoder.generate([1, 2, 3], max_new_tokens=20).trace
    runtime.learn(3, events[:-1], 9.0)  # a run that did not finish teaches nothing
    assert runtime.forecast(decoder, 20).basis == BASIS
    runtime.learn(3, events, 9.0)  # its seconds as the page saw them
    stats = events[-1].stats
    learned = runtime.forecast(decoder, 20)
    assert learned.basis == "the last run at K=3"
    assert learned.seconds == pytest.approx(9.0 / stats.tokens * 20)  # seconds a token
    own = (stats.rounds - 2) / stats.tokens  # past the pipeline's fill
    assert learned.rounds_per_token == pytest.approx((2 + own) / 2)  # with the prior (K + 1) / 2 as one run
    other = replace(stats, rounds=2 + 40)
    runtime.learn(3, [*events[:-1], replace(events[-1], stats=other)], 27.0)
    again = runtime.forecast(decoder, 20)
    assert again.basis == "the last 2 runs at K=3"
    assert again.seconds == pytest.approx(18.0 / stats.tokens * 20)  # the mean of 9 s and 27 s a run
    assert again.rounds_per_token == pytest.approx((2 + own + 40 / stats.tokens) / 3)
    assert runtime.forecast(DexDecoder(model, explorers=2), 20).basis == BASIS  # per K
