"""A fair queue and the API's contract: Stop on the Race, the host's bound on a request's model time,
slow-settings warnings on every tab, the profile outside DEX's clock, every endpoint's own input checks
(no traceback in the server log), the app guide's endpoint table against the API, first-use progress."""

import re
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from helpers import needs_chromium

from dex_core.testing import tiny_model, tiny_tokenizer

ROOT = Path(__file__).resolve().parents[2]
PROMPT = "hello world the prime number"
STATE = "(box => document.querySelector(box + ' [data-state]')?.dataset.state)"
EXCHANGE = {
    "exchange": {1: 1e-4, 2: 1e-4, 4: 2e-4, 8: 3e-4, 16: 5e-4}
}  # a profile's exchange table (seconds)


@pytest.fixture
def profiles(monkeypatch):
    """``measure_profile`` as a 2 s measurement that records each call (a real one spawns two processes)."""
    from app.host import state as rt

    calls = []

    def measure(model, rows, log=None):
        calls.append(rows)
        time.sleep(2.0)
        return EXCHANGE

    monkeypatch.setattr(rt, "measure_profile", measure)
    return calls


def runtime_for(tiny_dir, **settings):
    from app.host.settings import AppSettings
    from app.host.state import Runtime

    return Runtime(AppSettings(model=str(tiny_dir), explorers=3, **settings))


def slow_explorers(monkeypatch, seconds=0.02):
    """Every explorer's stage forward takes ``seconds`` longer, so a run lasts long enough to be cut (alone, or in
    rounds Live runs share: ``expand_seats``)."""
    from dex_core.model.explorer import Explorer

    for name in ("expand", "expand_seats"):
        step = getattr(Explorer, name)
        monkeypatch.setattr(
            Explorer, name, lambda self, *a, step=step, **k: (time.sleep(seconds), step(self, *a, **k))[1]
        )


def dex_seconds(frame) -> float:
    """The last point of the figure's DEX (measured) line: DEX's clock at its last token."""
    line = next(t for t in frame[2].data if t.name.startswith("DEX sequential"))
    return max(line.x)


def test_the_first_races_clocks_exclude_profiling_and_the_profile_is_measured_once(tiny_dir, profiles):
    from app.ui import race
    from app.ui.handlers import StopRequests
    from app.ui.inputs import Inputs

    runtime, stops = runtime_for(tiny_dir), StopRequests()
    runtime.model()
    frames = list(
        race.race_frames(
            runtime, stops, Inputs(prompt=PROMPT, chat=False, explorers=3, adapters=False, max_new_tokens=12)
        )
    )
    timing = [f[3] for f in frames if "first race: timing" in str(f[3])]
    assert profiles == [runtime.decoder(Inputs(explorers=3).config()).proposal_vocab] and timing
    assert "identical output" in frames[-1][3]
    assert (
        dex_seconds(frames[-1]) < 1.0 and max(frames[-1][2].data[0].x) < 1.0
    )  # the 2 s of profiling are in neither clock
    again = list(
        race.race_frames(
            runtime, stops, Inputs(prompt=PROMPT, chat=False, explorers=3, adapters=False, max_new_tokens=12)
        )
    )
    assert len(profiles) == 1 and not any("first race" in str(f[3]) for f in again)


def test_stop_ends_the_race_after_the_step_in_progress_and_both_panes_keep_their_tokens(tiny_dir, profiles):
    from app.ui import race
    from app.ui.handlers import StopRequests
    from app.ui.inputs import Inputs
    from dex_core import ar_generate, encode_prompt

    runtime, stops, request = runtime_for(tiny_dir), StopRequests(), SimpleNamespace(session_hash="visitor")
    race.stop(stops, request)  # a Stop pressed before the race does not stop it
    frames = race.race_frames(
        runtime,
        stops,
        Inputs(prompt=PROMPT, chat=False, explorers=3, adapters=False, max_new_tokens=40),
        request=request,
    )
    shown = []
    for frame in frames:
        shown.append(frame)
        if isinstance(frame[1], str) and frame[1]:  # DEX has a token: press Stop
            race.stop(stops, request)
    ar_text, dex_text, _, summary = shown[-1]
    assert (
        "stopped by you" in summary and "data-state='stopped'" in summary and "the panes keep them" in summary
    )
    model, tok = runtime.model()
    full = tok.decode(
        ar_generate(model, encode_prompt(tok, PROMPT, False), 40).tokens, skip_special_tokens=True
    )
    assert dex_text and full.startswith(dex_text) and full.startswith(ar_text) and len(dex_text) < len(full)
    assert (
        sum(1 for f in shown if isinstance(f[1], str) and f[1]) == 2
    )  # one step after the Stop, then the end


