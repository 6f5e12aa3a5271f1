"""Live as a visitor sees it (issue 64): the first time estimate against the run's time, and the run's model
tokens/s against its end-to-end tokens/s, on the default model through the app's real server.

    python benchmarks/live_estimate.py --out docs/results/live-estimate.json          # K = 2, 4, 8 x 64 and 128 tokens

Each case starts a fresh app (``app.main.build_demo`` on the default model, float32, CPU; nothing learned, so its
first estimate is the one a new server gives: a round timed at the run's settings, ``Runtime.round_cost``, plus
the page's share) on a local port and sends the Live tab's ``/generate`` with the page's defaults (the first
example prompt, chat on, adapters and draft chains on, pruning auto) but K and the token count, through
``gradio_client`` (it receives every frame the page would). Per case: the first "about N s" figure, the seconds
from that status line to the finished frame (the run's actual time: prefill, rounds, drawing and sending frames),
their ratio (acceptance: within 2x both ways), and the end stats' model and end-to-end tokens/s (acceptance at
K = 4: end-to-end >= 0.7x model). The client shares this machine's cores with the server: run on a quiet machine.
``--out`` is written after every case and a run with the same ``--out`` skips the cases it holds.
"""

from __future__ import annotations

import argparse
import json
import re
import socket
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ABOUT = re.compile(r"K=\d+ × \d+ tokens: about (\d+) s")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def figure(label: str, html: str) -> float | None:
    found = re.search(re.escape(label) + r"</div><div[^>]*><b>([0-9.]+)</b>", html)
    return float(found.group(1)) if found else None


def case(K: int, tokens: int, model: str = "default") -> dict:
    """One Live run at K x tokens on a fresh app: its first estimate, its actual time and its two speeds."""
    from gradio_client import Client

    from app.host.settings import AppSettings
    from app.main import EXAMPLES, build_demo
    from app.ui.inputs import Inputs

    demo = build_demo(AppSettings(model=model))
    port = free_port()
    demo.launch(prevent_thread_lock=True, server_name="127.0.0.1", server_port=port, quiet=True)
    try:
        defaults = Inputs(EXAMPLES[0])
        values = [getattr(defaults, name) for name in Inputs.__dataclass_fields__]
        values[2], values[11] = K, tokens  # explorers, max_new_tokens (in LIVE's order)
        job = Client(f"http://127.0.0.1:{port}/", verbose=False).submit(*values, api_name="/generate")
        estimate = shown = None
        frames = 0
        for out in job:
            frames += 1
            status = out[-1] or ""
            if estimate is None and ABOUT.search(status):
                estimate, shown = float(ABOUT.search(status)[1]), time.perf_counter()
        actual = time.perf_counter() - shown if shown else None
        final = job.outputs()[-1]
        stats, status = final[3], final[-1]
        assert "data-state='finished'" in status, status
        model = figure("model tokens/s", stats)
        whole = figure("end-to-end tokens/s", stats)
        if whole is None:
            print(stats)
        return {
            "K": K,
            "tokens": tokens,
            "first_estimate_s": estimate,
            "actual_s": round(actual, 2),
            "estimate_over_actual": round(estimate / actual, 3),
            "model_tokens_per_second": model,
            "end_to_end_tokens_per_second": whole,
            "end_to_end_over_model": round(whole / model, 3),
            "frames_received": frames,
        }
    finally:
        demo.close()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--explorers", default="2,4,8")
    parser.add_argument("--tokens", default="64,128")
    parser.add_argument("--model", default="default", help="a model spec (tests: a tiny model's folder)")
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    out = Path(args.out) if args.out else None
    report = json.loads(out.read_text()) if out and out.exists() else {"cases": []}
    done = {(c["K"], c["tokens"]) for c in report["cases"]}
    for K in map(int, args.explorers.split(",")):
        for tokens in map(int, args.tokens.split(",")):
            if (K, tokens) in done:
                continue
            row = case(K, tokens, args.model)
            report["cases"].append(row)
            print(json.dumps(row), flush=True)
            if out:
                out.write_text(json.dumps(report, indent=1) + "\n")
    ratios = [c["estimate_over_actual"] for c in report["cases"]]
    report["within_2x"] = all(0.5 <= r <= 2 for r in ratios)
    k4 = [c["end_to_end_over_model"] for c in report["cases"] if c["K"] == 4]
    report["k4_end_to_end_over_model_min"] = min(k4) if k4 else None
    print(json.dumps({k: v for k, v in report.items() if k != "cases"}))
    if out:
        out.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
