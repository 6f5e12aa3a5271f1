"""What a hostile trace upload costs the app (issue 41): memory and other visitors' waits.

    python benchmarks/hostile_upload.py --out docs/results/hostile-upload.json

Serves the app on a tiny model in a process of its own (``AppSettings``, the sequential backend, the host's upload
limit) and, as visitors would through ``gradio_client``, loads into the Debugger: a small DEX trace (which starts the
trace worker's forkserver: the baseline includes it), then a file of ``--mb`` MB that is a trace of ``{}`` events
(each costs Python 64 bytes for its 3 of JSON), then three such files at once, then a valid trace of ``--valid-mb``.
Sampled every 20 ms throughout: the memory of the server and its workers together (the server's RSS plus its
descendants' unique memory, so pages a forked worker shares are counted once) and, from another visitor, the
wait for the page's configuration (``GET /config``, answered on the server's event loop). Reports, per upload,
the peak growth over the baseline as a multiple of the file, the longest wait while it was read, the seconds to
the answer, and the seconds until memory came back within 120 MB of the baseline. Not a test: about a minute.
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
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import psutil

ROOT = Path(__file__).resolve().parents[1]
SERVE = """
import sys, time
from app.main import UPLOAD_LIMIT, build_demo
from app.host.settings import AppSettings
bounds = dict(upload_mb=1024, visitor_upload_mb=1024)  # raised: this measures memory, not the upload shares
demo = build_demo(AppSettings(model=sys.argv[1], explorers=3, backend="sequential", **bounds))
demo.launch(prevent_thread_lock=True, server_name="127.0.0.1", server_port=int(sys.argv[2]), max_file_size=UPLOAD_LIMIT)
print("READY", flush=True)
while True:
    time.sleep(60)
"""


def _memory(server: psutil.Process) -> int:
    total = server.memory_info().rss
    for child in server.children(recursive=True):
        try:
            total += child.memory_full_info().uss
        except psutil.Error:
            pass
    return total


class Watch(threading.Thread):
    """Samples memory and another visitor's wait every 20 ms until stopped: [(time, bytes, wait seconds)]."""

    def __init__(self, server: psutil.Process, url: str):
        super().__init__(daemon=True)
        self.server, self.url, self.samples, self.running = server, url, [], True

    def run(self):
        with httpx.Client(timeout=60) as client:
            while self.running:
                start = time.monotonic()
                try:
                    client.get(self.url + "config")
                except httpx.HTTPError:  # the server is stopping
                    return
                wait = time.monotonic() - start
                self.samples.append((time.monotonic(), _memory(self.server), wait))
                time.sleep(0.02)


def _load(url: str, path: Path) -> str:
    """Load ``path`` in a fresh session."""
    from gradio_client import Client, handle_file

    client = Client(url, verbose=False, download_files=False)
    try:
        _, status, _ = client.predict(handle_file(str(path)), api_name="/load")
    finally:
        client.close()
    return status


def _measure(watch: Watch, url: str, files: list[Path], baseline: int) -> dict:
    start = time.monotonic()
    with ThreadPoolExecutor(len(files)) as pool:
        statuses = list(pool.map(lambda p: _load(url, p), files))
    done = time.monotonic()
    back = None
    while time.monotonic() - done < 60:
        if watch.samples and watch.samples[-1][1] - baseline <= 120 * 2**20:
            back = max(0.0, watch.samples[-1][0] - done)
            break
        time.sleep(0.1)
    during = [s for s in watch.samples if start <= s[0] <= done]
    size = files[0].stat().st_size
    peak = max(s[1] for s in during) - baseline
    return {
        "files": len(files),
        "file_mb": round(size / 2**20, 1),
        "refused": ["data-state='error'" in s for s in statuses],
        "status": re.sub(r"<[^>]+>", "", statuses[0])[:170] if statuses else "",
        "seconds": round(done - start, 2),
        "peak_growth_mb": round(peak / 2**20),
        "peak_growth_per_file_byte": round(peak / size, 2),
        "longest_other_wait_s": round(max(s[2] for s in during), 3),
        "median_other_wait_s": round(sorted(s[2] for s in during)[len(during) // 2], 4),
        "seconds_to_within_120_mb": None if back is None else round(back, 2),
    }


def hostile_trace(path: Path, megabytes: float) -> Path:
    from dex_core import TRACE_VERSION

    head = json.dumps({"format": "dex-trace", "version": TRACE_VERSION, "meta": {}})[:-1] + ', "events": ['
    count = int((megabytes * 2**20 - len(head)) / 3)
    path.write_text(head + ",".join(["{}"] * count) + "]}")
    return path


def valid_trace(path: Path, megabytes: float) -> Path:
    from dex_core import DexDecoder, save_trace
    from dex_core.testing import tiny_model, tiny_tokenizer

    decoder = DexDecoder(
        tiny_model("llama", layers=8, max_position_embeddings=4096),
        explorers=8,
        tokenizer=tiny_tokenizer(),
        trace_top=5,
        prune=None,
    )
    tokens = 40
    for _ in range(4):
        save_trace(path, decoder.generate([1, 2, 3, 4], tokens).trace, {"model": "tiny"})
        ratio = megabytes * 2**20 / path.stat().st_size
        if 0.8 < ratio < 1.25:
            break
        tokens = max(10, min(4000, int(tokens * ratio)))
    return path


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=63.0, help="size of the hostile file")
    parser.add_argument("--valid-mb", type=float, default=10.0, help="size of the valid trace")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    from dex_core.testing import tiny_model, tiny_tokenizer

    work = Path(tempfile.mkdtemp(prefix="dex-hostile-"))
    model = work / "tiny"
    tiny_model("llama").save_pretrained(model)
    tiny_tokenizer().save_pretrained(model)
    small, valid = valid_trace(work / "small.json", 0.5), valid_trace(work / "valid.json", args.valid_mb)
    hostile = [hostile_trace(work / f"hostile{i}.json", args.mb) for i in range(3)]
    with socket.create_server(("127.0.0.1", 0)) as probe:
        number = probe.getsockname()[1]
    env = {
        **os.environ,
        "GRADIO_TEMP_DIR": str(work / "gradio"),
        "PYTHONMALLOC": "malloc",
        "PYTHONPATH": str(ROOT),
    }
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVE, str(model), str(number)], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        while "READY" not in proc.stdout.readline():
            if proc.poll() is not None:
                raise SystemExit("the app did not start")
        url = f"http://127.0.0.1:{number}/"
        server = psutil.Process(proc.pid)
        watch = Watch(server, url)
        watch.start()
        _load(url, small)  # the forkserver starts; everything is imported
        time.sleep(2)
        baseline = _memory(server)
        report = {"baseline_mb": round(baseline / 2**20)}
        report["hostile_one"] = _measure(watch, url, hostile[:1], baseline)
        report["hostile_three_at_once"] = _measure(watch, url, hostile, baseline)
        report["valid"] = _measure(watch, url, [valid], baseline)
        watch.running = False
    finally:
        proc.terminate()
        proc.wait(30)
    print(json.dumps(report, indent=2))
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
