"""Crafted traces in a real browser (Chromium): markup in every text field renders as text, markup in a
numeric field is refused with a clear message, no script runs, nothing is injected, and a refused
upload leaves the session's trace on screen."""

import json
import re

import pytest
from helpers import needs_chromium

from dex_core import TRACE_VERSION, DexDecoder
from dex_core.testing import tiny_tokenizer
from dex_core.trace.files import load_trace, records

PAYLOADS = [
    '<img src=x onerror="window.__xss=1">',
    "<img src=x onerror=alert(1)>",
    '"><svg onload="window.__xss=1">',
    "<script>window.__xss=1</script>",
    '<a href="javascript:window.__xss=1">click</a>',
    "' onmouseover='window.__xss=1' x='",
]
INJECTED = (
    '() => document.querySelectorAll(\'img[src="x"], svg[onload], [onerror], [onmouseover], '
    'a[href^="javascript"]\').length'
)
STATUS = "() => document.querySelector('#dbg-status')?.innerText || ''"
pytestmark = needs_chromium


def write(path, events: list[dict], meta: dict) -> None:
    """A crafted trace file: its records as they are, never typed (a hostile file need not be a trace)."""
    path.write_text(
        json.dumps({"format": "dex-trace", "version": TRACE_VERSION, "meta": meta, "events": events})
    )


def same_first_commit(events):
    """A round records its first commit twice (``commit`` and ``commits[0]``): an edit of one is made to both."""
    for event in events:
        if event.get("commit") and event.get("commits"):
            event["commits"][0] = event["commit"]


@pytest.fixture(scope="module")
def traces(llama, tmp_path_factory):
    """A clean trace, the same trace with markup in every text field, and one file per confirmed
    numeric XSS vector (markup where a number or a kind belongs)."""
    folder = tmp_path_factory.mktemp("crafted")
    events = records(
        DexDecoder(llama, explorers=3, tokenizer=tiny_tokenizer(), trace_top=5)
        .generate([1, 2, 3, 4], 6)
        .trace
    )
    write(folder / "clean.json", events, {"model": "tiny"})
    marked = json.loads(json.dumps(events))
    n = 0
    for event in marked:
        for record in event.get("nodes", []) + [event.get("commit") or {}]:
            if "text" in record:
                record["text"], n = PAYLOADS[n % len(PAYLOADS)], n + 1
    same_first_commit(marked)
    write(folder / "markup.json", marked, {"model": PAYLOADS[0], "prompt": PAYLOADS[3]})
    commit = next(i for i, e in enumerate(events) if e.get("commit"))
    vectors = {
        "depths": (0, "depths", 0),
        "kind": (1, "nodes", 0, "kind"),
        "round": (1, "round"),
        "state_before": (2, "state_before"),
        "kept": (commit, "collapse", "kept"),
        "position": (commit, "commit", "position"),
    }
    numeric = {}
    for name, path in vectors.items():
        bad = json.loads(json.dumps(events))
        target = bad
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = [PAYLOADS[1]] if name == "kept" else PAYLOADS[1]
        same_first_commit(bad)
        write(folder / f"{name}.json", bad, {})
        numeric[name] = folder / f"{name}.json"
    return folder / "clean.json", folder / "markup.json", numeric


def upload(page, path):
    clear = page.locator("#dbg-load button[aria-label='Clear']")
    if clear.count():
        clear.first.click()
    page.locator("#dbg-load input[type=file]").set_input_files(str(path))


def table_text(page) -> str:
    return page.evaluate("() => document.querySelector('#dbg-table')?.innerText || ''")


def showing(page, round_no: int, timeout=30_000) -> None:
    """Wait until the Debugger's round table shows round ``round_no``."""
    page.wait_for_function(
        f"() => document.querySelector('#dbg-table')?.innerText.startsWith('Round {round_no} ·')",
        timeout=timeout,
    )