def test_a_request_past_the_hosts_bound_ends_with_a_clear_message_and_keeps_what_it_made(
    tiny_dir, profiles, monkeypatch
):
    from app.host.settings import AppSettings
    from app.ui import analysis as analysis_tab
    from app.ui import live, race
    from app.ui.handlers import StopRequests
    from app.ui.inputs import Inputs
    from dex_core import DexError
    from dex_core.trace.events import RoundEvent

    assert AppSettings.from_env({"DEX_REQUEST_SECONDS": "30"}).request_seconds == 30
    with pytest.raises(DexError, match="request_seconds must be an integer >= 0"):
        AppSettings(request_seconds=-1)
    runtime = runtime_for(tiny_dir, request_seconds=1)
    slow_explorers(monkeypatch)
    tic = time.monotonic()
    *_, last = live.live_frames(
        runtime, StopRequests(), Inputs(PROMPT, False, 3, "", False, True, False, 1.0, 0, 1.0, 0, 200)
    )
    status, events = last[-1], last[4]
    assert time.monotonic() - tic < 8  # the profile is not in the Live tab; a full run would take about 25 s
    assert (
        "data-state='stopped'" in status
        and "at this host&#x27;s limit of 1 s of model time per request" in status
    )
    made = sum(len(e.commits) for e in events if isinstance(e, RoundEvent))
    assert 0 < made < 200 and f"({made} tokens)" in status
    *_, raced = race.race_frames(
        runtime,
        StopRequests(),
        Inputs(prompt=PROMPT, chat=False, explorers=3, adapters=False, max_new_tokens=200),
    )
    assert (
        "stopped at this host&#x27;s limit of 1 s" in raced[3]
        and raced[1]
        and "the panes keep them" in raced[3]
    )

    stream = analysis_tab.ar_stream
    monkeypatch.setattr(
        analysis_tab, "ar_stream", lambda *a, **k: ((time.sleep(0.05), e)[1] for e in stream(*a, **k))
    )
    *_, table, _ = analysis_tab.analyse(runtime, PROMPT, False, False, 200)
    made = int(re.search(r"after (\d+) of 200 tokens", table).group(1))
    assert "stopped at this host" in table and 0 < made < 200 and f"{made} tokens; oracle" in table


