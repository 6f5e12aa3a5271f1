"""The Gradio app end to end: its API through gradio_client, and its page in a real browser."""

import json
import re
from dataclasses import replace

import pytest
from helpers import needs_chromium, shown_tokens

from dex_core import DexDecoder, ar_generate, encode_prompt
from dex_core.testing import tiny_tokenizer
from dex_core.trace.events import RoundEvent, StartEvent

PROMPT = "hello world the prime number"


def test_streaming_endpoint_updates_as_rounds_go_and_ends_with_ar_text(app_server, tiny_dir):
    from gradio_client import Client
    from transformers import AutoModelForCausalLM

    from app.ui.inputs import Inputs

    client = Client(app_server.url, verbose=False)
    controls = (
        False,
        3,
        "",
        False,
        True,
        False,
        1.0,
        0,
        1.0,
        0,
        16,
    )  # chat … max_new_tokens, as the Live tab sends them
    job = client.submit(PROMPT, *controls, api_name="/generate")
    updates = list(job)
    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    tok = tiny_tokenizer()
    ids = encode_prompt(tok, PROMPT, chat=False)
    # the same run in-process, with the options the app derives from those controls
    names = (
        "chat",
        "explorers",
        "depths",
        "adapters",
        "decs",
        "sample",
        "temperature",
        "top_k",
        "top_p",
        "seed",
        "max_new_tokens",
    )
    config = Inputs(**dict(zip(names, controls))).config()
    trace = (
        DexDecoder(model, config.decoder(), tokenizer=tok)
        .generate(ids, options=config.generation(), node_text=True)
        .trace
    )
    rounds = [e for e in trace if isinstance(e, RoundEvent)]
    # a frame for the first round and then as drawing keeps up (app.ui.live.Frames: rounds coalesced while it falls
    # behind), in order, each showing the tokens committed up to its round
    frames = [(int(m.group(1)), u) for u in updates if (m := re.search(r"round (\d+) ·", u[4]))]
    shown = [r for r, _ in frames]
    assert shown[0] == 1 and shown == sorted(set(shown)) and set(shown) <= {e.round for e in rounds}
    committed = [[c.token for c in e.commits] for e in rounds]
    for r, frame in frames:
        assert shown_tokens(frame[0]) == "".join(tok.decode([t]) for ts in committed[:r] for t in ts), r
    ar = ar_generate(model, ids, 16).tokens
    assert shown_tokens(updates[-1][0]) == "".join(tok.decode([t]) for t in ar)
    assert "rounds/token" in updates[-1][3]
    assert (
        len(updates[-1]) == 5 and "data-state='finished'" in updates[-1][4]
    )  # text, lattice, FSM, stats, status


def test_race_endpoint_reports_identical_output(app_server):
    from gradio_client import Client

    ar_text, dex_text, _, summary = Client(app_server.url, verbose=False).predict(
        PROMPT, False, 3, False, 12, api_name="/race"
    )
    assert ar_text == dex_text and "identical output" in summary
    assert "DEX ran at" in summary and "— a projection" in summary and "rounds per token" in summary
    assert "Cost per token" in summary and "Where DEX wins" in summary
    assert "interleaved" in summary and "a projection from the cost model" in summary


def test_analysis_endpoint_predicts_speedups_and_suggests_exploration_sets(app_server):
    from gradio_client import Client

    _, _, table, depth = Client(app_server.url, verbose=False).predict(
        PROMPT, False, False, 16, "rank", api_name="/analyse"
    )
    assert (
        "best depths" in table
        and "oracle S_EAD" in table
        and "of AR's" in table
        and "DEX can beat it" in table
    )
    rows = re.findall(r"<tr><td>(\d)</td>", table)
    assert rows == ["2", "3", "4", "5", "6"]  # K up to the tiny model's 6 layers; 7 and 8 need more
    assert "Depth view" in str(depth) and "rank" in str(depth)


def test_bad_input_is_one_error_status_and_leaves_the_panels_unchanged(app_server):
    from gradio_client import Client

    job = Client(app_server.url, verbose=False).submit(
        PROMPT, False, 3, "2,4", False, True, False, 1.0, 0, 1.0, 0, 8, api_name="/generate"
    )
    *_, last = list(job)
    status = last[-1]
    assert "data-state='error'" in status and "must end at the model&#x27;s 6 layers" in status
    assert "previous run" in status


