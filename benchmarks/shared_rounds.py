"""Many strangers in one round (issue 61): ``dex serve --http`` under 1, 2, 4 and 8 concurrent clients (locust).

    pip install -e ".[load]"   # locust
    python benchmarks/shared_rounds.py --out docs/results/shared-rounds.json

Starts ``dex serve --http`` on the default model (its own process; K = 4, sequential, the CPU's defaults,
``--max-batch`` the most clients), sends a warm-up request, then drives it with locust (headless, as a library in this
process; its own CPU seconds reported, as it shares the 2 cores) through the same ``--prompts`` streaming chat requests
(the chat set's eval split, greedy, ``--tokens`` new tokens) in each phase: first **one at a time** (one user), then
**c users at once** for each client count c, each user sending the next waiting prompt as soon as its last answer ended
(a closed loop, so c requests stay in flight until the last ones). Per phase: aggregate tokens/s (completion tokens
over the phase's wall time), per-request latency and time to first token (p50, p95), against the one-at-a-time phase
(the same requests), and the share of the phase's wall time before its last request went in (all c clients busy; after
it the phase drains with fewer). 32 prompts by default: with 12, the 8-client phase ran its last 4 requests with at
least half its clients idle. Every answer is checked against HF greedy on the same prompt (through the chat template,
decoded as the server decodes). Beside them: HF ``generate`` on the same prompts in batches of c (left-padded, greedy)
in this process while the server idles, its aggregate tokens/s, what a user would pick instead; the server's tokens per
stage step (``/metrics``: committed tokens over shared rounds x K); and, labelled a projection, what sharing a stage
step among c requests would buy on the GPU check's real-size curves (one stage's layers and head at c x r rows against
c steps of r rows). Not a test: about 50 minutes here.
"""

# ruff: noqa: I001  (locust first: it monkey-patches the standard library)
from __future__ import annotations

from locust import HttpUser, constant
from locust.env import Environment
from locust.exception import StopUser

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import httpx  # noqa: E402
import psutil  # noqa: E402

from baseline import emit  # noqa: E402
from serving_load import _expected, _free_port, _scrape, serve_command  # noqa: E402

CURVE = ROOT / "docs" / "results" / "gpu-check-h200-real-size.json"