def test_every_tab_that_runs_the_model_warns_before_slow_settings(tiny_dir, profiles, monkeypatch):
    from app.host import state as rt
    from app.ui import analysis as analysis_tab
    from app.ui import live, race
    from app.ui.handlers import StopRequests
    from app.ui.inputs import Inputs
    from dex_core.analysis.forecast import RoundCost

    runtime = runtime_for(tiny_dir, request_seconds=10)
    # this machine, as its one-row profile says: 6 layers and the head at one row take 1 s, an AR token; and as a
    # timed round says: 1 s a round, the page's share nothing
    monkeypatch.setattr(runtime, "one_row", lambda rows: {"layer": 1 / 8, "head": 2 / 8, "proposal": 0.0})
    monkeypatch.setattr(runtime, "round_cost", lambda decoder: RoundCost(1.0, 0.0, []))
    monkeypatch.setattr(runtime, "round_timed", lambda decoder: True)
    monkeypatch.setattr(live, "page_seconds", lambda cost: 0.0)
    monkeypatch.setattr(rt, "SLOW_SECONDS", 5)
    # Live: a round is 1 s, K + 3 tokens x (K + 1)/2 rounds = 9 s (between 6 and 12), past the host's 10 s only
    # at worst; Race: 9 + 4 s of AR = 13 s, past 10 s; Analysis: 1.5 x 4 = 6 s
    with pytest.warns(
        UserWarning, match=r"a race of K=3 × 4 tokens and AR beside them: about 13 s.*after 10 s"
    ):
        list(
            race.race_frames(
                runtime,
                StopRequests(),
                Inputs(prompt=PROMPT, chat=False, explorers=3, adapters=False, max_new_tokens=4),
            )
        )
    # then Live (its finished run is what the next estimate at K=3 learns from)
    with pytest.warns(
        UserWarning,
        match=r"K=3 × 4 tokens: about 9 s \(between 6 and 12 s; from a round timed on this machine",
    ):
        list(
            live.live_frames(
                runtime, StopRequests(), Inputs(PROMPT, False, 3, "", False, True, False, 1.0, 0, 1.0, 0, 4)
            )
        )
    with pytest.warns(UserWarning, match=r"analysing 4 tokens: about 6 s here; fewer tokens is faster\.$"):
        analysis_tab.analyse(runtime, PROMPT, False, False, 4)
    assert runtime.slow_notice(None, 3) is None  # 4.5 s: no warning


@pytest.fixture
def served(app_server, profiles, monkeypatch):
    """The session's app, its seconds profiles measured as ``profiles`` does for this test only: the fake profile
    goes with the test, and the next test's race measures its own."""
    monkeypatch.setattr(app_server.demo.runtime, "_profiles", {})
    return app_server


def test_a_stop_from_one_session_never_stops_another_sessions_race(served, profiles, monkeypatch):
    from gradio_client import Client

    from app.ui import race

    slow_explorers(monkeypatch)  # a 40-token race lasts about 6 s
    stop = "/" + next(
        f.api_name
        for f in served.demo.fns.values()
        if getattr(f.fn, "__wrapped__", getattr(f.fn, "func", None)) is race.stop
    )  # bound to its StopRequests
    mine, other = Client(served.url, verbose=False), Client(served.url, verbose=False)
    for stopper, stopped in ((other, False), (mine, True)):
        job = mine.submit(PROMPT, False, 3, False, 40, api_name="/race")
        while "tokens/s" not in str(job.outputs()[-1:]):
            time.sleep(0.05)
        stopper.predict(api_name=stop)
        summary = job.result()[3]
        assert ("stopped by you" in summary) == stopped and ("identical output" in summary) != stopped


GENERATE = [
    "hello",
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
    8,
    "auto",
]  # as the Live tab sends them
BAD_GENERATE = [  # (index, value, message in the status line)
    (0, {"role": "user"}, "the prompt must be text (a str); got dict"),
    (2, 99, "explorers must be between 1 and 8 in this app"),
    (11, "x", "max_new_tokens must be a whole number; got &#x27;x&#x27;"),
    (11, 10**6, "max_new_tokens must be between 1 and 512"),
    (12, "7", "lattice pruning must be one of auto, none, 1, 2, 4, 8"),
    (1, "yes", "chat must be True or False"),
    (3, {"a": 1}, "depths must be comma-separated integers"),
]
BAD_OTHERS = [  # (endpoint, inputs, the error's message)
    ("/race", [PROMPT, False, 99, False, 8], "explorers must be between 1 and 8 in this app"),
    ("/race", [["hello"], False, 3, False, 8], "the prompt must be text (a str); got list"),
    ("/race", [PROMPT, False, 3, "on", 8], "adapters must be True or False"),
    ("/race", [PROMPT, False, 3, False, -1], "max_new_tokens must be between 1 and 512"),
    (
        "/analyse",
        [PROMPT, False, False, 8, "colour"],
        "metric must be one of probability, rank; got 'colour'",
    ),
    ("/analyse", [PROMPT, False, False, 2.5, "rank"], "max_new_tokens must be a whole number"),
    ("/analyse", [{"text": PROMPT}, False, False, 8, "rank"], "the prompt must be text (a str); got dict"),
]


