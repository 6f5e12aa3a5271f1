"""Screenshots of the app on a real model, for README.md (docs/screenshots/*.png).

    python scripts/app_screenshots.py --model default --out docs/screenshots

Starts the app in-process, drives it with Playwright in Debian's Chromium (/usr/bin/chromium; no
browser download) and saves: live.png (a K=4 run), debugger.png (its whole-run timeline and a round),
compare.png (that run pinned next to a K=2 run), race.png, analysis.png (with the depth heatmap),
live-k8.png and debugger-k8.png (K=8 with the full, unpruned lattice); then app.json, what the pictures show of
the app besides the runs (its header, every control's default, the palette: ``app.ui.page.appearance``), which
``tests/project/test_readme.py`` compares with the app's, so that a change to any of them fails until the pictures are
made again. The runs use the app's own default number of new tokens unless ``--tokens`` says otherwise.
"""

from __future__ import annotations

import argparse
import json
import socket
from pathlib import Path

from playwright.sync_api import sync_playwright

from app.host.settings import AppSettings
from app.main import build_demo
from app.ui.page import appearance

ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]


STATE = "() => document.querySelector('#live-status [data-state]')?.dataset.state"


def shot(page, selector: str, text: str, path: Path) -> None:
    """Wait until ``selector`` shows ``text`` (model work done), then save a full-page screenshot."""
    page.wait_for_function(
        f"() => document.querySelector('{selector}')?.innerText.includes('{text}')", timeout=900_000
    )
    page.wait_for_timeout(1500)
    page.screenshot(path=str(path), full_page=True)


def live(page, path: Path, explorers: int, tokens: int, prune: str = "auto") -> None:
    """A Live run with K = ``explorers``, ``tokens`` new tokens and lattice pruning ``prune``, then its
    screenshot once this run (not the one before) has finished."""
    for box, value in (("#live-k", explorers), ("#live-new", tokens)):
        page.locator(f"{box} input[type=number]").fill(str(value))
        page.locator(f"{box} input[type=number]").press("Enter")
    page.locator("#live-prune input").fill(prune)
    page.get_by_role("option", name=prune, exact=True).click()
    page.locator("#live-generate").click()
    page.wait_for_function(f"() => ({STATE})() === 'running'", timeout=60_000)
    page.wait_for_function(f"() => ({STATE})() === 'finished'", timeout=900_000)
    page.wait_for_timeout(1500)
    page.screenshot(path=str(path), full_page=True)


def debugger(page, path: Path) -> None:
    """The Debugger on the last Live run: its timeline and a round a few steps before the end."""
    page.get_by_role("tab", name="Debugger").click()
    page.wait_for_function(
        "() => document.querySelector('#dbg-status')?.innerText.includes('live run')", timeout=120_000
    )
    page.locator("#dbg-timeline .js-plotly-plot").wait_for(timeout=60_000)
    for _ in range(3):
        page.locator("#dbg-prev").click()
        page.wait_for_timeout(700)
    page.screenshot(path=str(path), full_page=True)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="default")
    parser.add_argument("--explorers", type=int, default=4)
    parser.add_argument(
        "--tokens", type=int, default=None, help="new tokens (default: the app's own default)"
    )
    parser.add_argument("--k8-tokens", type=int, default=16)
    parser.add_argument("--out", default="docs/screenshots")
    parser.add_argument("--chromium", default="/usr/bin/chromium")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    demo = build_demo(AppSettings(model=args.model, explorers=args.explorers))
    shown = appearance(demo)
    args.tokens = args.tokens or shown["controls"]["live-new"]
    demo.runtime.model()  # load before the browser starts waiting
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    demo.queue().launch(prevent_thread_lock=True, server_name="127.0.0.1", server_port=port, show_error=True)
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=args.chromium, args=ARGS)
            page = browser.new_page(viewport={"width": 1440, "height": 1100})
            page.goto(f"http://127.0.0.1:{port}/", timeout=120_000)
            page.locator("text=Exploration and sampling").click()
            live(page, out / "live.png", 4, args.tokens)
            debugger(page, out / "debugger.png")
            page.locator("#dbg-pin").click()
            page.get_by_role("tab", name="Live").click()
            live(page, out / "live-k2.png", 2, args.tokens)
            page.get_by_role("tab", name="Debugger").click()
            page.locator("#dbg-compare-plot .js-plotly-plot").wait_for(timeout=120_000)
            page.wait_for_timeout(1500)
            page.locator("#dbg-compare").scroll_into_view_if_needed()
            page.locator("#dbg-compare").screenshot(path=str(out / "compare.png"))
            (out / "live-k2.png").unlink()
            page.get_by_role("tab", name="Race").click()
            page.locator("#race-new input[type=number]").fill(str(args.tokens))
            page.locator("#race-go").click()
            shot(page, "#race-badge", "output", out / "race.png")
            page.get_by_role("tab", name="Analysis").click()
            page.locator("#an-go").click()
            page.locator("#an-depth .js-plotly-plot").wait_for(timeout=900_000)
            shot(page, "#an-table", "oracle", out / "analysis.png")
            page.get_by_role("tab", name="Live").click()
            live(page, out / "live-k8.png", 8, args.k8_tokens, prune="none")
            debugger(page, out / "debugger-k8.png")
            browser.close()
        (out / "app.json").write_text(json.dumps(shown, indent=2, ensure_ascii=False) + "\n")
    finally:
        demo.close()


if __name__ == "__main__":
    main()
