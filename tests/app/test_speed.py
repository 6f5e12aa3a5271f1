"""One speed for one run (the glossary's "model tokens/s", docs/APP.md): a real tiny-model Live run whose page takes
long to draw each frame, on an injected clock, gives the figure the Race's clock gives for the same run; the drawing
shows as end-to-end tokens/s, and Live draws fewer frames while drawing falls behind."""

from __future__ import annotations

import re
import time
from types import SimpleNamespace

import pytest

from app.ui import live
from app.ui.handlers import StopRequests
from app.ui.inputs import Inputs
from app.ui.race import Lane, Race
from dex_core.trace.events import RoundEvent

PROMPT = "hello world the prime number"
DRAW = 0.2  # injected seconds the page takes to draw and send one round's frame


def number(label: str, html: str) -> float:
    """The figure under ``label`` in a stats panel's cells."""
    found = re.search(re.escape(label) + r"</div><div[^>]*><b>([0-9.]+)</b>", html)
    assert found, f"no {label!r} in the panel"
    return float(found.group(1))


@pytest.fixture
def slow_page(monkeypatch):
    """The run's clock and Live's frame clock read one injected time: the host's, plus DRAW for every round frame
    the page drew (``drawn``)."""
    drawn = []

    def now() -> float:
        return time.perf_counter() + DRAW * len(drawn)

    fake = SimpleNamespace(perf_counter=now)
    monkeypatch.setattr("dex_core.runtime.clock.time", fake)
    monkeypatch.setattr(live, "time", fake)
    return drawn


def test_live_and_the_race_give_one_model_speed_for_one_run_however_slow_the_page(tiny_dir, slow_page):
    from app.host.settings import AppSettings
    from app.host.state import Runtime

    runtime = Runtime(AppSettings(model=str(tiny_dir)))
    inputs = Inputs(PROMPT, False, 3, "", False, True, False, 1.0, 0, 1.0, 0, 64)
    frames = []
    for frame in live.live_frames(runtime, StopRequests(), inputs):
        frames.append(frame)
        if (
            isinstance(frame[4], list)
            and any(isinstance(e, RoundEvent) for e in frame[4])
            and "'running'" in frame[-1]
        ):
            slow_page.append(len(frames))  # a round's frame: the page takes DRAW over it
    events, stats_panel = frames[-1][4], frames[-1][3]
    end = events[-1]
    rounds = sum(isinstance(e, RoundEvent) for e in events)
    # the page drew fewer frames than rounds, and its drawing stayed within its share (one frame's over at most)
    assert 0 < len(slow_page) < rounds
    share = live.DRAW_SHARE / (1 - live.DRAW_SHARE)
    # (the allowance: the frame drawn over budget, and a share of the Live loop's own work a round, which the frames'
    # budget counts as the run's; on a busy machine it grows, and the reader's seconds with it: not asserted)
    assert DRAW * len(slow_page) <= share * end.stats.model_seconds + DRAW + 0.25
    assert end.stats.reader_seconds >= DRAW * len(slow_page)  # every drawn frame counted as the reader's
    # Live's panel: model tokens/s over the run's own seconds; end to end, the drawing included
    model = number("model tokens/s", stats_panel)
    assert model == pytest.approx(end.stats.tokens / end.stats.model_seconds, abs=0.051)
    whole = number("end-to-end tokens/s", stats_panel)
    assert whole == pytest.approx(end.stats.tokens / end.stats.wall_seconds, abs=0.051) and whole < model
    # the Race's clock over the same run's events: each round's prefill and round seconds, AR's lane already ended
    race = Race(
        ar=Lane("AR", iter([end])),
        dex=Lane("DEX", iter(events[1:])),
        decoder=SimpleNamespace(K=3, group=None),
        tokenizer=runtime.tokenizer(),
        start=events[0],
        profile=None,
    )
    while not race.done:
        race.step()
    summary = race.view()[3]
    raced = float(
        re.search(r"DEX \(sequential[^)]*\) \d+ tokens in [0-9.]+ s \(([0-9.]+) model tokens/s\)", summary)[1]
    )
    assert raced == pytest.approx(model, rel=0.02)


def test_a_step_slowed_by_the_frame_before_it_counts_the_slowing_as_the_frames():
    now = [0.0]

    def steps(seconds):  # running steps, each taking its seconds of the injected clock
        for s in seconds:
            now[0] += s
            yield live.Step("running", "round", run=object())

    frames = live.Frames(clock=lambda: now[0])
    drawn = []
    for step in frames.steps(steps([1.0, 1.0, 1.0, 3.0, 1.0, 1.0])):
        if frames.due(step):
            for _ in frames.drawn(lambda: "frame", step):
                now[0] += 0.1  # the page holds the run 0.1 s a frame
                drawn.append(now[0])
    # steps 1-3 drawn (0.3 s of frames in budget); step 4 runs 2 s over its usual 1 s after the third frame: that is
    # the frame's, which puts drawing (2.3 s) past a third of the run's own 4, 5 and 6 s, so 4-6 are not drawn
    assert len(drawn) == 3
    assert frames.drawing == pytest.approx(0.3 + 2.0) and frames.working == pytest.approx(6.0)
    assert frames.working + frames.drawing == pytest.approx(now[0])


def test_loading_the_model_before_the_run_buys_its_page_no_drawing():
    """Drawing's share is of the run's own seconds: 10 s loading the model (a status line before the run) lets no
    more frames through than a run with none: rounds 1, 2, 4 and 6 of six 1 s rounds, drawing then 2.4 s, within a
    third of the run's 6 s and one frame."""
    now = [0.0]

    def steps(loading):
        now[0] += loading
        yield live.Step("running", "loading the model")
        for _ in range(6):
            now[0] += 1.0
            yield live.Step("running", "round", run=object())

    for loading in (0.0, 10.0):
        frames, drawn = live.Frames(clock=lambda: now[0]), 0
        for step in frames.steps(steps(loading)):
            if frames.due(step):
                for _ in frames.drawn(lambda: "frame", step):
                    now[0] += 0.6 * live._round(step)  # a slow page: 0.6 s a round's frame
                    drawn += live._round(step)
        assert drawn == 4 and frames.working == pytest.approx(6.0)