def test_every_endpoint_reports_bad_input_as_documented_without_a_traceback_in_the_server_log(served, capfd):
    from gradio_client import Client
    from gradio_client.exceptions import AppError

    client = Client(served.url, verbose=False)
    capfd.readouterr()
    for index, value, message in BAD_GENERATE:
        inputs = GENERATE[:index] + [value] + GENERATE[index + 1 :]
        status = list(client.submit(*inputs, api_name="/generate"))[-1][-1]
        assert "data-state='error'" in status and message in status and "nothing ran" in status, (
            index,
            value,
        )
    for endpoint, inputs, message in BAD_OTHERS:
        with pytest.raises(AppError, match=re.escape(message)):
            client.predict(*inputs, api_name=endpoint)
    log = capfd.readouterr()
    assert "Traceback" not in log.err + log.out and "Could not preprocess" not in log.err + log.out
    assert "finished" in list(client.submit(*GENERATE, api_name="/generate"))[-1][-1]  # good input still runs


def guide_endpoints() -> dict:
    """The app guide's endpoint table (docs/APP.md): {endpoint: (input names, output descriptions)}; notes in
    parentheses dropped."""
    readme = (ROOT / "docs" / "APP.md").read_text()
    rows = re.findall(r"^\| `(/\w+)`[^|]*\| ([^|]+) \| ([^|]+) \|$", readme, flags=re.M)

    def items(cell):
        return [x.strip() for x in re.sub(r"\([^)]*\)", "", cell).split(",")]

    return {name: (items(inputs), items(outputs)) for name, inputs, outputs in rows}


def test_without_a_chat_template_the_live_status_says_the_prompt_goes_in_as_written(tiny_dir):
    from app.ui import live
    from app.ui.handlers import StopRequests
    from app.ui.inputs import Inputs

    runtime = runtime_for(tiny_dir)  # the tiny tokenizer has no chat template, as Gemma 3 270M's GGUF

    def statuses(chat):
        args = (PROMPT, chat, 3, "", False, True, False, 1.0, 0, 1.0, 0, 4)
        return [frame[-1] for frame in live.live_frames(runtime, StopRequests(), Inputs(*args))]

    said = "no chat template: the prompt goes in as written"
    chat = statuses(True)
    assert said in chat[-1] and "finished" in chat[-1] and any(said in s and "about" in s for s in chat[:-1])
    assert not any(said in s for s in statuses(False))  # asked for no template, nothing to say


def test_the_page_says_whose_answer_it_is():
    from app.main import demo

    header = next(c for c in demo.config["components"] if c["type"] == "markdown")["props"]["value"]
    assert "The answers are the model's own" in header and "a weak answer is the model's, not DEX's" in header


def test_the_app_guides_endpoint_table_matches_the_apis_own_description():
    from app.main import demo

    api = demo.get_api_info()["named_endpoints"]
    table = guide_endpoints()
    assert sorted(table) == sorted(api) == ["/analyse", "/generate", "/race"]
    for name, (inputs, outputs) in table.items():
        assert inputs == [p["parameter_name"] for p in api[name]["parameters"]], name
        plots = ["plotly" in str(r["python_type"]) for r in api[name]["returns"]]
        assert ["plot" in out for out in outputs] == plots, (
            name
        )  # one described output per returned one, in order


def test_visualize_commands_run_without_a_runpy_warning(tmp_path):
    for command in ("visualize.report", "visualize.graph"):
        proc = subprocess.run(
            [
                sys.executable,
                "-W",
                "error::RuntimeWarning",
                "-m",
                command,
                str(tmp_path / "no.json"),
                str(tmp_path / "out.html"),
            ],
            capture_output=True,
            text=True,
            cwd=ROOT,
        )
        assert proc.returncode == 2 and "Warning" not in proc.stderr and "no.json" in proc.stderr, proc.stderr


