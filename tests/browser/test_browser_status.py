"""Issue 64 in a real browser (Chromium): a K = 4 run with draft chains made in the page opens its timeline at a window
of positions whose markers stay apart, and the timeline zooms (a drag) and pans (a shift-drag) along x; the Debugger's
status line names the round shown after a timeline click, Play, Pause and Play to the last round, and the band of
that round stays in view; the Analysis never reads 100% before its figures arrive."""

import pytest
from helpers import launch_app, needs_chromium

from dex_core.testing import tiny_model, tiny_tokenizer
from dex_core.trace.events import RoundEvent

pytestmark = needs_chromium
PROMPT = "hello world the prime number " * 6  # repeats: prompt lookup finds chains to draft
TIMELINE = "document.querySelector('#dbg-timeline .js-plotly-plot')"
ROUND = "() => Number(document.querySelector('#dbg-round input[type=number]').value)"
TITLE = "() => document.querySelector('#dbg-lattice .js-plotly-plot')?.layout?.title?.text || ''"
STATUS = "() => document.querySelector('#dbg-status')?.innerText || ''"
X_RANGE = f"() => [...{TIMELINE}._fullLayout.xaxis.range]"
# the node markers drawn inside the plot area (px boxes), the positions the nodes span, the plot area, any chains
MARKERS = f"""() => {{ const gd = {TIMELINE}, area = gd.querySelector('.nsewdrag').getBoundingClientRect();
  const inside = r => r.width > 0 && r.left + r.width / 2 >= area.left && r.right - r.width / 2 <= area.right;
  const boxes = [...gd.querySelectorAll('.scatterlayer .point')].map(p => p.getBoundingClientRect()).filter(inside)
    .map(r => [r.left, r.top, r.right, r.bottom]);
  const xs = gd.data.filter(t => t.mode === 'markers' && t.name !== 'collapses').flatMap(t => t.x);
  return {{boxes, lo: Math.min(...xs), hi: Math.max(...xs), area: [area.left, area.top, area.right, area.bottom],
          chains: gd.data.some(t => t.name === 'draft chain' && t.x.length)}}; }}"""
# the current round's band and the x range shown
BAND = f"""() => {{ const gd = {TIMELINE}, s = (gd.layout.shapes || []).find(s => s.name === 'current round');
  return s ? {{x0: s.x0, x1: s.x1, range: [...gd._fullLayout.xaxis.range]}} : null; }}"""


@pytest.fixture(scope="module")
def app_url(tmp_path_factory):
    """The app on a tiny 8-layer model at K = 4 (draft chains on, as the page's control starts)."""
    from app.host.settings import AppSettings

    path = tmp_path_factory.mktemp("tiny8-status")
    tiny_model("llama", layers=8).save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    demo, url = launch_app(AppSettings(model=str(path), explorers=4))
    yield url
    demo.close()


def plot_ready(page, elem: str, timeout=120_000):
    page.wait_for_function(
        f"() => document.querySelector('#{elem} .js-plotly-plot')?.data?.length", timeout=timeout
    )


def overlap(a, b) -> float:
    """The area two boxes share over the smaller one's."""
    w, h = min(a[2], b[2]) - max(a[0], b[0]), min(a[3], b[3]) - max(a[1], b[1])
    smaller = min((a[2] - a[0]) * (a[3] - a[1]), (b[2] - b[0]) * (b[3] - b[1]))
    return max(w, 0) * max(h, 0) / smaller


def drag(page, start: tuple, end: tuple, shift: bool = False) -> None:
    page.mouse.move(*start)
    if shift:
        page.keyboard.down("Shift")
    page.mouse.down()
    page.mouse.move(*end, steps=8)
    page.mouse.up()
    if shift:
        page.keyboard.up("Shift")


