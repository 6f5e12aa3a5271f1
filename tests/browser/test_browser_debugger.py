"""The debugger in a real browser (Chromium): the bundled example on first load without a model, a K=8
run within 1,600 px at 1,400 px width whose Debugger figures, drawn while hidden, fill their boxes, Stop,
an error that keeps the previous run, the timeline's clicks and its current-round band, the timeline
readable at K=2 and K=8 with its fate legend in view, the exported HTML opened from disk, Pause within
one tick, two runs compared (a pinned one and a loaded one) under a tab bar that names each tab once,
the empty tabs' hints, the Analysis colour switch redrawn in the page without a model call, and a run
with draft chains: its chain frames on the timeline and a round of several commits opened from it."""

import json

import pytest
from helpers import launch_app, needs_chromium

from dex_core.testing import tiny_model, tiny_tokenizer
from dex_core.trace.events import Event, RoundEvent
from dex_core.trace.files import load_trace, save_trace

pytestmark = needs_chromium
PROMPT = "hello world the prime number"
STATUS = "() => document.querySelector('#live-status [data-state]')?.dataset.state"
TITLE = "() => document.querySelector('#dbg-lattice .js-plotly-plot')?.layout?.title?.text || ''"
HEIGHT = "() => document.documentElement.scrollHeight"
TALL = """() => [...document.querySelectorAll('[id^=live-], [id^=dbg-]')].filter(e => e.offsetHeight > 0)
  .map(e => `${e.id}:${e.offsetHeight}`).join(' ')"""  # what a page over its height budget is made of
WIDTHS = """id => { const gd = document.querySelector(`#${id} .js-plotly-plot`);
  return [gd._fullLayout.width, gd.parentElement.clientWidth]; }"""  # a figure's width and its box's
ROUND = "() => Number(document.querySelector('#dbg-round input[type=number]').value)"
# the timeline's current-round band, the round the control shows, and the x range of that round's nodes
BAND = """() => { const gd = document.querySelector('#dbg-timeline .js-plotly-plot');
  const s = (gd.layout.shapes || []).find(s => s.name === 'current round'); if (!s) return null;
  const round = Number(document.querySelector('#dbg-round input[type=number]').value);
  const xs = gd.data.filter(t => t.mode === 'markers' && t.name !== 'collapses')
    .flatMap(t => t.x.filter((x, i) => t.customdata[i] === round));
  return {round, x0: s.x0, x1: s.x1, lo: Math.min(...xs), hi: Math.max(...xs)}; }"""


@pytest.fixture(scope="module")
def app_url(tmp_path_factory):
    """The app on a tiny 8-layer model (K up to 8), and the bundled example. A server of this module's own, not
    the session's ``app_server`` with ``tuned`` settings: its model is named in the page at launch and held once
    loaded (a setting changed later loads no other), K = 8 needs 8 layers (``tiny_dir`` has 6), and the first
    test proves that the bundled example shows before any model is loaded."""
    from app.host.settings import AppSettings

    path = tmp_path_factory.mktemp("tiny8")
    tiny_model("llama", layers=8).save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    demo, url = launch_app(AppSettings(model=str(path), explorers=8))
    yield url, demo
    demo.close()


def plot_ready(page, elem: str, timeout=180_000):  # generous: a loaded 2-core CI machine draws slowly
    page.wait_for_function(
        f"() => document.querySelector('#{elem} .js-plotly-plot')?.data?.length", timeout=timeout
    )


def example_events() -> list[Event]:
    from app.ui.debugger import TRACES

    return load_trace(TRACES / "example.json")[0]


def example_nodes() -> int:
    return sum(len(e.nodes) for e in example_events() if isinstance(e, RoundEvent))


def test_the_bundled_example_is_shown_on_first_load_without_a_model(app_url, page):
    url, demo = app_url
    page.goto(url, timeout=60_000)
    plot_ready(page, "live-lattice")
    assert page.evaluate(STATUS) == "example" and "bundled trace 'example'" in page.inner_text("#live-status")
    assert page.locator("#live-text .dex-tok").count() == len(example_events()[-1].tokens)
    page.get_by_role("tab", name="Debugger").click()
    plot_ready(page, "dbg-timeline")
    assert "Round" in page.evaluate(TITLE) and "E0" in page.inner_text("#dbg-table")
    assert not demo.runtime.loaded  # nothing loaded a model
    page.goto(url + "?trace=example", timeout=60_000)  # a URL parameter opens the Debugger on that trace
    plot_ready(page, "dbg-timeline")
    assert "bundled trace 'example'" in page.inner_text("#dbg-status")
    page.goto(url + "?trace=../../etc/passwd", timeout=60_000)  # only names from assets/traces
    page.wait_for_function(
        "() => document.querySelector('#live-status')?.innerText.includes('no bundled trace')", timeout=60_000
    )
    assert "passwd" not in page.inner_text("#live-text") and not demo.runtime.loaded