def test_the_default_models_conversion_reports_each_step_as_it_happens(tmp_path, monkeypatch):
    import transformers

    from dex_core.model import gguf as dm
    from dex_core.model.named import NAMED

    monkeypatch.setenv("DEX_CACHE", str(tmp_path / "cache"))
    lines, order = [], []
    monkeypatch.setattr(dm, "fetch_gguf", lambda named, workdir, log: workdir / named.gguf)

    def loaded(what, value):
        def load(*args, **kwargs):
            order.append((what, lines[-1]))  # the step announced before this part of the work began
            return value

        return staticmethod(load)

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", loaded("tokenizer", tiny_tokenizer()))
    monkeypatch.setattr(
        transformers.AutoModelForCausalLM, "from_pretrained", loaded("weights", tiny_model("llama").float())
    )
    target = dm.prepare_named(NAMED["default"], lines.append)
    steps = [int(m.group(1)) for line in lines if (m := re.search(r"step (\d) of 4: ", line))]
    assert steps == [1, 2, 3, 4] and dm._complete(target)
    assert [w for w, _ in order] == ["tokenizer", "weights"]
    assert (
        "step 1 of 4: reading the tokenizer" in order[0][1]
        and "step 2 of 4: reading and de-quantizing" in order[1][1]
    )
    size = sum(p.numel() * 4 for p in tiny_model("llama").parameters()) / 2**20  # float32, tied weights once
    assert f"about {size:.0f} MB" in lines[-1] and str(tmp_path / "cache") in lines[-1]


@needs_chromium
def test_in_the_browser_the_prompt_is_the_examples_run_buttons_wait_sampling_follows_sample_race_stops(
    served, page, monkeypatch
):
    from app.ui.debugger import bundled

    slow_explorers(monkeypatch)  # a 64-token run lasts about 10 s
    sampling = [
        "#live-temperature input[type=number]",
        "#live-top-k input",
        "#live-top-p input[type=number]",
        "#live-seed input",
    ]
    page.goto(served.url, timeout=60_000)
    shown = bundled(None).meta["prompt"]  # the prompt box holds the prompt of the example the panels show
    page.wait_for_function(
        f"() => document.querySelector('#live-prompt textarea')?.value === {shown!r}", timeout=60_000
    )
    page.locator("text=Exploration and sampling").click()
    assert [page.locator(s).is_disabled() for s in sampling] == [True] * 4  # greedy
    page.locator("#live-sample input").check()
    page.wait_for_function(f"() => !document.querySelector({sampling[0]!r}).disabled", timeout=10_000)
    assert [page.locator(s).is_disabled() for s in sampling] == [False] * 4
    page.locator("#live-sample input").uncheck()
    page.wait_for_function(f"() => document.querySelector({sampling[0]!r}).disabled", timeout=10_000)
    page.locator("#live-new input[type=number]").fill("64")
    page.locator("#live-new input[type=number]").press("Enter")
    page.locator("#live-prompt textarea").fill(PROMPT)
    page.locator("#live-generate").click()
    page.wait_for_function(f"() => {STATE}('#live-status') === 'running'", timeout=60_000)
    assert page.locator("#live-generate").is_disabled()
    page.wait_for_function(f"() => {STATE}('#live-status') === 'finished'", timeout=120_000)
    page.wait_for_function("() => !document.querySelector('#live-generate').disabled", timeout=10_000)

    page.get_by_role("tab", name="Race").click()
    page.locator("#race-new input[type=number]").fill("200")  # about 25 s: long enough to be stopped
    page.locator("#race-new input[type=number]").press("Enter")
    page.locator("#race-go").click()
    page.wait_for_function(
        "() => document.querySelector('#race-summary')?.innerText.includes('tokens/s')", timeout=120_000
    )
    assert page.locator("#race-go").is_disabled()
    page.evaluate("() => document.querySelector('#race-stop').click()")  # the race redraws every step
    page.wait_for_function(f"() => {STATE}('#race-summary') === 'stopped'", timeout=30_000)
    assert "stopped by you" in page.inner_text("#race-summary")
    page.wait_for_function("() => !document.querySelector('#race-go').disabled", timeout=10_000)