STATE = "document.querySelector('#live-status [data-state]')?.dataset.state"
SPEED = """() => { const cells = [...document.querySelectorAll('#live-stats div > div')];
  const label = cells.find(c => c.innerText.trim() === 'model tokens/s');
  return label && label.nextElementSibling.innerText; }"""


@needs_chromium
def test_browser_generates_draws_the_lattice_races_it_and_steps_back_in_the_debugger(
    app_server, page, tmp_path
):
    page.goto(app_server.url, timeout=60_000)
    page.locator("#live-prompt textarea").fill(PROMPT)
    page.locator("#live-generate").click()
    plot = page.locator("#live-lattice .js-plotly-plot")
    plot.wait_for(timeout=60_000)
    page.wait_for_function(
        "() => { const gd = document.querySelector('#live-lattice .js-plotly-plot');"
        " return gd && gd.data && gd.data.some(t => t.mode && t.mode.includes('markers') && t.x && t.x.length); }",
        timeout=60_000,
    )
    page.wait_for_function(
        "() => document.querySelector('#live-stats')?.innerText.includes('tokens/s')", timeout=60_000
    )
    tokens = page.locator("#live-text .dex-tok").count()
    page.get_by_role("tab", name="Race").click()
    page.locator("#race-prompt textarea").fill(PROMPT)
    page.locator("#race-new input[type=number]").fill(str(tokens))
    page.locator("#race-new input[type=number]").press("Enter")
    page.locator("#race-go").click()
    page.wait_for_function(
        "() => document.querySelector('#race-badge')?.innerText.includes('identical output')", timeout=120_000
    )
    measured = page.inner_text("#race-measured")
    raced = re.search(
        r"DEX \(sequential[^)]*\) \d+ tokens in [0-9.]+ s \(([0-9.]+) model tokens/s\)", measured
    )
    page.get_by_role("tab", name="Live").click()  # the same run again, as warm as the Race's
    page.evaluate("() => { document.querySelector('#live-status [data-state]').dataset.state = 'seen'; }")
    page.locator("#live-generate").click()  # the status redrawn: its state is the new run's
    page.wait_for_function(f"() => {STATE} === 'finished'", timeout=60_000)
    live_speed = float(page.evaluate(SPEED))  # under the glossary's label (docs/APP.md), as the Race's is
    # two runs of one prompt, each under its own page's frames (on the tiny model a round takes a few ms, and the
    # frames Gradio sends meanwhile slow it by up to 3x): one figure up to that; with the page's drawing counted
    # in (the bug) Live's was 60x lower
    assert 1 / 6 < float(raced[1]) / live_speed < 6, (measured, live_speed)
    page.get_by_role("tab", name="Debugger").click()
    page.locator("#dbg-lattice .js-plotly-plot").wait_for(timeout=60_000)
    title = "() => document.querySelector('#dbg-lattice .js-plotly-plot').layout.title.text"
    last = page.evaluate(title)
    page.locator("#dbg-prev").click()
    page.wait_for_function(f"() => ({title})() !== {last!r}", timeout=30_000)
    shown = re.search(r"Round (\d+)", page.evaluate(title)).group(1)
    assert shown != re.search(r"Round (\d+)", last).group(1)
    page.screenshot(path=str(tmp_path / "debugger.png"), full_page=True)
    assert (tmp_path / "debugger.png").stat().st_size > 10_000


SEEDS = (
    "seed must be an integer from 0 to 2**64 - 1 (18446744073709551615); a seed outside that range would repeat "
    "another seed's samples"
)


@pytest.mark.parametrize(
    "controls,message",
    [
        ({"explorers": 2.7}, "explorers must be a whole number"),
        ({"explorers": float("nan")}, "explorers must be a whole number"),
        ({"max_new_tokens": float("inf")}, "max_new_tokens must be a whole number"),
        ({"sample": True, "top_p": float("nan")}, "top_p must be a finite number"),
        ({"sample": True, "top_k": 1.5}, "top_k must be a whole number"),
        ({"seed": "abc"}, "seed must be a whole number"),
        ({"seed": 2**64}, f"{SEEDS}; got 18446744073709551616"),  # not seed 0's samples again
        ({"seed": float(2**64)}, f"{SEEDS}; got 18446744073709551616"),  # as a number box sends it
        ({"seed": "-1"}, f"{SEEDS}; got -1"),
        ({"depths": "4,2,6"}, "strictly increasing"),
        ({"prune": "3"}, "lattice pruning must be one of auto, none, 1, 2, 4, 8"),
    ],
)
def test_ui_values_that_are_not_valid_options_are_clear_errors(controls, message):
    from app.ui.inputs import Inputs
    from dex_core import DexError

    with pytest.raises(DexError, match=re.escape(message)):
        Inputs(**controls).config()