def test_timeline_draws_every_node_and_a_click_opens_that_round(app_url, page):
    url, _ = app_url
    page.goto(url, timeout=60_000)
    page.get_by_role("tab", name="Debugger").click()
    plot_ready(page, "dbg-timeline")
    fates = ("matched", "final", "committed", "discarded", "cut", "pending")  # cut ones need gate 1
    drawn = page.evaluate(
        f"() => document.querySelector('#dbg-timeline .js-plotly-plot').data"
        f".filter(t => {json.dumps(list(fates))}.includes(t.name)).reduce((n, t) => n + t.x.length, 0)"
    )
    assert drawn == example_nodes()
    last = page.evaluate(TITLE)
    page.evaluate(
        "() => document.querySelector('#dbg-timeline .js-plotly-plot')"
        ".on('plotly_click', e => { window.__clicked = e.points[0].customdata; })"
    )
    points = page.locator("#dbg-timeline .scatterlayer .trace:nth-child(3) .points path")  # the matched nodes
    box = points.nth(3).bounding_box()
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    page.wait_for_timeout(300)
    page.mouse.click(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    page.wait_for_function("() => window.__clicked !== undefined", timeout=10_000)
    clicked = page.evaluate("() => window.__clicked")
    page.wait_for_function(f"() => ({TITLE})().startsWith('Round {clicked} ')", timeout=30_000)
    assert page.evaluate(TITLE) != last
    assert f"Round {clicked}</b>" in page.inner_html("#dbg-table")
    assert page.locator("#dbg-round input[type=number]").input_value() == str(clicked)
    # the band follows the round: a watcher moves it within ~300 ms of the round input changing
    page.wait_for_function(
        f"() => {{ const b = ({BAND})(); return b?.round === {clicked} && b.x0 < b.lo; }}", timeout=30_000
    )
    band = page.evaluate(BAND)
    assert band["x0"] < band["lo"] <= band["hi"] < band["x1"] < band["hi"] + 5 and band["lo"] - 5 < band["x0"]


def generate(page, tokens: int, depths: str = "", prune: str = "", draft: bool = True):
    """Sets the Live controls and presses Generate. The token count goes in last and is read back just before the
    click: a CI run once went at the default 128 (a taller page), the typed count gone by then."""
    page.locator("text=Exploration and sampling").click()
    if not draft:
        page.locator("#live-draft input").uncheck()
    if prune:
        page.locator("#live-prune input").fill(prune)
        page.get_by_role("option", name=prune, exact=True).click()
    if depths:
        page.get_by_label("Depths (optional, e.g. 8,15,23,30)").fill(depths)
    page.locator("#live-prompt textarea").fill(PROMPT)
    count = page.locator("#live-new input[type=number]")
    count.fill(str(tokens))
    count.press("Enter")
    page.wait_for_function(
        f"() => document.querySelector('#live-new input[type=number]').value === '{tokens}'", timeout=10_000
    )
    page.locator("#live-generate").click()


def test_a_k8_run_fits_1600_px_at_1400_px_width_and_its_debugger_figures_fill_their_boxes(app_url, page):
    url, _ = app_url
    page.goto(url, timeout=60_000)
    page.get_by_role(
        "tab", name="Debugger"
    ).click()  # the tab exists from here on and is redrawn while hidden
    plot_ready(page, "dbg-timeline")
    page.get_by_role("tab", name="Live").click()
    plot_ready(page, "live-lattice")
    generate(page, 12, prune="none")  # the full lattice (up to 255 nodes a round), draft chains on
    page.wait_for_function(f"() => ({STATUS})() === 'finished'", timeout=300_000)
    status = page.inner_text("#live-status")
    assert "12 tokens" in status, status  # the run went at the count typed
    assert "K=8" in page.inner_text("#live-status") and "none" in page.inner_text("#live-stats")
    assert page.locator("#live-fsm details").count() == 8  # counts per explorer, ids on demand
    assert page.evaluate(HEIGHT) <= 1600, (page.evaluate(HEIGHT), page.evaluate(TALL))
    page.wait_for_function(
        "() => document.querySelector('#dbg-status')?.textContent.includes('live run')", timeout=120_000
    )  # drawn while the Debugger was hidden
    page.get_by_role("tab", name="Debugger").click()
    fitted = f"() => ['dbg-timeline', 'dbg-lattice'].map(id => ({WIDTHS})(id))"
    page.wait_for_function(
        f"() => ({fitted})().every(([fig, box]) => Math.abs(fig - box) <= 2)", timeout=10_000
    )
    assert all(box > 500 for _, box in page.evaluate(fitted)), page.evaluate(fitted)
    assert (
        page.evaluate(
            "() => document.querySelector('#dbg-lattice .js-plotly-plot').layout.yaxis.ticktext.length"
        )
        == 8
    )
    assert page.evaluate(HEIGHT) <= 1600, (page.evaluate(HEIGHT), page.evaluate(TALL))


def test_stop_shows_stopped_and_an_error_keeps_the_previous_run_labelled(app_url, page):
    url, _ = app_url
    page.goto(url, timeout=60_000)
    plot_ready(page, "live-lattice")
    generate(page, 200)
    page.wait_for_function(
        "() => /round [3-9]|round \\d\\d/.test(document.querySelector('#live-status')?.innerText)",
        timeout=120_000,
    )
    page.evaluate("() => document.querySelector('#live-stop').click()")  # the page redraws every round
    page.wait_for_function(f"() => ({STATUS})() === 'stopped'", timeout=30_000)
    page.wait_for_timeout(2000)
    assert page.evaluate(STATUS) == "stopped" and "stopped by you" in page.inner_text("#live-status")
    text, title = (
        page.inner_text("#live-text"),
        page.evaluate("() => document.querySelector('#live-lattice .js-plotly-plot').layout.title.text"),
    )

    page.get_by_label("Depths (optional, e.g. 8,15,23,30)").fill("2,4")  # does not end at the 8 layers
    page.locator("#live-generate").click()
    page.wait_for_function(f"() => ({STATUS})() === 'error'", timeout=60_000)
    page.wait_for_timeout(1500)
    status = page.inner_text("#live-status")
    assert "must end at the model's 8 layers" in status and "previous run" in status
    assert page.inner_text("#live-text") == text  # the panels are intact
    assert (
        page.evaluate("() => document.querySelector('#live-lattice .js-plotly-plot').layout.title.text")
        == title
    )
    assert page.evaluate("() => document.querySelector('#live-lattice .js-plotly-plot').data.length") > 0
    # the error is shown once, in the status line, not in a pop-up
    assert page.locator("[data-testid='toast-text']", has_text="must end at").count() == 0
    badges = page.evaluate(
        "() => [...document.querySelectorAll('#live-text, #live-lattice, #live-fsm, #live-stats')]"
        ".map(e => e.querySelector('.error')).filter(Boolean).length"
    )
    assert badges == 0


def test_the_exported_html_opens_from_disk_with_its_figures(app_url, page, tmp_path):
    url, _ = app_url
    page.goto(url, timeout=60_000)
    page.get_by_role("tab", name="Debugger").click()
    plot_ready(page, "dbg-timeline")
    with page.expect_download(timeout=60_000) as download:
        page.locator("#dbg-html").click()  # one click: the file is made, then downloaded
    assert download.value.suggested_filename == "dex-run.html"
    path = tmp_path / "run.html"
    download.value.save_as(path)
    offline = page.context.new_page()
    requests = []
    offline.on(
        "request", lambda r: requests.append(r.url) if not r.url.startswith(("file:", "data:")) else None
    )
    offline.goto(path.as_uri(), timeout=60_000)
    offline.wait_for_function(
        "() => [...document.querySelectorAll('.js-plotly-plot')].filter(g => g.data?.length"
        " && g.querySelector('.scatterlayer .point')).length === 2",
        timeout=60_000,
    )
    nodes = offline.evaluate(
        "() => document.querySelector('#dex-timeline').data.filter(t => t.mode === 'markers'"
        " && t.name !== 'collapses').reduce((n, t) => n + t.x.length, 0)"
    )
    assert nodes == example_nodes() and requests == []
    events = example_events()
    # the Numbers panel: each figure is the <b> under its label
    figure = """label => [...document.querySelectorAll('div')].find(d => d.childElementCount === 0
        && d.textContent === label)?.nextElementSibling?.innerText"""
    assert offline.evaluate(figure, "tokens") == str(len(events[-1].tokens))
    assert offline.evaluate(figure, "rounds") == str(sum(isinstance(e, RoundEvent) for e in events))
    assert offline.locator(".dex-tok").count() == len(events[-1].tokens)


def open_round(page, round_no: int):
    """Move the Debugger to ``round_no`` the way a timeline click does (the hidden box and button)."""
    page.evaluate(f"""() => {{ const box = document.querySelector('#dbg-goto textarea, #dbg-goto input');
        box.value = '{round_no}'; box.dispatchEvent(new Event('input', {{bubbles: true}}));
        setTimeout(() => document.querySelector('#dbg-goto-go').click(), 50); }}""")
    page.wait_for_function(f"() => ({ROUND})() === {round_no}", timeout=60_000)


def test_pause_stops_play_within_one_tick(app_url, page):
    from app.main import PLAY_PERIOD

    url, _ = app_url
    page.goto(url, timeout=60_000)
    page.get_by_role("tab", name="Debugger").click()
    plot_ready(page, "dbg-timeline")
    open_round(page, 1)
    page.locator("#dbg-play").click()
    page.wait_for_function(f"() => ({ROUND})() >= 4", timeout=60_000)  # playing
    page.locator("#dbg-pause").click()
    at_pause = page.evaluate(ROUND)
    page.wait_for_timeout(max(3 * PLAY_PERIOD * 1000, 3000))  # three timer periods (at least 3 s under load)
    after = page.evaluate(ROUND)
    assert at_pause <= after <= at_pause + 1, (at_pause, after)
    page.wait_for_timeout(2000)
    assert page.evaluate(ROUND) == after  # and it stays paused
    assert f"Round {after} " in page.evaluate(TITLE)  # the panels show the round the control says


def test_compare_shows_a_pinned_bundled_run_next_to_a_loaded_trace(app_url, page, tmp_path):
    from dex_core import DexDecoder

    result = DexDecoder(tiny_model("llama", layers=8), explorers=2, tokenizer=tiny_tokenizer()).generate(
        [1, 2, 3, 4], 10, node_text=True
    )
    save_trace(tmp_path / "k2.json", result.trace, {"model": "tiny k2"})
    (tmp_path / "bad.json").write_text('{"format": "dex-trace", "events": 7')
    url, _ = app_url
    page.goto(url, timeout=60_000)
    page.get_by_role("tab", name="Analysis").click()  # the tab Gradio used to draw twice
    page.get_by_role("tab", name="Debugger").click()
    plot_ready(page, "dbg-timeline")
    assert page.locator("[role=tablist] [role=tab]").all_inner_texts() == [
        "Live",
        "Race",
        "Debugger",
        "Analysis",
    ]
    page.locator("#dbg-compare").get_by_text("Compare two runs").click()
    page.wait_for_function(
        "() => document.querySelector('#dbg-compare-empty')?.innerText.includes('Nothing pinned')",
        timeout=30_000,
    )
    page.locator("#dbg-pin").click()
    table = "() => document.querySelector('#dbg-compare-table')?.innerText || ''"
    page.wait_for_function(f"() => ({table})().includes('Pin a run, then show another')", timeout=60_000)
    assert "identical outputs" not in page.inner_text("#dbg-compare-table")  # not the run with itself
    assert "K=4 (9, 18, 27, 30)" in page.inner_text("#dbg-compare-status")  # labelled by its settings
    page.locator("#dbg-load input[type=file]").set_input_files(str(tmp_path / "k2.json"))  # becomes run B
    page.wait_for_function(f"() => ({table})().includes('k2.json')", timeout=120_000)
    text = page.inner_text("#dbg-compare-table")
    assert (
        "bundled trace 'example' · K=4" in text and "loaded 'k2.json' · K=2" in text
    )  # heads: source, settings
    end = example_events()[-1].stats
    numbers = [
        f"{x:.3f}"
        for x in (
            end.rounds_per_token,
            end.depth_speedup,
            result.stats.rounds_per_token,
            result.stats.depth_speedup,
        )
    ]
    for value in numbers + ["bundled trace 'example'", "tiny k2", "outputs differ"]:
        assert value in text, value
    plot_ready(page, "dbg-compare-plot")
    bars = page.evaluate(
        "() => document.querySelector('#dbg-compare-plot .js-plotly-plot').data"
        ".map(t => [t.type, t.marker.color, t.text.filter(Boolean).map(Number)])"
    )
    assert [b[0] for b in bars] == ["bar", "bar"] and bars[0][1] != bars[1][1]
    assert sum(bars[0][2]) == end.tokens and sum(bars[1][2]) == result.stats.tokens
    page.locator("#dbg-compare-load input[type=file]").set_input_files(str(tmp_path / "bad.json"))
    refused = "() => document.querySelector('#dbg-compare-status [data-state]')?.dataset.state === 'error'"
    page.wait_for_function(refused, timeout=60_000)
    assert (
        "run A is unchanged" in page.inner_text("#dbg-compare-status") and str(tmp_path) not in page.content()
    )
    assert "bundled trace 'example'" in page.inner_text("#dbg-compare-table")
    assert "bad.json" not in page.inner_text("#dbg-compare-load")  # the box is empty, ready for another file
    assert page.locator("#dbg-compare-load input[type=file]").count() == 1


# the timeline's plot area, its stage labels (top, bottom), its legend entries (text, top, bottom, left, right),
# the legend's scroll bar, the figure's box and the Debugger's stage keys (top, height)
GEOMETRY = """() => { const gd = document.querySelector('#dbg-timeline .js-plotly-plot'), size = gd._fullLayout._size;
  const box = e => e.getBoundingClientRect(), svg = box(gd.querySelector('.main-svg'));
  return {plot: size.h, plot_top: svg.top + size.t, svg: [svg.top, svg.bottom, svg.left, svg.right],
          ticks: [...gd.querySelectorAll('.ytick text')].map(t => [box(t).top, box(t).bottom])
                   .sort((a, b) => a[0] - b[0]),
          entries: [...gd.querySelectorAll('.legend .traces')].map(t => [t.textContent, box(t).top, box(t).bottom,
                                                                         box(t).left, box(t).right]),
          scroll: Number(gd.querySelector('.legend .scrollbar')?.getAttribute('height') || 0),
          keys: [...document.querySelectorAll('#dbg-text .dex-key')].map(k => [box(k).top, box(k).height])}; }"""


def upload(page, path):
    clear = page.locator("#dbg-load button[aria-label='Clear']")
    if clear.count():
        clear.first.click()
    page.locator("#dbg-load input[type=file]").set_input_files(str(path))


def test_the_timeline_reads_at_k2_and_k8_with_its_stage_labels_apart_and_its_fate_legend_in_view(
    page, app_url, tmp_path
):
    from dex_core import DexDecoder
    from visualize import lattice_graph

    model, fates = tiny_model("llama", layers=8), {}
    for K in (2, 8):
        trace = (
            DexDecoder(model, explorers=K, tokenizer=tiny_tokenizer(), prune="none")
            .generate([1, 2, 3, 4], 8, node_text=True)
            .trace
        )
        save_trace(tmp_path / f"k{K}.json", trace, {"model": f"tiny k{K}"})
        fates[K] = {n["fate"] for _, n in lattice_graph(trace).nodes(data=True)}
    url, _ = app_url
    page.goto(url, timeout=60_000)
    page.get_by_role("tab", name="Debugger").click()
    plot_ready(page, "dbg-timeline")
    for K in (2, 8):
        upload(page, tmp_path / f"k{K}.json")
        page.wait_for_function(
            f"() => document.querySelectorAll('#dbg-timeline .ytick text').length === {K}"
            f" && document.querySelectorAll('#dbg-text .dex-key').length === {K}",
            timeout=60_000,
        )
        g = page.evaluate(GEOMETRY)
        assert g["plot"] >= 120, (K, g["plot"])
        assert all(a[1] <= b[0] for a, b in zip(g["ticks"], g["ticks"][1:])), (K, g["ticks"])  # labels apart
        shown = {text: rest for text, *rest in g["entries"]}
        assert fates[K] <= set(shown) and g["scroll"] == 0, (
            K,
            shown,
            g["scroll"],
        )  # every fate, no scrolling
        top, bottom, left, right = g["svg"]
        for text, (t, b, x0, r) in shown.items():  # inside the figure, above its plot area, one line each
            assert top <= t and b <= g["plot_top"] and left <= x0 and r <= right and b - t < 30, (
                K,
                text,
                t,
                b,
            )
        assert len({t for t, _ in g["keys"]}) == 1 and all(h < 24 for _, h in g["keys"]), g["keys"]  # one row


def test_the_analysis_colour_switch_redraws_in_the_page_without_a_model_call(app_url, page, monkeypatch):
    import time

    url, demo = app_url
    calls, model = [], demo.runtime.model
    monkeypatch.setattr(demo.runtime, "model", lambda *a, **k: (calls.append(1), model(*a, **k))[1])
    page.goto(url, timeout=60_000)
    page.get_by_role("tab", name="Race").click()
    assert "Press Race" in page.inner_text("#race-empty")  # each tab says what it does until it has a result
    page.get_by_role("tab", name="Analysis").click()
    assert "Press Analyse" in page.inner_text("#an-empty")
    page.locator("#an-new input[type=number]").fill("8")
    page.locator("#an-new input[type=number]").press("Enter")
    page.locator("#an-go").click()
    plot_ready(page, "an-depth")
    bar = "() => document.querySelector('#an-depth .colorbar .cbtitle')?.textContent"
    used = len(calls)
    assert page.evaluate(bar) == "p(token)" and used >= 1
    asked = []
    page.on("request", lambda r: asked.append(r.url) if "/gradio_api/" in r.url else None)
    for value, title in (("rank", "rank"), ("probability", "p(token)")):
        start = time.monotonic()
        page.locator(f"#an-metric input[value={value}]").check()
        page.wait_for_function(f"() => ({bar})() === {title!r}", timeout=2_000)
        assert time.monotonic() - start < 2
    assert len(calls) == used and asked == []  # no model call, and no request to the server at all


# the timeline's plotted traces by name (d3 binds each trace's calcdata to its group), and the chain frames
TRACE_EL = """name => [...document.querySelectorAll('#dbg-timeline .scatterlayer .trace')]
  .find(el => el.__data__?.[0]?.trace?.name === name && el.__data__[0].trace.showlegend !== false)"""
FRAMES = f"""() => {{ const gd = document.querySelector('#dbg-timeline .js-plotly-plot');
  const line = ({TRACE_EL})('draft chain')?.querySelector('.js-line');
  return {{boxes: gd.data.filter(t => t.name === 'draft chain')
                   .reduce((n, t) => n + t.x.filter(x => x === null).length, 0),
          path: line ? line.getAttribute('d').length : 0, dash: line ? getComputedStyle(line).strokeDasharray : 'none',
          legend: [...gd.querySelectorAll('.legend .traces')].map(t => t.textContent)}}; }}"""
COLLAPSE_AT = f"""round => {{ const gd = document.querySelector('#dbg-timeline .js-plotly-plot');
  const t = gd.data.find(t => t.name === 'collapses'), k = t.customdata.indexOf(round);
  const r = ({TRACE_EL})('collapses').querySelectorAll('.points path')[k].getBoundingClientRect();
  return [r.x + r.width / 2, r.y + r.height / 2, t.text[k]]; }}"""


def test_a_chain_run_shows_framed_chain_nodes_and_a_round_of_several_commits_opened_from_the_timeline(
    llama, page, app_url, tmp_path
):
    from dex_core import DexDecoder
    from visualize import lattice_graph

    decoder = DexDecoder(llama, explorers=4, tokenizer=tiny_tokenizer(), prune="none", draft="gate=0")
    trace = decoder.generate([4, 8, 15, 16, 23, 42, 7, 9] * 3, 24, node_text=True).trace
    save_trace(tmp_path / "chains.json", trace, {"model": "tiny, draft chains"})
    drafted = sum(d["drafted"] for _, d in lattice_graph(trace).nodes(data=True))
    rounds = [e for e in trace if isinstance(e, RoundEvent)]
    several = next(e for e in rounds if len(e.commits) > 1)
    n, upto = len(several.commits), rounds[: rounds.index(several) + 1]
    url, _ = app_url
    page.goto(url, timeout=60_000)
    page.get_by_role("tab", name="Debugger").click()
    plot_ready(page, "dbg-timeline")
    upload(page, tmp_path / "chains.json")  # the bundled example has chains too: wait for this run's timeline
    title = f"Whole run: {sum(len(e.nodes) for e in rounds)} nodes in {len(rounds)} rounds"
    page.wait_for_function(
        f"() => document.querySelector('#dbg-timeline .js-plotly-plot')?.layout.title.text"
        f".startsWith({title!r}) && ({FRAMES})().path > 0",
        timeout=60_000,
    )
    frames = page.evaluate(FRAMES)
    assert frames["boxes"] == drafted > 0 and frames["dash"] not in (
        "none",
        "",
    )  # every chain node framed, dotted
    assert "draft chain" in frames["legend"]
    x, y, label = page.evaluate(f"({COLLAPSE_AT})({several.round})")
    assert label == f"×{n}"
    page.mouse.move(x, y)
    page.wait_for_timeout(300)
    page.mouse.click(x, y)
    page.wait_for_function(
        f"() => document.querySelector('#dbg-fsm')?.innerText.includes('committed {n} tokens this round')",
        timeout=30_000,
    )
    fsm = page.inner_text("#dbg-fsm")
    assert fsm.count("(drafted)") == sum(c.drafted for c in several.commits) >= 1
    assert f"committed {n} tokens" in page.evaluate(TITLE) and f"Commit {n} of {n}" in page.inner_text(
        "#dbg-table"
    )
    marked = sum(c.drafted for e in upto for c in e.commits)
    assert page.locator("#dbg-text .dex-tok[data-drafted='1']").count() == marked


# the lattice's title, its drawn labels and the figure's box (px), as the browser laid them out
LATTICE_TEXT = """() => { const gd = document.querySelector('#dbg-lattice .js-plotly-plot');
  const box = e => e.getBoundingClientRect(), svg = box(gd.querySelector('.main-svg'));
  const title = box(gd.querySelector('.gtitle'));
  const labels = [...gd.querySelectorAll('.textpoint text')].filter(t => t.textContent).map(box)
    .map(r => [r.left, r.top, r.right, r.bottom]);
  return {svg: [svg.left, svg.top, svg.right], title: [title.left, title.top, title.right], labels}; }"""


def test_play_at_the_last_round_starts_from_the_first_and_save_downloads_in_one_click(app_url, page):
    url, _ = app_url
    page.goto(url, timeout=60_000)
    page.get_by_role("tab", name="Debugger").click()
    plot_ready(page, "dbg-timeline")
    rounds = [e.round for e in example_events() if isinstance(e, RoundEvent)]
    assert page.evaluate(ROUND) == rounds[-1]  # every trace opens at its last round
    page.locator("#dbg-play").click()
    page.wait_for_function(f"() => ({ROUND})() < {rounds[-1]}", timeout=30_000)  # it plays from the first
    page.locator("#dbg-pause").click()
    assert page.evaluate(ROUND) < rounds[-1]
    with page.expect_download(timeout=60_000) as download:
        page.locator("#dbg-save").click()
    assert download.value.suggested_filename == "dex-trace.json"
    saved = json.loads(open(download.value.path()).read())
    assert len(saved["events"]) == len(example_events())
    layout = page.evaluate(LATTICE_TEXT)  # the lattice's title is not cut
    assert layout["svg"][0] <= layout["title"][0] and layout["title"][2] <= layout["svg"][2]
    assert layout["svg"][1] <= layout["title"][1]


def test_a_refused_upload_leaves_the_box_empty_and_ready_for_another_file(app_url, page, tmp_path):
    from helpers import long_chain_trace

    (tmp_path / "bad.json").write_text('{"format": "dex-trace", "events": 7')
    save_trace(tmp_path / "k8.json", long_chain_trace(), {"model": "tiny k8, long chains"})  # 3 rounds
    url, _ = app_url
    page.goto(url, timeout=60_000)
    page.get_by_role("tab", name="Debugger").click()
    plot_ready(page, "dbg-timeline")
    page.locator("#dbg-load input[type=file]").set_input_files(str(tmp_path / "bad.json"))
    page.wait_for_function(
        "() => document.querySelector('#dbg-status')?.innerText.includes('not loaded')", timeout=60_000
    )
    page.wait_for_function("() => !document.querySelector('#dbg-load').innerText.includes('bad.json')")
    assert "invalid JSON" in page.inner_text("#dbg-status")  # the status line still says why
    assert page.locator("#dbg-load input[type=file]").count() == 1  # the drop area is back
    page.locator("#dbg-load input[type=file]").set_input_files(str(tmp_path / "k8.json"))  # the box is usable
    page.wait_for_function(
        "() => document.querySelector('#dbg-status')?.innerText.includes('k8.json')", timeout=60_000
    )
    page.wait_for_function("() => document.querySelectorAll('#dbg-lattice .ytick').length === 8")
    open_round(page, 1)  # chains 30 positions long
    page.wait_for_function(f"() => ({TITLE})().startsWith('Round 1 ')", timeout=30_000)
    layout = page.evaluate(LATTICE_TEXT)
    labels = layout["labels"]
    apart = all(
        a[2] <= b[0] + 1 or b[2] <= a[0] + 1 or a[3] <= b[1] + 1 or b[3] <= a[1] + 1
        for i, a in enumerate(labels)
        for b in labels[i + 1 :]
    )
    assert len(labels) >= 8 and apart, labels  # as drawn: no two labels overlap
    assert layout["svg"][0] <= layout["title"][0] and layout["title"][2] <= layout["svg"][2]


# the lattice title's box, and the boxes of what could cover it: Plotly's toolbar, Gradio's label and toolbar
COVERS = """() => { const root = document.querySelector('#dbg-lattice');
  const box = e => { const r = e.getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom]; };
  const shown = e => e.getBoundingClientRect().width > 0 && getComputedStyle(e).visibility !== 'hidden';
  const title = root.querySelector('.gtitle');
  const others = [...root.querySelectorAll('.modebar, [data-testid=block-label], .icon-button-wrapper, .legend')]
    .filter(shown).map(box);
  return {title: box(title), text: title.textContent, others}; }"""


def _apart(a, b) -> bool:
    return a[2] <= b[0] or b[2] <= a[0] or a[3] <= b[1] or b[3] <= a[1]


def test_enter_in_the_round_box_shows_that_round_under_a_title_nothing_covers_and_the_status_says_it(
    app_url, page, tmp_path
):
    (tmp_path / "bad.json").write_text('{"format": "dex-trace", "events": 7')
    url, _ = app_url
    page.goto(url, timeout=60_000)
    page.get_by_role("tab", name="Debugger").click()
    plot_ready(page, "dbg-lattice")
    page.locator("#dbg-load input[type=file]").set_input_files(str(tmp_path / "bad.json"))
    page.wait_for_function("() => document.querySelector('#dbg-status').innerText.includes('not loaded')")
    box = page.locator("#dbg-round input[type=number]")
    box.fill("12")
    box.press("Enter")  # no Tab: the box keeps the focus it had
    page.wait_for_function(f"() => ({TITLE})().startsWith('Round 12 ')", timeout=30_000)
    assert "Round 12</b>" in page.inner_html("#dbg-table")
    page.wait_for_function(
        "() => document.querySelector('#dbg-status').innerText.includes('round 12 of 1..')"
    )
    assert "not loaded" not in page.inner_text("#dbg-status")  # the step replaced the upload's error
    page.locator("#dbg-lattice").hover()  # Plotly shows its toolbar on hover
    page.wait_for_timeout(300)
    seen = page.evaluate(COVERS)
    assert seen["text"].startswith("Round 12 ") and seen["title"][2] > seen["title"][0]
    assert seen["others"] and all(_apart(seen["title"], other) for other in seen["others"]), seen


def test_the_depth_views_token_labels_stay_apart_at_128_tokens(app_url, page):
    url, _ = app_url
    page.goto(url, timeout=60_000)
    page.get_by_role("tab", name="Analysis").click()
    page.locator("#an-new input[type=number]").fill("128")
    page.locator("#an-new input[type=number]").press("Enter")
    page.locator("#an-go").click()
    plot_ready(page, "an-depth")
    boxes = page.evaluate(
        """() => [...document.querySelectorAll('#an-depth .xtick text')].filter(t => t.textContent)
        .map(t => { const r = t.getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom]; })"""
    )
    assert len(boxes) >= 16, boxes  # labelled, at least every 8th token
    assert all(_apart(a, b) for i, a in enumerate(boxes) for b in boxes[i + 1 :]), boxes
