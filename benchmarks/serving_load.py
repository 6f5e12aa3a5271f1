"""``dex serve --http`` under load (issue 46): many streaming clients at once against a bounded queue.

    python benchmarks/serving_load.py --out docs/results/serving-load.json

Starts ``dex serve --http`` on the default model (a process of its own; K = 4, sequential, ``--queue 8``) and
sends one warm-up request; the server's RSS then is its idle figure. Then ``--clients`` streaming chat clients
(the ``openai`` client, one thread each, the builtin prompts) start at once: one runs, ``--queue`` wait, and every
one beyond gets 429. Reports, per client, its status and seconds to the answer (or the refusal), and checks every
admitted client's text against HF greedy on the same prompt (``hf_greedy`` through the chat template, decoded as
the server decodes). Then a client that leaves: a long streaming request whose client drops its connection after
its first chunk; the seconds from the drop until ``/metrics`` says nothing runs, against the run's seconds per
round (the rounds it had run and its time, from the same scrape). Last, the server's RSS after the load against
the idle figure. Not a test: about two minutes on this CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _scrape(url: str) -> dict:
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{url}/metrics", timeout=10).text
    return {
        s.name: s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if not s.labels
    }


def serve_command(port: int, *flags: str) -> list[str]:
    """``dex serve --http`` on the default model on the CPU at ``port``, 256 new tokens at most, with ``flags``."""
    command = [
        sys.executable,
        "-m",
        "dex_core.cli",
        "serve",
        "--http",
        f"127.0.0.1:{port}",
        "--model",
        "default",
    ]
    return command + ["--max-new-tokens", "256", "--device", "cpu", *flags]


def _stream(client, prompt: str, tokens: int) -> tuple[str, float, str]:
    """One streaming chat request: (its text, seconds to its end, its status: 'ok' or the refusal's code)."""
    import openai

    start = time.monotonic()
    try:
        chunks = client.chat.completions.create(
            model="default",
            messages=[{"role": "user", "content": prompt}],
            max_tokens=tokens,
            temperature=0,
            stream=True,
        )
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        return text, time.monotonic() - start, "ok"
    except openai.APIStatusError as err:
        return "", time.monotonic() - start, str(err.status_code)


def _expected(prompts: list[str], tokens: int) -> list[str]:
    from dex_core import hf_greedy, load_model
    from dex_core.runtime.request import chat_ids

    model, tokenizer = load_model("default", device="cpu")
    answers = []
    for prompt in prompts:
        ids = chat_ids(tokenizer, [{"role": "user", "content": prompt}], generation_prompt=True)
        answers.append(tokenizer.decode(hf_greedy(model, ids, tokens), skip_special_tokens=True))
    return answers


def _load(url: str, prompts: list[str], tokens: int) -> list[dict]:
    from openai import OpenAI

    client = OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=600)
    results = [None] * len(prompts)

    def one(i):
        results[i] = _stream(client, prompts[i], tokens)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [{"status": s, "seconds": round(sec, 3), "text": text} for text, sec, s in results]


def _drop(url: str, tokens: int) -> dict:
    """A streaming client that leaves after its first chunk: seconds until nothing runs, against a round's."""
    body = {"model": "default", "prompt": "Write a long story about a lighthouse.", "max_tokens": tokens}
    before = _scrape(url)
    with httpx.stream("POST", f"{url}/v1/completions", json={**body, "stream": True}, timeout=120) as reply:
        lines = reply.iter_lines()
        next(lines)
        for _ in range(4):  # a few tokens in: it runs
            next(lines)
        dropped = time.monotonic()
    while _scrape(url)["dex:num_requests_running"] > 0:
        time.sleep(0.002)
    freed = time.monotonic() - dropped
    after = _scrape(url)
    rounds = after["dex:rounds_total"] - before["dex:rounds_total"]
    seconds = after["dex:e2e_request_latency_seconds_sum"] - before["dex:e2e_request_latency_seconds_sum"]
    return {
        "freed_seconds": round(freed, 4),
        "rounds_run": rounds,
        "seconds_per_round": round(seconds / max(1, rounds), 4),
        "tokens_asked": tokens,
        "tokens_made": after["dex:generation_tokens_total"] - before["dex:generation_tokens_total"],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--queue", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--explorers", type=int, default=4)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    from dex_core.data.sets import builtin_prompts

    prompts = [p["prompt"] for p in builtin_prompts()][: args.clients]
    prompts += prompts[: args.clients - len(prompts)]
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    command = serve_command(port, "--explorers", str(args.explorers), "--queue", str(args.queue))
    server = subprocess.Popen(command, cwd=ROOT, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.5)
        proc = psutil.Process(server.pid)
        _load(url, prompts[:1], args.tokens)  # warm-up: the first run's one-off costs are in the idle figure
        idle = proc.memory_info().rss
        tic = time.monotonic()
        results = _load(url, prompts, args.tokens)
        load_seconds = time.monotonic() - tic
        peak = proc.memory_info().rss
        expected = _expected(prompts, args.tokens)
        drop = _drop(url, 200)
        time.sleep(1)
        end = proc.memory_info().rss
    finally:
        server.terminate()
        server.wait(60)
    admitted = [r for r in results if r["status"] == "ok"]
    refused = [r for r in results if r["status"] != "ok"]
    report = {
        "model": "default (SmolLM2-135M-Instruct, float32, CPU)",
        "explorers": args.explorers,
        "queue": args.queue,
        "clients": args.clients,
        "tokens": args.tokens,
        "admitted": len(admitted),
        "identical_to_hf_greedy": sum(
            r["text"] == e for r, e in zip(results, expected) if r["status"] == "ok"
        ),
        "refused": {
            status: sum(r["status"] == status for r in refused) for status in {r["status"] for r in refused}
        },
        "refusal_seconds_max": max((r["seconds"] for r in refused), default=None),
        "admitted_seconds": [r["seconds"] for r in admitted],
        "load_seconds": round(load_seconds, 2),
        "client_that_leaves": drop,
        "rss_mb": {
            "idle": round(idle / 2**20, 1),
            "after_load": round(peak / 2**20, 1),
            "end": round(end / 2**20, 1),
        },
        "rss_end_minus_idle_mb": round((end - idle) / 2**20, 1),
    }
    print(json.dumps(report, indent=1))
    if args.out:
        args.out.write_text(json.dumps(report, indent=1) + "\n")
    ok = report["identical_to_hf_greedy"] == len(admitted) == 1 + args.queue
    ok = ok and len(refused) == args.clients - len(admitted) and report["rss_end_minus_idle_mb"] <= 120
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