def test_the_largest_seed_is_taken_exactly_and_the_seed_box_offers_only_seeds():
    import gradio as gr

    from app.ui.controls import sampling_controls
    from app.ui.inputs import Inputs

    top = 2**64 - 1
    sent = (top, str(top), f" {top} ", "+7", 7.0)  # text is read exactly, not through a float (2**64 there)
    assert [Inputs(seed=s).config().seed for s in sent] == [top, top, top, 7, 7]
    with gr.Blocks():
        seed = sampling_controls()[-1]
    assert (seed.minimum, seed.maximum, seed.precision) == (0, top, 0)


def test_ui_off_values_map_to_the_library_defaults():
    from app.ui.inputs import Inputs
    from dex_core import DexConfig

    greedy = Inputs(explorers=3.0, temperature=0.7, top_k=5, top_p=0.5).config()  # sampling ignored
    assert (greedy.explorers, greedy.temperature, greedy.top_k, greedy.top_p) == (3, 0.0, None, None)
    sampled = Inputs(sample=True, temperature=0.7, top_k=0, top_p=1.0, adapters=False).config()
    assert (sampled.temperature, sampled.top_k, sampled.top_p, sampled.adapters) == (0.7, None, None, "none")
    default = Inputs().config()
    assert default.max_new_tokens == DexConfig.max_new_tokens and default.adapters == "auto"
    prunes = [Inputs(prune=p).config().prune for p in ("auto", "none", "2")]
    assert prunes == ["auto", None, 2]


def test_app_settings_come_from_the_environment_and_are_validated():
    from app.host.settings import AppSettings
    from dex_core import DexError

    s = AppSettings.from_env({"DEX_MODEL": "m", "DEX_EXPLORERS": "3", "DEX_BACKEND": "distributed"})
    assert (s.model, s.explorers, s.backend) == ("m", 3, "distributed")
    with pytest.raises(DexError, match="DEX_EXPLORERS must be an integer"):
        AppSettings.from_env({"DEX_EXPLORERS": "many"})
    with pytest.raises(DexError, match="backend must be one of"):
        AppSettings.from_env({"DEX_BACKEND": "gpu"})
    assert not AppSettings().openai_api  # the API on the app's server: off unless asked for
    assert AppSettings.from_env({"DEX_OPENAI_API": "1"}).openai_api
    assert not AppSettings.from_env({"DEX_OPENAI_API": "0"}).openai_api
    with pytest.raises(DexError, match="DEX_OPENAI_API must be 1 or 0"):
        AppSettings.from_env({"DEX_OPENAI_API": "maybe"})
    with pytest.raises(DexError, match="only the sequential backend allows"):
        AppSettings.from_env({"DEX_OPENAI_API": "1", "DEX_BACKEND": "distributed"})
    from types import SimpleNamespace

    from app.host.server import launch_options
    from app.host.state import Runtime

    for on in (False, True):  # what a launch mounts ahead of Gradio's routes
        blocks = SimpleNamespace(runtime=Runtime(AppSettings(model="m", openai_api=on)), page_css="")
        routes = launch_options(blocks, {})["app_kwargs"].get("routes", [])
        assert [r.path for r in routes] == (["/openai"] if on else [])


def test_bundled_traces_are_read_by_name_from_assets_traces_only_and_an_empty_debugger_says_what_to_do():
    from app.ui import debugger as dbg
    from dex_core import DexError

    opened = dbg.bundled(None)
    events = opened.events
    assert "example" in dbg.bundled_names() and isinstance(events[0], StartEvent)
    assert opened.origin == "bundled trace 'example'" and opened.origin in opened.note
    for name in ("../../README", "/etc/passwd", "example.json"):
        fallback = dbg.bundled(name)
        assert fallback.events is events and fallback.note.startswith("no bundled trace is named")
    hint = dbg.frame([], 0)[1]
    assert "No trace yet" in hint and "Generate" in hint and "load a trace" in hint
    err = DexError("cannot read the trace file /tmp/gradio/abc123/mine.json in /tmp/gradio/abc123")
    assert (
        dbg.clean_message(err, "/tmp/gradio/abc123/mine.json") == "cannot read the trace file mine.json in …"
    )


