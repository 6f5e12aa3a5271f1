"""Status in step (issue 64): Play and each of its ticks say the round they show in the same update as its frame,
and the Analysis's progress names each phase in order and never reads all done before its result."""

import gradio as gr

STATE = "data-state='finished'"


def test_play_and_each_tick_name_the_round_they_show_in_the_status_line():
    from app.ui import debugger as dbg

    opened = dbg.bundled(None)
    events, meta, origin = opened.events, opened.meta, opened.origin
    rounds = [v.round for v in dbg.views(events)]
    first, last = rounds[0], rounds[-1]
    before = dbg.stepped(events, meta, origin, last, "")
    played = dbg.play(events, last, meta, origin, before)  # from the last round: back to the first
    assert (
        played[6].value == first and f"round {first} of {first}..{last} " in played[7] and STATE in played[7]
    )
    tick = dbg.play_tick(events, first, True, meta, origin, played[7])
    assert tick[4].value == rounds[1] and f"round {rounds[1]} of {first}..{last} " in tick[6]
    end = dbg.play_tick(events, rounds[-2], True, meta, origin, tick[6])
    assert end[5].active is False and f"round {last} of {first}..{last} " in end[6]  # the last round stops it
    assert dbg.play_tick(events, 5, False, meta, origin, tick[6])[6] == gr.skip()  # after Pause: nothing


def test_the_analysis_names_each_phase_in_order_and_never_reports_all_done_before_its_result(
    tiny_dir, monkeypatch
):
    from app.host.settings import AppSettings
    from app.host.state import Runtime
    from app.ui.analysis import STEPS, analyse

    runtime = Runtime(AppSettings(model=str(tiny_dir), explorers=3))
    monkeypatch.setattr(runtime, "slow_notice", lambda *a, **k: None)  # no profile measured
    told = []
    figures = analyse(
        runtime, "hello world", False, False, 6, progress=lambda p, desc="", **k: told.append((p, desc))
    )
    assert len(figures) == 4 and told[0] == (0, "loading the model (once per server)")
    tokens = [p for p, desc in told if desc == "the greedy answer"]
    assert tokens == [(k, 6) for k in range(1, 6)]  # never 6 of 6: the analysis follows at once
    steps = [(p, desc) for p, desc in told if isinstance(p, tuple) and desc.startswith("analysing")]
    assert [p for p, _ in steps] == [(i, len(STEPS)) for i in range(len(STEPS))]
    assert [desc for _, desc in steps] == [f"analysing 6 tokens: {name}" for name in STEPS]
    assert not any(p == 1 or p == 1.0 for p, _ in told)