def assert_nothing_ran(page, dialogs):
    assert page.evaluate("() => window.__xss") is None
    assert page.evaluate(INJECTED) == 0
    assert dialogs == []


def test_crafted_traces_render_as_text_or_are_refused_and_keep_the_previous_trace(app_server, page, traces):
    from visualize import Replay

    clean, markup, numeric = traces
    # the rounds Prev steps through (the markup trace's are the clean one's), the last first
    rounds = [view.round for view in Replay(load_trace(clean)[0])][::-1]
    dialogs = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    page.goto(app_server.url, timeout=60_000)
    page.get_by_role("tab", name="Debugger").click()
    page.wait_for_function(f"() => ({STATUS})().includes('bundled trace')", timeout=60_000)  # the page load's
    upload(page, clean)
    showing(page, rounds[0], timeout=60_000)  # a loaded trace opens at its last round, as a live run does

    clean_text = table_text(page)
    upload(page, markup)
    page.wait_for_function(
        f"() => document.querySelector('#dbg-table').innerText !== {json.dumps(clean_text)}", timeout=60_000
    )
    showing(page, rounds[0])
    page.wait_for_timeout(500)
    assert_nothing_ran(page, dialogs)
    assert any(payload in table_text(page) for payload in PAYLOADS)  # shown as text
    # back through commit rounds: the commit text is in the table, title and text panel
    plots = []  # each round's lattice as drawn: its labels and the hovered node's label
    for back in rounds[1:5]:
        page.locator("#dbg-prev").click()
        showing(page, back)  # this Prev's round, not just a change: a render still on its way lands later
        box = page.locator("#dbg-lattice .scatterlayer .point").first.bounding_box(timeout=10_000)
        if box:  # hover a node so Plotly draws its hover label (None while the plot redraws)
            page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
        plots.append(
            page.evaluate("() => document.querySelector('#dbg-lattice .js-plotly-plot').textContent")
        )
    assert_nothing_ran(page, dialogs)
    assert "<img src=x" in page.evaluate("() => document.querySelector('#dbg-text').innerText")
    assert any(re.search(r"<(scr|img|svg|a h)", plot) for plot in plots)  # markup drawn as text
    assert not any("&quot;" in plot or "&lt;" in plot for plot in plots)  # and not escaped twice
    assert_nothing_ran(page, dialogs)
    shown = table_text(page)
    assert shown.startswith(f"Round {rounds[4]} ·"), shown

    for name, path in numeric.items():  # each refusal names its field in the Debugger's status line
        upload(page, path)
        page.wait_for_function(
            f"() => ({STATUS})().includes('not loaded') && ({STATUS})().includes({json.dumps(name)})",
            timeout=30_000,
        )
        message = page.evaluate(STATUS)
        assert "this trace was not loaded" in message and "not a valid DEX trace" in message, message
        assert "still shows the previous trace" in message, message
        assert name in message and "/tmp" not in message and "<img" not in message, message
        assert "&#" not in message and "&quot;" not in message, message  # shown as plain text
        assert table_text(page) == shown, name
        assert_nothing_ran(page, dialogs)

    garbage = numeric["depths"].parent / "garbage.json"
    garbage.write_text("this is not JSON")
    upload(page, garbage)
    page.wait_for_function(
        f"() => ({STATUS})().includes('garbage.json') || ({STATUS})().includes('not loaded')", timeout=30_000
    )
    message = page.evaluate(STATUS)
    assert "/tmp" not in message and "gradio" not in message.lower() and table_text(page) == shown, message
    assert page.locator("[data-testid='toast-text']").count() == 0

    page.locator("#dbg-prev").click()  # the session still holds the markup trace
    showing(page, rounds[5])
    shown_now = table_text(page) + page.evaluate("() => document.querySelector('#dbg-text').innerText")
    assert any(payload in shown_now for payload in PAYLOADS)
    assert_nothing_ran(page, dialogs)