def test_a_k4_chain_run_opens_its_timeline_with_markers_apart_and_it_zooms_and_pans(app_url, page):
    page.goto(app_url, timeout=60_000)
    plot_ready(page, "live-lattice")
    page.locator("text=Exploration and sampling").click()
    assert page.locator("#live-draft input").is_checked()  # draft chains on
    assert page.locator("#live-k input[type=number]").input_value() == "4"
    page.locator("#live-new input[type=number]").fill("24")
    page.locator("#live-new input[type=number]").press("Enter")
    page.locator("#live-prompt textarea").fill(PROMPT)
    page.locator("#live-generate").click()
    page.wait_for_function(
        "() => document.querySelector('#live-status [data-state]')?.dataset.state === 'finished'",
        timeout=120_000,
    )
    page.get_by_role("tab", name="Debugger").click()
    page.wait_for_function(f"() => ({STATUS})().includes('live run')", timeout=60_000)
    page.wait_for_function(  # drawn, and fitted to its box once its tab opened
        f"() => ({MARKERS})().boxes.length > 20 && Math.abs({TIMELINE}._fullLayout.width"
        f" - {TIMELINE}.parentElement.clientWidth) <= 2",
        timeout=30_000,
    )
    seen = page.evaluate(MARKERS)
    opening = page.evaluate(X_RANGE)
    lo, hi = seen["lo"], seen["hi"]
    assert seen["chains"] and opening[0] < lo < opening[1] < hi, (
        opening,
        lo,
        hi,
    )  # the run's first positions
    boxes = seen["boxes"]
    worst = max(overlap(a, b) for i, a in enumerate(boxes) for b in boxes[i + 1 :])
    assert len(boxes) > 50 and worst <= 0.5, (len(boxes), worst)

    left, top, right, bottom = seen["area"]
    y = top + 0.6 * (bottom - top)
    drag(page, (left + 0.3 * (right - left), y), (left + 0.6 * (right - left), y))  # a drag zooms along x
    page.wait_for_function(f"() => ({X_RANGE})()[1] - ({X_RANGE})()[0] < {0.5 * (opening[1] - opening[0])}")
    zoomed = page.evaluate(X_RANGE)
    assert opening[0] < zoomed[0] < zoomed[1] < opening[1], (opening, zoomed)
    at = [left + f * (right - left) for f in (0.7, 0.2)]
    drag(page, (at[0], y), (at[1], y), shift=True)  # shift-drag pans
    page.wait_for_function(f"() => ({X_RANGE})()[0] > {zoomed[0] + 0.2 * (zoomed[1] - zoomed[0])}")
    panned = page.evaluate(X_RANGE)
    assert panned[1] - panned[0] == pytest.approx(zoomed[1] - zoomed[0], rel=0.01), (zoomed, panned)
    page.mouse.dblclick(left + 0.5 * (right - left), y)  # back to the opening window
    page.wait_for_function(f"() => Math.abs(({X_RANGE})()[0] - {opening[0]}) < 0.01")


# the collapse markers in view at the timeline's x range: [round, x, y] each (px, the marker's centre)
COLLAPSES_IN_VIEW = f"""() => {{ const gd = {TIMELINE}, t = gd.data.find(t => t.name === 'collapses');
  const el = [...gd.querySelectorAll('.scatterlayer .trace')]
    .find(e => e.__data__?.[0]?.trace?.name === 'collapses' && e.__data__[0].trace.showlegend !== false);
  const area = gd.querySelector('.nsewdrag').getBoundingClientRect();
  return [...el.querySelectorAll('.points path')].map((p, k) => {{ const r = p.getBoundingClientRect();
    return [t.customdata[k], r.x + r.width / 2, r.y + r.height / 2]; }})
    .filter(([, x]) => area.left + 5 < x && x < area.right - 5); }}"""


def click_a_round(page, nth: int) -> int:
    """Click the ``nth`` collapse marker in view on the timeline; returns the round it opened."""
    round_no, x, y = page.evaluate(COLLAPSES_IN_VIEW)[nth]
    page.mouse.move(x, y)
    page.wait_for_timeout(200)
    page.mouse.click(x, y)
    page.wait_for_function(f"() => ({ROUND})() === {round_no}", timeout=30_000)
    return round_no


