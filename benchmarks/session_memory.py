"""What visitors' traces cost the server's process tree, and what comes back when their tabs close (issue 62).

    python benchmarks/session_memory.py --out docs/results/session-memory.json

Serves the app as ``python app/main.py`` does (the system allocator, two arenas; Gradio's heartbeat every
``--heartbeat`` seconds, 15 its default: a closed client is noticed at the next one) on a tiny model, and reads the
memory of its process tree every 100 ms: the server's RSS plus its descendants' unique memory (the trace worker's
helper and its workers; ``hostile_upload.tree_memory``). From a fresh server, before any upload:

1. four sessions (``gradio_client`` clients, one visitor) each load a ``--mb`` MB DEX trace and draw it as the page
   does, then close; the tree's figure before them, while they hold it, how long until it is back within 120 MB of
   the figure before them, and its figure 60 s after they closed; the helper's resident and unique memory;
2. the same four sessions again, on the warm server;
3. one session loads a DEX trace of ``--rounds`` rounds (``trace_replay.py`` builds it), which the round cap
   refuses, and closes: the tree's peak growth while it is read, and its growth at the answer and 60 s after.

Issue 62 asks: back within 120 MB within 60 s, and an 8,000-round trace grows the tree < 200 MB. Not a test:
a few minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import psutil
from hostile_upload import helper_memory, tree_memory, valid_trace

ROOT = Path(__file__).resolve().parents[1]
WITHIN = 120 * 2**20  # bytes the tree may stay above its figure before the sessions
SETTLE_SECONDS = 60


class Sampler(threading.Thread):
    """The tree's memory every 100 ms until stopped: [(time, bytes)]."""

    def __init__(self, server: psutil.Process):
        super().__init__(daemon=True)
        self.server, self.samples, self.running = server, [], True

    def run(self):
        while self.running:
            self.samples.append((time.monotonic(), tree_memory(self.server)))
            time.sleep(0.1)

    def peak(self, start: float) -> int:
        return max(b for t, b in self.samples if t >= start)


def _visit(url: str, trace: Path):
    """A session that loads ``trace`` and draws it as the page does; (the open client, its status line)."""
    from gradio_client import Client, handle_file

    client = Client(url, verbose=False, download_files=False)
    control, status, _ = client.predict(handle_file(str(trace)), api_name="/load")
    if "data-state='error'" not in status:
        client.predict(
            control["value"] if isinstance(control, dict) else control, "ok", api_name="/after_load"
        )
    return client, re.sub(r"<[^>]+>", "", status)[:170]


def _settle(server: psutil.Process, before: int) -> tuple[float | None, int]:
    """Seconds until the tree was first within ``WITHIN`` of ``before`` (None: not within ``SETTLE_SECONDS``), and
    its figure ``SETTLE_SECONDS`` after the start."""
    start, within = time.monotonic(), None
    while time.monotonic() - start < SETTLE_SECONDS:
        if within is None and tree_memory(server) - before <= WITHIN:
            within = round(time.monotonic() - start, 1)
        time.sleep(0.5)
    return within, tree_memory(server)


def four_sessions(url: str, server: psutil.Process, trace: Path) -> dict:
    before = tree_memory(server)
    clients = [_visit(url, trace)[0] for _ in range(4)]
    held = tree_memory(server)
    for client in clients:
        client.close()
    seconds, after = _settle(server, before)
    return {
        "before_mb": round(before / 2**20),
        "held_growth_mb": round((held - before) / 2**20),
        "seconds_to_within_120_mb": seconds,
        f"growth_{SETTLE_SECONDS}_s_after_close_mb": round((after - before) / 2**20),
        "helper": helper_memory(server),
    }


def long_trace(url: str, server: psutil.Process, sampler: Sampler, trace: Path) -> dict:
    before, start = tree_memory(server), time.monotonic()
    client, status = _visit(url, trace)
    seconds, answered = time.monotonic() - start, tree_memory(server)
    client.close()
    time.sleep(SETTLE_SECONDS)
    return {
        "file_mb": round(trace.stat().st_size / 2**20, 1),
        "status": status,
        "seconds": round(seconds, 2),
        "peak_growth_mb": round((sampler.peak(start) - before) / 2**20),
        "growth_at_answer_mb": round((answered - before) / 2**20),
        f"growth_{SETTLE_SECONDS}_s_after_close_mb": round((tree_memory(server) - before) / 2**20),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=19.0, help="size of each session's trace")
    parser.add_argument("--rounds", type=int, default=8000, help="rounds of the long trace")
    parser.add_argument("--heartbeat", type=float, default=15.0, help="Gradio's heartbeat, seconds")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    from dex_core.testing import save_tiny

    work = Path(tempfile.mkdtemp(prefix="dex-sessions-"))
    model = save_tiny(work / "tiny")
    trace, rounds = valid_trace(work / "trace.json", args.mb), work / "rounds.json"
    subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "trace_replay.py"), "--rounds", str(args.rounds)]
        + ["--build", str(rounds)],
        check=True,
    )
    with socket.create_server(("127.0.0.1", 0)) as probe:
        port = probe.getsockname()[1]
    env = {
        **os.environ,
        "GRADIO_TEMP_DIR": str(work / "gradio"),
        "GRADIO_HEARTBEAT_INTERVAL": str(args.heartbeat),
    }
    proc = subprocess.Popen(
        [sys.executable, "app/main.py", "--model", str(model), "--port", str(port)], env=env, cwd=ROOT
    )
    url = f"http://127.0.0.1:{port}/"
    try:
        while not _answers(url):
            if proc.poll() is not None:
                raise SystemExit("the app did not start")
            time.sleep(0.5)
        server = psutil.Process(proc.pid)
        sampler = Sampler(server)
        sampler.start()
        report = {
            "trace_mb": round(trace.stat().st_size / 2**20, 1),
            "heartbeat_s": args.heartbeat,
            "load_average": os.getloadavg(),
            "fresh": four_sessions(url, server, trace),
            "warm": four_sessions(url, server, trace),
            "long_trace": long_trace(url, server, sampler, rounds),
            "load_average_end": os.getloadavg(),
        }
        sampler.running = False
    finally:
        proc.terminate()
        proc.wait(60)
    print(json.dumps(report, indent=2))
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    return 0


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


if __name__ == "__main__":
    sys.exit(main())
