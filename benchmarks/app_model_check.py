"""Does the app serve a named model end to end? (issue 31: ``DEX_MODEL=gemma3-270m``)

    python benchmarks/app_model_check.py --model gemma3-270m --out docs/results/app-gemma3-270m.json

Starts the app exactly as ``gradio app/main.py`` would for ``DEX_MODEL=MODEL`` (``AppSettings.from_env``), serves
it on a free local port, reads the page's configuration (its four tabs) and drives the public API with
``gradio_client``, as a visitor's script would: a Live run (``/generate``, streamed to its finished status), a
Race (``/race``) and an Analysis (``/analyse``), each short. The Debugger runs in the page on the traces these
produce; the check is that its tab is served. Writes what it saw (tabs, states, token counts, seconds); exit 1
when a tab is missing or a call does not finish. Not a test: it loads a real model (minutes on a 2-core CPU).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import sys
import time
import urllib.request
from pathlib import Path

TABS = ("Live", "Race", "Analysis", "Debugger")
PROMPT = "Write a Python function that checks whether a number is prime."


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tabs(url: str) -> list[str]:
    config = json.loads(urllib.request.urlopen(f"{url}config", timeout=60).read())
    return [c["props"].get("label") for c in config["components"] if c.get("type") == "tabitem"]


def _text(html: str) -> str:
    return " ".join(re.sub(r"<[^>]+>", " ", html).split())


def _timed(call) -> tuple:
    tic = time.monotonic()
    out = call()
    return out, round(time.monotonic() - tic, 1)


def check(model: str, tokens: int) -> dict:
    os.environ["DEX_MODEL"] = model
    from gradio_client import Client

    from app.host.settings import AppSettings
    from app.main import build_demo

    demo, port = build_demo(AppSettings.from_env()), _port()
    demo.launch(prevent_thread_lock=True, server_name="127.0.0.1", server_port=port)
    url = f"http://127.0.0.1:{port}/"
    try:
        client = Client(url, verbose=False)
        live = client.submit(
            PROMPT,
            True,
            4,
            "",
            True,
            True,
            False,
            1.0,
            0,
            1.0,
            0,
            tokens,
            "auto",
            False,
            api_name="/generate",
        )
        frames, live_s = _timed(lambda: list(live))
        status = frames[-1][-1]
        race, race_s = _timed(lambda: client.predict(PROMPT, True, 4, True, tokens, False, api_name="/race"))
        analysis, analysis_s = _timed(
            lambda: client.predict(PROMPT, True, True, tokens, "probability", api_name="/analyse")
        )
        return {
            "model": model,
            "tabs": _tabs(url),
            "live": {
                "state": re.search(r"data-state='(\w+)'", status).group(1),
                "frames": len(frames),
                "status": _text(status),
                "seconds": live_s,
            },
            "race": {"summary": _text(race[-1])[:600], "seconds": race_s},
            "analysis": {"table_chars": len(analysis[2]), "seconds": analysis_s},
        }
    finally:
        demo.close()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="gemma3-270m")
    parser.add_argument("--tokens", type=int, default=24, help="new tokens per call")
    parser.add_argument("--out", help="write the JSON here")
    args = parser.parse_args(argv)
    seen = check(args.model, args.tokens)
    text = json.dumps(seen, indent=1, ensure_ascii=False)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    ok = all(t in seen["tabs"] for t in TABS) and seen["live"]["state"] == "finished"
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