def test_the_tab_bar_holds_only_tabs_so_gradio_draws_each_label_once():
    from app.main import demo

    components = {c["id"]: c["type"] for c in demo.config["components"]}

    def tab_bars(node):
        if components.get(node["id"]) == "tabs":
            yield [components[child["id"]] for child in node.get("children", [])]
        for child in node.get("children", []):
            yield from tab_bars(child)

    bars = list(tab_bars(demo.config["layout"]))
    assert bars == [["tabitem"] * 4]  # a State between two tabs made Gradio draw "Analysis" twice


def test_a_tick_after_pause_changes_nothing_and_no_tick_restarts_the_timer():
    import gradio as gr

    from app.ui import debugger as dbg

    events = dbg.bundled(None).events
    paused = dbg.play_tick(events, 5, False)
    assert paused[:5] == (gr.skip(),) * 5 and paused[5].active is False
    playing = dbg.play_tick(events, 5, True)
    assert playing[4].value == 6 and playing[5] == gr.skip()  # the next round; the timer left as it is
    last = dbg.last_round(events)
    assert dbg.play_tick(events, last - 1, True)[5].active is False  # the last round stops it
    assert dbg.pause()[0] is False and dbg.play(events, 5)[0] is True
    again = dbg.play(events, last)  # Play at the last round, where every trace opens: from the first
    first = dbg.views(events)[0].round
    assert (
        again[0] is True
        and again[1].active is True
        and again[6].value == first
        and f"Round {first} " in (again[2].layout.title.text)
    )
    idle = dbg.play([], 0)  # nothing to play: it says so (a notice) and the timer stays off
    assert idle[0] is False and idle[1].active is False


def test_compare_puts_the_pinned_run_next_to_the_shown_one_and_a_refused_file_keeps_run_a(llama, tmp_path):
    from app.host.settings import AppSettings
    from app.host.state import Runtime
    from app.ui import debugger as dbg
    from app.ui import debugger_compare as cmp
    from dex_core.trace.files import save_trace

    example = dbg.bundled(None)
    assert "Nothing pinned" in cmp.update(None, example.events, example.meta, example.origin)[0]
    run_a, status, _ = cmp.pin(example.events, example.meta, example.origin)
    waiting, hidden = cmp.update(run_a, example.events, example.meta, example.origin)  # right after Pin
    assert (
        "Pin a run, then show another" in waiting and "identical" not in waiting and hidden.visible is False
    )
    result = DexDecoder(llama, explorers=2, tokenizer=tiny_tokenizer()).generate([1, 2, 3, 4], 6)
    events, tiny = result.trace, result.stats
    table, plot = cmp.update(run_a, events, {"model": "<b>tiny</b>"}, "this session's live run")
    end = example.events[-1].stats
    assert "run A pinned: bundled trace &#x27;example&#x27; · K=4 (9, 18, 27, 30)" in status
    assert "data-state='finished'" in status
    assert f"{end.rounds_per_token:.3f}" in table and f"{end.depth_speedup:.3f}" in table
    assert (
        f"{tiny.rounds_per_token:.3f}" in table
        and "&lt;b&gt;tiny&lt;/b&gt;" in table
        and "<b>tiny" not in table
    )
    assert "outputs differ" in table and "the prompts differ" in table
    bars = json.loads(plot.value["plot"])["data"]
    assert len(bars) == 2 and bars[0]["marker"]["color"] != bars[1]["marker"]["color"]
    depths = sorted(set(end.depths) | set(tiny.depths))
    assert bars[0]["x"] == bars[1]["x"] == [str(d) for d in depths]  # one group per depth of either run
    assert sum(int(b or 0) for b in bars[1]["text"]) == tiny.tokens
    assert [y is None for y in bars[1]["y"]] == [d not in tiny.depths for d in depths]
    d, w = [0] + end.depths, example.events[0].cost  # the weights of the example's heads and adapters
    stage = [
        d[k + 1] - d[k] + (w["head"] if k == len(d) - 2 else w["proposal"] + w["adapter"])
        for k in range(len(d) - 1)
    ]
    slowest = [
        max(stage[k] for k, n in enumerate(b) if n) for b in end.batch_sizes
    ]  # memory-bound: per round
    assert f"{sum(slowest) / end.tokens:.1f} on K devices" in table and "all the work" in table
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "dex-trace"')
    runtime = Runtime(AppSettings())  # its sessions' memory budget admits run A like any loaded trace
    kept, refused, _, box = cmp.load_pinned(runtime, str(bad))
    assert kept == {"__type__": "update"} and "not loaded" in refused and str(tmp_path) not in refused
    assert box is None  # the upload box emptied, ready for another file
    stopped = events[:2]  # a run stopped after its first round, before any commit: no end event
    assert not stopped[1].commits
    run_s, status_s, _ = cmp.pin(stopped, {}, "this session's live run")
    assert "data-state='stopped'" in status_s and "0 tokens, stopped" in status_s
    table = cmp.update(run_a, stopped, {}, "this session's live run")[0]
    assert "no outputs to compare: run B committed no tokens" in table and "prefix" not in table
    assert "differ from token 0" not in table
    save_trace(tmp_path / "k2.json", events, {"model": "tiny"})
    loaded, note, _, box = cmp.load_pinned(runtime, str(tmp_path / "k2.json"))
    assert loaded["origin"] == "loaded 'k2.json'"
    assert "Pin a run, then show another" in cmp.update(loaded, events, {}, "")[0]  # the same run, shown
    other = [replace(events[0], decs=not events[0].decs), *events[1:]]  # another run, the same tokens
    assert "identical outputs" in cmp.update(loaded, other, {}, "")[0]


