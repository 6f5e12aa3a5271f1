"""Adapter training where the model lives, at a size where memory shows: the ~2 GB synthetic checkpoint of
``benchmarks/stage_loading.py`` (random Llama weights, float32, 8 layers of hidden 2048, vocabulary 32000), K = 4.

    python benchmarks/train_ranks.py --out docs/results/train-ranks.json
    python benchmarks/train_ranks.py --explorers 2 --out docs/results/train-ranks-k2.json

Each role runs in a fresh process:
- parent: ``TrainingGroup`` (what ``train_distributed`` and ``dex train-adapters --backend distributed`` start) with
  K CPU ranks training adapters at depths 2, 4, 6 (one inside each non-final stage; m = 2h) on given random token
  windows (the random model has no text to learn; the windows keep rank 0 from reading a data set) for
  ``--steps`` steps of one 192-token window. Its peak RSS (VmHWM) against its RSS after its imports and the
  model's tokenizer; each rank's peak RSS, read before the ranks end; the run's tokens/s.
- nothing: a process that imports what a training rank imports and builds the model's skeleton on the meta device:
  "a rank that loaded nothing". A rank's growth is its peak RSS minus this one's, set against ``dex plan --train``'s
  count for that rank (``plan_train.plan_training``: its part, its adapters, their gradients and AdamW state, one
  micro-batch's activations and the teacher's targets).
- single: the same training in one process holding the whole model (``train_adapters``), its tokens/s and peak RSS,
  with every core and with one thread (what one rank of a 2-rank run gets here: K devices against one).

Tokens/s are side by side on this machine (``nproc`` cores: the ranks share them; on K GPUs each has its own).
Linux only (/proc).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from stage_loading import CONFIG, make, status  # noqa: E402  (the same synthetic checkpoint)

ROOT = Path(__file__).resolve().parents[1]
DEPTHS, SEQ = (2, 4, 6), 192


def train_config(steps: int):
    from dex_core.training.train import TrainConfig

    return TrainConfig(depths=DEPTHS, tokens=steps * SEQ, seq_len=SEQ, batch=1, bf16=False)


def windows(steps: int):
    import torch

    return torch.randint(0, CONFIG["vocab_size"], (steps, SEQ), generator=torch.Generator().manual_seed(0))


def ranking():
    import torch

    return torch.randperm(CONFIG["vocab_size"], generator=torch.Generator().manual_seed(1))


def parent(folder: Path, steps: int, K: int) -> dict:
    import torch
    from transformers import AutoConfig

    from dex_core import DecoderOptions
    from dex_core.model.checkpoint import Checkpoint
    from dex_core.model.load import load_tokenizer
    from dex_core.model.stage_load import checkpoint_identity, skeleton
    from dex_core.training.group import TrainingGroup
    from dex_core.training.ranks import OP_TIMEOUT, make_job

    torch.set_num_threads(1)
    load_tokenizer(folder)
    before = status()
    config = AutoConfig.from_pretrained(folder)
    identity = checkpoint_identity(config, Checkpoint(folder))
    out = folder.parent / "trained.safetensors"
    job = make_job(
        train_config(steps), config, identity, K, "cpu", out, windows=windows(steps), ranking=ranking()
    )
    options = DecoderOptions(devices=("cpu",) * K, op_timeout=OP_TIMEOUT)
    tic = time.perf_counter()
    group = TrainingGroup(job, skeleton(config, torch.float32, folder), options, folder)
    started = time.perf_counter() - tic
    facts = group.train(progress=False)
    ranks = [status(pid) for pid in group.pids()]
    group.close()
    return {
        "rss_before": before["VmRSS"],
        "hwm_after": status()["VmHWM"],
        "start_seconds": started,
        "ranks_hwm": [r["VmHWM"] for r in ranks],
        "ranks_loaded_hwm": [r["loaded_peak_kib"] * 1024 for r in group.loaded],
        "facts": facts,
    }


def nothing(folder: Path, steps: int, K: int) -> dict:
    """What a training rank imports and builds before it reads a tensor."""
    import torch
    from transformers import AutoConfig

    import dex_core.training.group  # noqa: F401  (a training rank's own imports)
    from dex_core.model.stage_load import skeleton

    torch.set_num_threads(1)
    skeleton(AutoConfig.from_pretrained(folder), torch.float32)
    return status()


def single(folder: Path, steps: int, K: int, threads: int | None = None) -> dict:
    import itertools

    import torch

    from dex_core import load_model
    from dex_core.training.train import train_adapters

    if threads:
        torch.set_num_threads(threads)
    model, _ = load_model(str(folder), dtype="float32", device="cpu")
    out = folder.parent / "single.safetensors"
    stream = itertools.cycle(list(windows(steps)))
    facts = train_adapters(
        model, None, train_config(steps), out, progress=False, windows=stream, ranking=ranking()
    )
    return {"hwm": status()["VmHWM"], "facts": facts, "threads": torch.get_num_threads()}


ROLES = {
    "parent": parent,
    "nothing": nothing,
    "single": single,
    "single-1": lambda folder, steps, K: single(folder, steps, K, threads=1),  # one core: one rank's share
}


def in_child(role: str, folder: Path, steps: int, K: int, env: dict) -> dict:
    cmd = [sys.executable, __file__, "--role", role, "--folder", str(folder), "--steps", str(steps)]
    cmd += ["--explorers", str(K)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    if proc.returncode != 0:
        raise SystemExit(f"role {role} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.splitlines()[-1])


def planned(steps: int, K: int) -> list[dict]:
    import torch
    from transformers import LlamaConfig

    from dex_core.training.plan import plan_training

    cfg = train_config(steps)
    plans = plan_training(LlamaConfig(**CONFIG), K, torch.float32, DEPTHS, cfg.batch, cfg.seq_len)
    return [
        {
            "weights": sum(p.weights.values()),
            "adapters": p.adapters + p.optimizer,
            "activations": p.activations + p.teacher,
            "total": p.total,
        }
        for p in plans
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="JSON report")
    parser.add_argument("--steps", type=int, default=8, help="optimizer steps of one 192-token window")
    parser.add_argument(
        "--explorers", type=int, default=4, help="training ranks K (adapters at 2, 4, 6 whatever K)"
    )
    parser.add_argument("--role", choices=tuple(ROLES), help=argparse.SUPPRESS)
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role:
        print(json.dumps(ROLES[args.role](Path(args.folder), args.steps, args.explorers)))
        return
    with tempfile.TemporaryDirectory(prefix="dex-train-bench-") as work:
        report = measure(Path(work), args.steps, args.explorers)
    summarise(report)
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1))


def measure(work: Path, steps: int, K: int) -> dict:
    folder = work / "checkpoint"
    make(folder)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(work)}
    return {
        "checkpoint_bytes": sum(p.stat().st_size for p in folder.glob("*.safetensors")),
        "K": K,
        "depths": DEPTHS,
        "steps": steps,
        "cores": os.cpu_count(),
        "parent": in_child("parent", folder, steps, K, env),
        "nothing": in_child("nothing", folder, steps, K, env),
        "single": in_child("single", folder, steps, K, env),
        "single_one_thread": in_child("single-1", folder, steps, K, env),
        "plan": planned(steps, K),
    }


def summarise(r: dict) -> None:
    mb, p, base = 1e6, r["parent"], r["nothing"]["VmHWM"]
    print(f"checkpoint: {r['checkpoint_bytes'] / mb:.0f} MB; K={r['K']} ranks, adapters at {r['depths']}")
    print(
        f"parent: peak {p['hwm_after'] / mb:.0f} MB, {(p['hwm_after'] - p['rss_before']) / mb:+.0f} MB over its RSS "
        f"after imports and tokenizer ({p['rss_before'] / mb:.0f} MB); started the ranks in {p['start_seconds']:.1f} s"
    )
    print(f"a rank that loaded nothing: peak {base / mb:.0f} MB")
    for k, (peak, plan) in enumerate(zip(p["ranks_hwm"], r["plan"])):
        grown = peak - base
        print(
            f"rank {k}: peak {peak / mb:.0f} MB, growth {grown / mb:.0f} MB; dex plan --train: "
            f"{plan['total'] / mb:.0f} MB (weights {plan['weights'] / mb:.0f}, adapters+grad+AdamW "
            f"{plan['adapters'] / mb:.0f}, one "
            f"micro-batch {plan['activations'] / mb:.0f}): {(grown / plan['total'] - 1) * 100:+.1f}%"
        )
    threads = r["single"]["threads"]
    for name, facts in (
        (f"distributed, K={r['K']} ranks of {max(1, r['cores'] // r['K'])} thread(s)", p["facts"]),
        (f"single process, {threads} threads", r["single"]["facts"]),
        ("single process, 1 thread (one rank's share of this CPU)", r["single_one_thread"]["facts"]),
    ):
        rate = facts["tokens"] / facts["seconds"] if facts["seconds"] else float("nan")
        seconds, loss = facts["seconds"], facts["final_loss"]
        print(f"{name}: {facts['tokens']} tokens in {seconds:.1f} s, {rate:.0f} tokens/s, loss {loss}")
    print(f"single process: peak {r['single']['hwm'] / mb:.0f} MB (the whole model)")


if __name__ == "__main__":
    main()
