"""Stage-sharded loading at a size where it shows: a ~2 GB sharded checkpoint, distributed K=4 on CPU.

    python benchmarks/stage_loading.py --out docs/results/stage-loading.json

Makes a synthetic checkpoint (random Llama weights, float32, 8 layers of hidden 2048, vocabulary 32000, untied
head, saved in ~500 MB safetensors shards with an index; an adapter file with small random adapters and a token
ranking, so the light heads need no data set), then measures, each role in a fresh process:

- parent: ``DexDecoder.from_pretrained(folder, backend="distributed")`` with K=4 CPU explorers. Its peak RSS
  (VmHWM) against its RSS after its imports and the tokenizer, before it loads anything; each rank's peak RSS;
  the files written under its TMPDIR (the group's private folder) and into the DEX cache; the tokens.
- nothing: a process that imports what a rank imports and builds the model's skeleton on the meta device, then
  stops: "a rank that loaded nothing". A rank's growth is its peak RSS minus this one's.
- reference: the whole model in one process: the sequential schedule's tokens and ``ar_generate``'s (float32).
- serve: ``torchrun --nproc-per-node 4 -m dex_core.serving`` on the same checkpoint; its ranks' peak RSS (polled
  from /proc while they run) and the text rank 0 prints.

``dex plan``'s count (``plan.plan_ranks``) is compared with the bytes each rank reports it placed and with the
measured growth. Linux only (/proc).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
K, NEW_TOKENS, ROWS = 4, 16, 8192
PROMPTS = ["w11 w250 w3000 w12 w7 hello world", "the prime number w90 w91 w92 w93 w94 w95 w96 w97"]
CONFIG = dict(
    vocab_size=32000,
    hidden_size=2048,
    intermediate_size=5632,
    num_hidden_layers=8,
    num_attention_heads=16,
    num_key_value_heads=4,
    max_position_embeddings=2048,
    tie_word_embeddings=False,
    bos_token_id=None,
    eos_token_id=None,
    pad_token_id=None,
)
OPTIONS = dict(explorers=K, proposal_vocab=ROWS, prune=1)


def status(pid: int | str = "self") -> dict[str, int]:
    """VmRSS and VmHWM (peak) of a process, in bytes."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            fields[name] = int(value.split()[0]) * 1024
    return fields


def make(folder: Path) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from dex_core.model.adapters import new_adapters, save_adapters
    from dex_core.testing import tiny_tokenizer

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**CONFIG)).eval()
    model.generation_config.eos_token_id = model.generation_config.pad_token_id = None
    model.save_pretrained(folder, max_shard_size="500MB")
    tiny_tokenizer(CONFIG["vocab_size"]).save_pretrained(folder)
    ranking = torch.randperm(CONFIG["vocab_size"], generator=torch.Generator().manual_seed(1))
    save_adapters(
        folder.parent / "adapters.safetensors",
        new_adapters(model, [2, 4, 6], bottleneck=256),
        model,
        {"note": "random, for the loading benchmark"},
        ranking,
    )


def encode(tokenizer) -> list[list[int]]:
    from dex_core import encode_prompt

    return [encode_prompt(tokenizer, p, chat=False) for p in PROMPTS]


def parent(folder: Path, adapters: str) -> dict:
    import torch

    from dex_core import DexDecoder
    from dex_core.model.load import load_tokenizer

    torch.set_num_threads(1)
    ids = encode(load_tokenizer(folder))
    before = status()
    tic = time.perf_counter()
    decoder = DexDecoder.from_pretrained(
        str(folder), backend="distributed", device="cpu", threads=1, adapters=adapters, **OPTIONS
    )
    started = time.perf_counter() - tic
    tokens = [decoder.generate(p, NEW_TOKENS).tokens for p in ids]
    ranks = [status(pid) for pid in decoder.group.pids()]
    report = {
        "rss_before": before["VmRSS"],
        "hwm_before": before["VmHWM"],
        "hwm_after": status()["VmHWM"],
        "start_seconds": started,
        "ranks_hwm": [r["VmHWM"] for r in ranks],
        "placed": [r["bytes"] for r in decoder.group.loaded],
        "depths": list(decoder.depths),
        "tokens": tokens,
        "parent_params_on_meta": all(p.is_meta for p in decoder.view.model.parameters()),
    }
    decoder.close()
    return report


def nothing(folder: Path) -> dict:
    """What a rank imports and builds before it reads a tensor."""
    import torch
    from transformers import AutoConfig

    import dex_core.distributed.rank  # noqa: F401  (the rank's own imports)
    from dex_core.model.stage_load import skeleton

    torch.set_num_threads(1)
    skeleton(AutoConfig.from_pretrained(folder), torch.float32)
    return status()


def reference(folder: Path, adapters: str) -> dict:
    from dex_core import DexDecoder, ar_generate
    from dex_core.model.load import load_model

    model, tokenizer = load_model(str(folder), dtype="float32", device="cpu", log=lambda line: None)
    decoder = DexDecoder(model, tokenizer=tokenizer, adapters=adapters, **OPTIONS)
    ids = encode(tokenizer)
    sequential = [decoder.generate(p, NEW_TOKENS).tokens for p in ids]
    ar = [ar_generate(model, p, NEW_TOKENS).tokens for p in ids]
    return {
        "sequential": sequential,
        "ar": ar,
        "texts": [tokenizer.decode(t, skip_special_tokens=True) for t in ar],
    }