def test_first_use_reports_each_loading_stage_and_slow_settings_get_an_estimate(tiny_dir, monkeypatch):
    import time

    from app.host import state as rt
    from app.ui import handlers
    from dex_core import DexError, load_model

    def staged(
        spec, dtype=None, device="auto", log=None
    ):  # a model whose loading takes a while, in two stages
        log("fetching the weights")
        time.sleep(1.2)
        log("converting them")
        time.sleep(1.2)
        return load_model(spec, dtype=dtype, device=device)

    monkeypatch.setattr(rt, "load_model", staged)
    runtime = rt.Runtime(rt.AppSettings(model=str(tiny_dir)))
    lines = list(handlers.loading(runtime))
    assert (
        runtime.loaded and any("fetching the weights" in x for x in lines) and "converting them" in lines[-1]
    )
    assert all(line.startswith("first use: ") and line.endswith(" s)") for line in lines)
    assert list(handlers.loading(runtime)) == []  # loaded: nothing to report
    broken = rt.Runtime(rt.AppSettings(model=str(tiny_dir / "missing")))
    with pytest.raises(DexError, match="no such model"):
        list(handlers.loading(broken))
    model, _ = runtime.model()
    decoder = DexDecoder(model, explorers=4)
    assert runtime.slow_notice(decoder, 256) is None  # a tiny model is quick at any setting the app offers
    monkeypatch.setattr(rt, "SLOW_SECONDS", 0)
    assert "K=4 × 256 tokens: about" in runtime.slow_notice(decoder, 256)


def test_the_openai_api_on_the_apps_server_answers_ars_text_behind_the_gate(app_server, tiny_dir):
    import httpx
    from openai import OpenAI
    from transformers import AutoModelForCausalLM

    base = f"{app_server.url}openai"
    client = OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=60)
    chunks = list(
        client.completions.create(
            model=str(tiny_dir),
            prompt=PROMPT,
            max_tokens=12,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    model, tokenizer = AutoModelForCausalLM.from_pretrained(tiny_dir), tiny_tokenizer()
    ar = ar_generate(model, tokenizer(PROMPT)["input_ids"], 12).tokens
    assert "".join(c.choices[0].text for c in chunks[:-1]) == tokenizer.decode(ar, skip_special_tokens=True)
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(ar)
    assert chunks[-1].usage.model_extra["dex"]["explorers"] == 3  # the launch's K
    assert [m.id for m in client.models.list()] == [str(tiny_dir)]
    metrics = httpx.get(f"{base}/metrics", timeout=10).text
    assert 'dex:request_success_total{finished_reason="length"} 1.0' in metrics
    too_long = httpx.post(
        f"{base}/v1/completions", json={"model": str(tiny_dir), "prompt": "x", "max_tokens": 513}
    )
    assert too_long.status_code == 400 and "between 0 and 512" in too_long.json()["error"]["message"]
    assert httpx.get(app_server.url, timeout=10).status_code == 200  # Gradio's own routes are still there