def says_round(page, round_no: int, first: int, last: int) -> None:
    page.wait_for_function(
        f"() => ({STATUS})().includes('round {round_no} of {first}..{last} ')"
        f" && ({TITLE})().startsWith('Round {round_no} ')",
        timeout=30_000,
    )


def test_the_debugger_status_names_the_round_shown_after_a_click_play_and_pause(app_url, page):
    from app.ui.debugger import bundled

    rounds = [e.round for e in bundled(None).events if isinstance(e, RoundEvent)]
    first, last = rounds[0], rounds[-1]
    page.goto(app_url, timeout=60_000)
    page.get_by_role("tab", name="Debugger").click()
    plot_ready(page, "dbg-timeline")
    clicked = click_a_round(page, 2)  # a timeline click
    says_round(page, clicked, first, last)
    page.locator("#dbg-play").click()
    page.wait_for_function(f"() => ({ROUND})() >= {clicked + 2}", timeout=30_000)
    page.locator("#dbg-pause").click()
    page.wait_for_timeout(1000)  # a tick already queued changes nothing (a tick every 0.6 s)
    paused = page.evaluate(ROUND)
    says_round(page, paused, first, last)
    box = page.locator("#dbg-round input[type=number]")  # the round box, then Play to the last round
    box.fill(str(rounds[-4]))
    box.press("Enter")
    says_round(page, rounds[-4], first, last)
    page.locator("#dbg-play").click()
    page.wait_for_function(f"() => ({ROUND})() === {last}", timeout=30_000)
    says_round(page, last, first, last)
    page.wait_for_timeout(700)  # the timer stopped there: the status still says the last round
    assert f"round {last} of {first}..{last} " in page.evaluate(STATUS)
    page.wait_for_function(  # the view panned with the rounds: the last round's band is in view (from its start)
        f"""() => {{ const b = ({BAND})(), [lo, hi] = b.range;
          return lo <= b.x0 && b.x0 < hi && (b.x1 <= hi || b.x1 - b.x0 > hi - lo); }}""",
        timeout=10_000,
    )


# every text Gradio's progress shows over the Analysis's outputs until its depth view arrives
WATCH_PROGRESS = """() => { window.__progress = []; const seen = new Set();
  const look = () => { if (document.querySelector('#an-depth .js-plotly-plot')?.data?.length) return;
    for (const el of document.querySelectorAll('#an-ead [data-testid=status-tracker]')) {
      const text = el.innerText.replace(/\\d+\\.\\ds/, '').replace(/\\s+/g, ' ').trim();  // less its clock
      if (text && !seen.has(text)) { seen.add(text); window.__progress.push(text); } } };
  new MutationObserver(look).observe(document.body, {subtree: true, childList: true, characterData: true}); }"""


def test_the_analysis_reports_each_phase_and_never_100_percent_before_its_figures(app_url, page, monkeypatch):
    import time

    from app.ui import analysis as analysis_tab

    # the tiny model answers and is drawn within Gradio's 0.1 s between two progress messages: each token and the
    # drawing take as long as the real model's would show them
    stream, draw = analysis_tab.ar_stream, analysis_tab.viz.depth_figure
    monkeypatch.setattr(
        analysis_tab, "ar_stream", lambda *a, **k: ((time.sleep(0.03), e)[1] for e in stream(*a, **k))
    )
    monkeypatch.setattr(analysis_tab.viz, "depth_figure", lambda *a, **k: (time.sleep(0.5), draw(*a, **k))[1])
    page.goto(app_url, timeout=60_000)
    page.get_by_role("tab", name="Analysis").click()
    page.locator("#an-new input[type=number]").fill("24")
    page.locator("#an-new input[type=number]").press("Enter")
    page.evaluate(WATCH_PROGRESS)
    page.locator("#an-go").click()
    plot_ready(page, "an-depth")
    shown = page.evaluate("() => window.__progress")
    assert any("tokens | the greedy answer" in text for text in shown), shown
    assert any("3/4 steps | analysing 24 tokens: drawing the figures" in text for text in shown), shown
    assert not any("100%" in text or "100.0%" in text for text in shown), shown