def serve(folder: Path, adapters: str) -> dict:
    import psutil

    torchrun = shutil.which("torchrun", path=os.path.dirname(sys.executable))
    cmd = [
        torchrun,
        "--nproc-per-node",
        str(K),
        "-m",
        "dex_core.serving",
        "--model",
        str(folder),
        "--no-chat",
        "--device",
        "cpu",
        "--threads",
        "1",
        "--adapters",
        adapters,
        "--proposal-vocab",
        str(ROWS),
        "--prune",
        "1",
        "--max-new-tokens",
        str(NEW_TOKENS),
    ] + [a for p in PROMPTS for a in ("--prompt", p)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    peaks: dict[int, int] = {}  # torchrun rank -> peak RSS
    while proc.poll() is None:
        for child in psutil.Process(proc.pid).children(recursive=True):
            try:
                rank = int(child.environ()["RANK"])
                peaks[rank] = max(peaks.get(rank, 0), status(child.pid)["VmHWM"])
            except (OSError, KeyError, ValueError, psutil.Error):
                pass
        time.sleep(0.2)
    out, err = proc.communicate()
    if proc.returncode != 0:
        raise SystemExit(f"dex serve failed:\n{err[-3000:]}")
    lines = out.splitlines()
    answers = [
        next(x for x in reversed(lines[:i]) if x.strip())
        for i, line in enumerate(lines)
        if line.startswith("depths [")
    ]
    return {"ranks_hwm": [peaks.get(k, 0) for k in range(K)], "texts": answers}


def in_child(role: str, folder: Path, adapters: str, env: dict) -> dict:
    """Run ``role`` in a fresh interpreter; its JSON result."""
    cmd = [sys.executable, __file__, "--role", role, "--folder", str(folder), "--adapters", adapters]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    if proc.returncode != 0:
        raise SystemExit(f"role {role} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.splitlines()[-1])


def files_over(root: Path, size: int) -> list[str]:
    return [str(p) for p in root.rglob("*") if p.is_file() and p.stat().st_size > size]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="JSON report")
    parser.add_argument("--role", choices=("parent", "nothing", "reference"), help=argparse.SUPPRESS)
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    parser.add_argument("--adapters", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role:
        result = {"parent": parent, "nothing": nothing, "reference": reference}[args.role](
            Path(args.folder), *([args.adapters] if args.role != "nothing" else [])
        )
        print(json.dumps(result))
        return
    import torch
    from transformers import LlamaConfig

    from dex_core.analysis.plan import plan_ranks

    work = Path(tempfile.mkdtemp(prefix="dex-stage-bench-"))
    try:
        folder, watched, cache = work / "checkpoint", work / "tmp", work / "cache"
        watched.mkdir()
        make(folder)
        adapters = str(work / "adapters.safetensors")
        weights = sum(p.stat().st_size for p in folder.glob("*.safetensors"))
        env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "TMPDIR": str(watched),
            "DEX_CACHE": str(cache),
            "OMP_NUM_THREADS": "1",
        }
        report = {
            "checkpoint_bytes": weights,
            "shards": len(list(folder.glob("*.safetensors"))),
            "K": K,
            "new_tokens": NEW_TOKENS,
            "prompts": len(PROMPTS),
        }
        report["parent"] = in_child("parent", folder, adapters, env)
        report["written"] = files_over(watched, 4096) + (files_over(cache, 0) if cache.exists() else [])
        report["nothing"] = in_child("nothing", folder, adapters, env)
        report["reference"] = in_child("reference", folder, adapters, env)
        report["serve"] = serve(folder, adapters)
        depths = report["parent"]["depths"]
        plans = plan_ranks(LlamaConfig(**CONFIG), depths, torch.float32, 2048, None, adapters, ROWS, 0)
        report["plan_weights"] = [sum(p.weights.values()) for p in plans]
        report["plan_adapters"] = [p.adapter for p in plans]
        summarise(report)
        if args.out:
            Path(args.out).write_text(json.dumps(report, indent=1))
    finally:
        shutil.rmtree(work, ignore_errors=True)


def summarise(r: dict) -> None:
    mb = 1e6
    p, base = r["parent"], r["nothing"]["VmHWM"]
    print(
        f"checkpoint: {r['checkpoint_bytes'] / mb:.0f} MB in {r['shards']} shards; K={r['K']}, depths {p['depths']}"
    )
    print(
        f"parent: peak {p['hwm_after'] / mb:.0f} MB, {(p['hwm_after'] - p['rss_before']) / mb:+.0f} MB over its RSS "
        f"after imports and tokenizer ({p['rss_before'] / mb:.0f} MB); started the group in {p['start_seconds']:.1f} s;"
        f" decoder parameters all on meta: {p['parent_params_on_meta']}"
    )
    print(f"a rank that loaded nothing: peak {base / mb:.0f} MB")
    stage = [
        w + a for w, a in zip(r["plan_weights"], r["plan_adapters"])
    ]  # a rank's bytes: its part, its adapter
    for name, peaks in (("distributed", p["ranks_hwm"]), ("serve", r["serve"]["ranks_hwm"])):
        for k, (peak, plan) in enumerate(zip(peaks, stage)):
            grown = peak - base
            print(
                f"{name} rank {k}: peak {peak / mb:.0f} MB, growth {grown / mb:.0f} MB; its stage (dex plan's "
                f"weights + adapter) {plan / mb:.0f} MB ({(grown / plan - 1) * 100:+.1f}%)"
            )
    print(
        f"bytes placed by the ranks {[round(b / mb, 1) for b in p['placed']]} MB; dex plan's weights "
        f"{[round(b / mb, 1) for b in r['plan_weights']]} MB"
    )
    print(f"files over 4 KB written under TMPDIR and into the DEX cache: {r['written'] or 'none'}")
    ref = r["reference"]
    print(
        f"tokens: distributed == sequential == AR: {p['tokens'] == ref['sequential'] == ref['ar']}; "
        f"serve's text == AR's: {r['serve']['texts'] == ref['texts']}"
    )


if __name__ == "__main__":
    main()