def _ask(user: HttpUser, prompt: str, tokens: int) -> dict:
    """One streaming chat request: its text, completion tokens, latency and time to its first token."""
    body = {"model": "default", "messages": [{"role": "user", "content": prompt}], "max_tokens": tokens}
    body |= {"temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    start, first, text, used = time.perf_counter(), None, [], 0
    with user.client.post(
        "/v1/chat/completions", json=body, stream=True, name="chat", catch_response=True
    ) as r:
        for line in r.iter_lines():
            if not line.startswith(b"data: {"):
                continue
            data = json.loads(line[6:])
            for choice in data.get("choices", []):
                piece = choice["delta"].get("content")
                if piece:
                    first = first or time.perf_counter()
                    text.append(piece)
            used = (data.get("usage") or {}).get("completion_tokens", used)
        r.success()
    end = time.perf_counter()
    return {"text": "".join(text), "tokens": used, "start": start, "end": end, "ttft": (first or end) - start}


def _phase(url: str, users: int, prompts: list[str], tokens: int) -> tuple[list[dict], float]:
    """``users`` locust users at once, each sending the next waiting prompt as soon as its last answer ended (a
    closed loop), until every prompt is answered: each request's record (by prompt) and the CPU seconds this process
    (locust) took."""
    records: dict[int, dict] = {}
    waiting = list(range(len(prompts)))

    class Client(HttpUser):
        host, wait_time = url, constant(0)

        def task(self):
            while waiting:
                i = waiting.pop(0)
                records[i] = _ask(self, prompts[i], tokens)
            raise StopUser()

        tasks = [task]

    me = psutil.Process()
    before = sum(me.cpu_times()[:2])
    env = Environment(user_classes=[Client])
    runner = env.create_local_runner()
    runner.start(users, spawn_rate=users)
    while len(records) < len(prompts):
        time.sleep(0.05)
    runner.quit()
    return [records[i] for i in sorted(records)], sum(me.cpu_times()[:2]) - before


def _summary(records: list[dict], alone: list[dict], locust_cpu: float) -> dict:
    wall = max(r["end"] for r in records) - min(r["start"] for r in records)
    tokens = sum(r["tokens"] for r in records)
    lone = sum(r["end"] - r["start"] for r in alone)
    latency = [r["end"] - r["start"] for r in records]
    lone_latency = [r["end"] - r["start"] for r in alone]
    q = statistics.quantiles
    p95 = (lambda v: q(v, n=20, method="inclusive")[18]) if len(records) > 1 else (lambda v: v[0])
    return {
        "requests": len(records),
        "tokens": tokens,
        "wall_seconds": round(wall, 2),
        "aggregate_tokens_per_second": round(tokens / wall, 3),
        "one_at_a_time_tokens_per_second": round(tokens / lone, 3),
        "aggregate_vs_one_at_a_time": round(lone / wall, 3),
        "latency_p50": round(statistics.median(latency), 2),
        "latency_p95": round(p95(latency), 2),
        "lone_latency_p95": round(p95(lone_latency), 2),
        "p95_vs_lone": round(p95(latency) / p95(lone_latency), 3),
        "full_load_share": round(
            (max(r["start"] for r in records) - min(r["start"] for r in records)) / wall, 3
        ),
        "ttft_p50": round(statistics.median(r["ttft"] for r in records), 3),
        "ttft_p95": round(p95([r["ttft"] for r in records]), 3),
        "locust_cpu_seconds": round(locust_cpu, 2),
        "locust_cpu_share_of_a_core": round(locust_cpu / wall, 3),
    }


def _hf_batched(prompts: list[str], tokens: int, size: int) -> dict:
    """HF generate on ``prompts`` in batches of ``size`` (left-padded, greedy, one batch after another): aggregate
    tokens/s, in this process."""
    import torch

    from dex_core import load_model

    model, tokenizer = load_model("default", device="cpu")
    tokenizer.padding_side = "left"
    eos = model.generation_config.eos_token_id
    eos = set(eos if isinstance(eos, list) else [eos])
    made, seconds = 0, 0.0
    for at in range(0, len(prompts), size):
        texts = [
            tokenizer.apply_chat_template(
                [{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True
            )
            for p in prompts[at : at + size]
        ]
        batch = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.inference_mode():
            if not at:
                model.generate(**batch, max_new_tokens=4, do_sample=False)  # warm-up
            start = time.perf_counter()
            out = model.generate(
                **batch, max_new_tokens=tokens, do_sample=False, pad_token_id=tokenizer.pad_token_id
            )
            seconds += time.perf_counter() - start
        new = out[:, batch["input_ids"].shape[1] :]
        made += sum(next((i + 1 for i, t in enumerate(row.tolist()) if t in eos), len(row)) for row in new)
    return {
        "batch": size,
        "tokens": made,
        "seconds": round(seconds, 2),
        "tokens_per_second": round(made / seconds, 3),
    }


def _projection(clients: list[int], rows: float) -> dict:
    """A projection from the GPU check's real-size curves (Llama-2-70B shape, H200): a stage step of c requests at
    ``rows`` rows each against c steps of one, its layers and head only (no host work, no attention growth)."""
    tables = json.loads(CURVE.read_text())["real_size"]["tables"]["Llama-2-70B"]

    def step(n: float) -> float:
        counts = sorted(int(k) for k in tables["layer"])
        at = min((c for c in counts if c >= n), default=counts[-1])
        return (
            10 * tables["layer"][str(at)] + tables["head"][str(at)]
        )  # a K = 8 stage of 80 layers: 10 layers

    return {str(c): round(c * step(rows) / step(c * rows), 2) for c in clients}


def _serve(port: int, most: int) -> subprocess.Popen:
    command = serve_command(port, "--explorers", "4", "--max-batch", str(most), "--queue", "16")
    server = subprocess.Popen(command, cwd=ROOT, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return server
        except httpx.HTTPError:
            time.sleep(0.5)
    server.kill()
    raise RuntimeError("the server did not start")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", default="1,2,4,8")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument(
        "--prompts", type=int, default=32, help="requests each phase answers (the chat set's eval)"
    )
    parser.add_argument(
        "--max-batch", type=int, default=None, help="the server's (default: the most clients)"
    )
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    from dex_core.data.sets import prompt_set

    clients = [int(c) for c in args.clients.split(",")]
    most = max(clients)
    prompts = [p["prompt"] for p in prompt_set("chat", args.prompts)]  # the chat set's eval split
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    server = _serve(port, args.max_batch or most)
    try:
        _phase(url, 1, prompts[:1], 8)  # warm-up
        before = _scrape(url)
        alone, cpu = _phase(url, 1, prompts, args.tokens)
        phases = {"1": _summary(alone, alone, cpu)}
        shared_before = _scrape(url)
        for c in (c for c in clients if c > 1):
            records, cpu = _phase(url, c, prompts, args.tokens)
            phases[str(c)] = _summary(records, alone, cpu)
            phases[str(c)]["identical_to_hf_greedy"] = records
        after = _scrape(url)
    finally:
        server.terminate()
        server.wait(60)
    expected = _expected(prompts, args.tokens)
    for c, phase in phases.items():
        records = phase.pop("identical_to_hf_greedy", alone)
        phase["identical_to_hf_greedy"] = (
            f"{sum(r['text'] == e for r, e in zip(records, expected))}/{len(records)}"
        )
    alone_identical = sum(r["text"] == e for r, e in zip(alone, expected))
    shared_rounds = after["dex:rounds_shared"] - shared_before["dex:rounds_shared"]
    shared_tokens = after["dex:generation_tokens_total"] - shared_before["dex:generation_tokens_total"]
    lone_rounds = shared_before["dex:rounds_shared"] - before["dex:rounds_shared"]
    lone_tokens = shared_before["dex:generation_tokens_total"] - before["dex:generation_tokens_total"]
    report = {
        "model": "default (SmolLM2-135M-Instruct, float32, CPU)",
        "explorers": 4,
        "tokens": args.tokens,
        "max_batch": args.max_batch or most,
        "one_at_a_time_identical_to_hf_greedy": f"{alone_identical}/{len(alone)}",
        "phases": phases,
        "tokens_per_stage_step": {
            "one_at_a_time": round(lone_tokens / max(1, lone_rounds * 4), 3),
            "shared": round(shared_tokens / max(1, shared_rounds * 4), 3),
        },
        "hf_generate_batched": {str(c): _hf_batched(prompts, args.tokens, c) for c in clients},
        "projection_gpu_llama2_70b_h200 (projected, not measured)": _projection(clients, 8),
    }
    emit(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
