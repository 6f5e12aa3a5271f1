"""What hostile HTTP clients cost everyone else (issue 62): the longest wait for ``GET /health`` during a burst.

    python benchmarks/hostile_http.py [--requests 100] [--out docs/results/hostile-http.json]

Serves ``dex serve --http`` on a tiny random Llama in a process of its own and sends ``--requests`` hostile
requests, ``--workers`` at a time, cycling through ``KINDS`` (what issue 62 probed): JSON nested 2,000 deep, a body past
the 4 MiB bound (declared, and streamed without a length), 100,000 empty chat messages, a prompt longer than
the context, a body cut off mid-way, a head that never ends, bytes that are not HTTP. Meanwhile another client
asks ``/health`` every 20 ms. Reports the longest and the 99th-percentile wait, the number of asks and of
failed ones, and each kind's answers (a status, or ``closed``). The suite runs the same burst against its
in-process servers (``tests/serving/test_serving.py``, ``tests/app/test_app_hostile.py``) and bounds the
longest wait at 1.0 s; the issue's bound on a quiet machine is 0.3 s.
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
SERVED = "tiny-llama"


def _raw(url: str, data: bytes, close: bool = True) -> str:
    """Send ``data`` on a connection of its own; what came back first (a status) or ``closed``. With ``close``
    False the connection is left open and unanswered until the server ends it."""
    host, port = url.removeprefix("http://").split("/")[0].split(":")
    with socket.create_connection((host, int(port)), timeout=30) as conn:
        conn.sendall(data)
        if close:
            return "sent"
        answer = conn.recv(64)
    return answer.split(b" ")[1].decode() if answer.startswith(b"HTTP/") else "closed"


def _post(url: str, path: str, **kw) -> str:
    return str(httpx.post(f"{url}{path}", timeout=60, **kw).status_code)


def _head(path: str, length: int) -> bytes:
    head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    return f"{head}Content-Length: {length}\r\n\r\n".encode()


KINDS = {
    "nested 2,000 deep": lambda url, model: _post(
        url,
        "/v1/completions",
        content=b'{"model":"%s","prompt":' % model.encode() + b"[" * 2000 + b"]" * 2000 + b"}",
    ),
    "4 MiB + 1 declared": lambda url, model: _post(url, "/v1/completions", content=b" " * (4 * 2**20 + 1)),
    "5 MiB streamed": lambda url, model: _post(url, "/v1/completions", content=iter([b" " * 2**20] * 5)),
    "100,000 empty messages": lambda url, model: _post(
        url,
        "/v1/chat/completions",
        json={"model": model, "messages": [{"role": "user", "content": ""}] * 100_000},
    ),
    "prompt past the context": lambda url, model: _post(
        url, "/v1/completions", json={"model": model, "prompt": "prime " * 5000, "max_tokens": 4}
    ),
    "cut-off body": lambda url, model: _raw(url, _head("/v1/completions", 1000) + b'{"model":'),
    "head never ends": lambda url, model: _raw(
        url, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n", close=False
    ),
    "not HTTP": lambda url, model: _raw(url, b"\x16\x03\x01 not http at all\r\n\r\n", close=False),
}


def health_during(url: str, requests: int = 100, workers: int = 8, health: str = "/health") -> dict:
    """Send ``requests`` hostile requests to the server at ``url`` (``KINDS`` in turn, ``workers`` at a time) while
    another client asks ``health`` every 20 ms; the waits and each kind's answers."""
    waits, failed, answers, done = [], [], {}, threading.Event()

    def ask():
        with httpx.Client(timeout=30) as client:
            while not done.is_set():
                start = time.monotonic()
                status = client.get(f"{url}{health}").status_code
                waits.append(time.monotonic() - start)
                if status != 200:
                    failed.append(status)
                time.sleep(0.02)

    names = list(KINDS)
    model = httpx.get(f"{url}/v1/models", timeout=30).json()["data"][0]["id"]
    asking = threading.Thread(target=ask, daemon=True)
    asking.start()
    with ThreadPoolExecutor(workers) as pool:
        for name, answer in zip(
            (names[i % len(names)] for i in range(requests)),
            pool.map(lambda i: KINDS[names[i % len(names)]](url, model), range(requests)),
        ):
            answers.setdefault(name, {}).setdefault(answer, 0)
            answers[name][answer] += 1
    done.set()
    asking.join(60)
    ordered = sorted(waits)
    return {
        "requests": requests,
        "health_asks": len(waits),
        "health_failures": len(failed),
        "longest_wait_s": round(ordered[-1], 4),
        "p99_wait_s": round(ordered[int(0.99 * (len(ordered) - 1))], 4),
        "answers": answers,
    }


def serve(folder: Path, port: int) -> subprocess.Popen:
    """``dex serve --http`` on a tiny random Llama saved in ``folder``."""
    from dex_core.testing import save_tiny

    save_tiny(folder)
    command = [
        sys.executable,
        "-m",
        "dex_core.cli",
        "serve",
        "--model",
        str(folder),
        "--explorers",
        "3",
        "--queue",
        "0",
    ]
    return subprocess.Popen([*command, "--http", f"127.0.0.1:{port}", "--max-new-tokens", "16"], cwd=ROOT)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=100)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--out", type=Path, help="write the figures as JSON here too")
    args = parser.parse_args(argv)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory() as folder:
        server = serve(Path(folder), port)
        try:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                try:
                    if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    time.sleep(0.2)
            result = health_during(url, args.requests, args.workers)
        finally:
            server.terminate()
            server.wait(30)
    print(json.dumps(result, indent=2))
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
