"""Adapter training where the model lives (``dex_core.training.ranks``): K real rank processes over gloo, each
holding one stage and training the adapters inside it, against single-process training of the same float64 model;
checkpoints per rank, Ctrl-C, a dying rank; the torchrun launch and the CLI; ``dex plan --train``."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import psutil
import pytest
import torch
from safetensors.torch import load_file

from dex_core import DexError
from dex_core.distributed.group import ExplorerError
from dex_core.model.adapters import read_metadata
from dex_core.model.view import model_view
from dex_core.testing import CLASSES, tiny_model
from dex_core.training.distill import stage_forward
from dex_core.training.group import train_distributed
from dex_core.training.ranks import make_job
from dex_core.training.train import TrainConfig, train_adapters

WINDOWS = torch.randint(0, 96, (5, 16), generator=torch.Generator().manual_seed(0))
RANKING = torch.randperm(96, generator=torch.Generator().manual_seed(1))


def config(**overrides) -> TrainConfig:
    base = dict(
        depths="all", tokens=16 * 2 * 2 * 4, seq_len=16, batch=2, accum=2, bf16=False, checkpoint_every=2
    )
    return TrainConfig(**(base | overrides))


def one_process(model, cfg, tmp_path) -> dict:
    """Single-process training's adapters (float64, from its checkpoint) for ``cfg`` on ``WINDOWS``."""
    ckpt = tmp_path / "one.ckpt"
    windows = itertools.cycle(list(WINDOWS))
    train_adapters(model, None, cfg, tmp_path / "one.safetensors", ckpt, False, windows, RANKING)
    return torch.load(ckpt, weights_only=True)["adapters"]


def rank_adapters(folder) -> dict:
    """Every rank's adapters from a checkpoint folder (the manifest's step)."""
    step = json.loads((folder / "manifest.json").read_text())["step"]
    found = {}
    for path in sorted(folder.glob(f"rank-*-step-{step:07d}.pt")):
        found |= torch.load(path, weights_only=True)["adapters"]
    return found


def furthest(a: dict, b: dict) -> float:
    assert sorted(a) == sorted(b)
    return max((a[d][k] - b[d][k]).abs().max().item() for d in a for k in a[d])


@pytest.mark.parametrize("family", sorted(CLASSES))
def test_a_stage_forward_is_the_models_own_forward(family):
    model = tiny_model(family)
    view, x = model_view(model), torch.randint(0, 96, (2, 12), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        want = model(x, output_hidden_states=True).hidden_states
        out, kept = stage_forward(view, range(0, 3), view.embed(x), keep={2, 3, 5})
        out, later = stage_forward(view, range(3, view.num_layers), out, keep={5})
    assert sorted(kept) == [2, 3] and sorted(later) == [5]  # a stage keeps only the depths it reaches
    for depth, rows in (kept | later).items():
        assert torch.allclose(rows, want[depth], atol=1e-10, rtol=0), depth
    assert torch.allclose(model.model.norm(out), want[-1], atol=1e-10, rtol=0)


@pytest.mark.parametrize("K, options", [(2, {"top1": 0.5}), (4, {"shortlist": 40})])
def test_distributed_training_equals_one_process_training(K, options, tmp_path):
    model, cfg = tiny_model("llama"), config(**options)
    want = one_process(model, cfg, tmp_path)
    facts = train_distributed(
        model,
        cfg,
        tmp_path / "k.safetensors",
        tmp_path / "k",
        explorers=K,
        windows=WINDOWS,
        ranking=RANKING,
        progress=False,
    )
    got = rank_adapters(tmp_path / "k")
    assert facts["steps"] == 4 and facts["ranks"] == K and furthest(got, want) <= 1e-9
    fresh = torch.load(tmp_path / "one.ckpt", weights_only=True)  # training moved them: the check can fail
    assert fresh["step"] == 4 and max(float(v["alpha"].abs()) for v in got.values()) > 1.5e-3
    meta = read_metadata(tmp_path / "k.safetensors")
    assert meta["depths"] == [1, 2, 3, 4, 5] and meta["training"]["backend"] == "distributed"
    files = [load_file(tmp_path / name) for name in ("k.safetensors", "one.safetensors")]  # what users load
    assert files[0].keys() == files[1].keys() and all(torch.equal(files[0][k], files[1][k]) for k in files[0])


def test_a_stopped_run_keeps_its_checkpoint_and_resumes_to_the_uninterrupted_adapters(tmp_path):
    model, cfg = tiny_model("llama"), config(tokens=16 * 2 * 2 * 5, checkpoint_every=1, top1=0.5)
    want, folder, seen = one_process(model, cfg, tmp_path), tmp_path / "k", []

    def ctrl_c_at_step_2(report):
        seen.append(report["step"])
        if report["step"] == 2:
            raise KeyboardInterrupt  # where the parent's loop would get it from the terminal

    run = dict(explorers=3, windows=WINDOWS, progress=ctrl_c_at_step_2)
    facts = train_distributed(model, cfg, tmp_path / "k.safetensors", folder, **run)
    step = json.loads((folder / "manifest.json").read_text())["step"]
    assert facts["stopped_early"] and facts["steps"] == step in (2, 3) and seen[-1] == step
    assert sorted(p.name for p in folder.iterdir()) == ["manifest.json"] + [
        f"rank-{k}-step-{step:07d}.pt" for k in range(3)
    ]
    assert read_metadata(tmp_path / "k.safetensors")["training"]["steps"] == step
    seen.clear()
    facts = train_distributed(
        model, cfg, tmp_path / "k.safetensors", folder, **run | {"progress": seen.append}
    )
    assert "stopped_early" not in facts and [r["step"] for r in seen] == list(range(step + 1, 6))
    assert furthest(rank_adapters(folder), want) <= 1e-9
    (folder / "rank-1-step-0000005.pt").unlink()
    with pytest.raises(
        ExplorerError, match="explorer rank 1 failed: DexError: rank 1 has no checkpoint file"
    ):
        train_distributed(model, cfg, tmp_path / "k.safetensors", folder, **run | {"progress": False})


def test_a_training_rank_that_dies_is_named_and_the_last_checkpoint_stays_whole(tmp_path):
    model, cfg, folder = tiny_model("llama"), config(tokens=16 * 2 * 2 * 40), tmp_path / "k"

    def kill_rank_1(report):
        if report["step"] == 3:
            ranks = [
                p for p in psutil.Process().children() if "dex_core.training.group" in " ".join(p.cmdline())
            ]
            next(p for p in ranks if p.cmdline()[p.cmdline().index("--rank") + 1] == "1").kill()

    with pytest.raises(ExplorerError, match=r"explorer rank 1 died \(was killed by SIGKILL\)"):
        train_distributed(
            model, cfg, tmp_path / "k.safetensors", folder, explorers=2, windows=WINDOWS, progress=kill_rank_1
        )
    step = json.loads((folder / "manifest.json").read_text())["step"]
    assert step >= 2 and step % 2 == 0  # every other step, the last whole one
    assert all(
        torch.load(folder / f"rank-{k}-step-{step:07d}.pt", weights_only=True)["step"] == step for k in (0, 1)
    )


def test_a_job_refuses_what_the_ranks_cannot_do():
    model = tiny_model("llama")
    job = make_job(config(), model.config, {"vocab_size": 96}, 3, "cpu", "out.safetensors", windows=WINDOWS)
    assert job.bounds == (2, 4, 6) and [job.depths(k) for k in range(3)] == [(1, 2), (3, 4), (5,)]
    assert job.dtype == "float32" and job.part(1).rows is None  # float32 on CPU; no shortlist, whole heads
    half = make_job(config(bf16=True), model.config, {}, 2, "cuda", "o", dtype="bfloat16", windows=WINDOWS)
    assert half.dtype == "bfloat16" and half.cfg.bf16 is False  # half weights: no autocast on top
    with pytest.raises(DexError, match="needs the whole model in one process"):
        make_job(config(data="onpolicy"), model.config, {}, 2, "cpu", "o")
    with pytest.raises(DexError, match="2 to 6 ranks"):
        make_job(config(), model.config, {}, 7, "cpu", "o", windows=WINDOWS)
    with pytest.raises(DexError, match="a shortlist loss needs a token ranking"):
        make_job(config(shortlist=40), model.config, {}, 2, "cpu", "o", windows=WINDOWS)
    with pytest.raises(DexError, match=r"windows must be \(n, 16\)"):
        make_job(config(), model.config, {}, 2, "cpu", "o", windows=WINDOWS[:, :8])


def test_dex_train_adapters_distributed_and_under_torchrun_make_the_same_adapters(tiny_dir, tmp_path):
    common = [
        "--model",
        str(tiny_dir),
        "--device",
        "cpu",
        "--tokens",
        "256",
        "--seq-len",
        "32",
        "--depths",
        "all",
    ]
    common += ["--shortlist", "40"]
    distributed = [sys.executable, "-m", "dex_core.cli", "train-adapters", "--backend", "distributed"]
    subprocess.run(
        [
            *distributed,
            "--explorers",
            "2",
            *common,
            "--out",
            str(tmp_path / "d.safetensors"),
            "--checkpoint",
            str(tmp_path / "d"),
        ],
        check=True,
        timeout=120,
    )
    torchrun = shutil.which("torchrun", path=os.path.dirname(sys.executable))
    launch = [torchrun, "--standalone", "--nproc-per-node", "2", "-m", "dex_core.cli", "train-adapters"]
    done = subprocess.run(
        [*launch, "--backend", "torchrun", *common, "--out", str(tmp_path / "t.safetensors")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.count("adapters for depths [1, 2, 3, 4, 5] saved") == 1  # rank 0 reports, once
    a, b = load_file(tmp_path / "d.safetensors"), load_file(tmp_path / "t.safetensors")
    assert a.keys() == b.keys() and "shortlist" in a and all(torch.equal(a[k], b[k]) for k in a)
    assert read_metadata(tmp_path / "t.safetensors")["training"]["ranks"] == 2
    assert json.loads((tmp_path / "d" / "manifest.json").read_text())["step"] == 8


def test_dex_train_adapters_distributed_stops_at_ctrl_c_with_its_checkpoint(tiny_dir, tmp_path):
    args = [
        sys.executable,
        "-m",
        "dex_core.cli",
        "train-adapters",
        "--backend",
        "distributed",
        "--explorers",
        "2",
    ]
    args += ["--model", str(tiny_dir), "--device", "cpu", "--tokens", "10000000", "--seq-len", "16"]
    args += [
        "--depths",
        "2,4",
        "--out",
        str(tmp_path / "a.safetensors"),
        "--checkpoint",
        str(tmp_path / "ck"),
    ]
    run = subprocess.Popen(
        args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        while not (tmp_path / "ck" / "manifest.json").exists():  # training, past its first checkpoint
            assert run.poll() is None, run.communicate()[1][-2000:]
            time.sleep(0.2)
        os.killpg(run.pid, signal.SIGINT)  # Ctrl-C in a terminal: the parent and every rank get it
        out, err = run.communicate(timeout=60)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
    step = json.loads((tmp_path / "ck" / "manifest.json").read_text())["step"]
    assert run.returncode == 0, err[-2000:]
    assert f"stopped early at step {step} of 625000: run the same command to resume" in out
    assert read_metadata(tmp_path / "a.safetensors")["training"]["steps"] == step
    assert not [
        p
        for p in psutil.Process().children(recursive=True)
        if "dex_core.training.group" in " ".join(p.cmdline())
    ]


def test_dex_plan_train_for_llama2_70b_on_k8_matches_a_hand_count(capsys):
    from dex_core.analysis.plan import EXAMPLE_CONFIGS, model_config
    from dex_core.cli import main
    from dex_core.training.plan import plan_training

    config = model_config(None, str(EXAMPLE_CONFIGS / "llama-2-70b.json"))
    plans = plan_training(config, 8, torch.float16, "uniform:8", batch=1, seq_len=192)
    h, m, i, V, T = 8192, 16384, 28672, 32000, 192
    layer = 2 * h * h + 2 * h * 1024 + 3 * h * i + 2 * h  # q, o; k, v (8 KV heads of 128); the MLP; two norms
    adapter = h + m * h + m + h * m + h + 1  # norm, up, down, alpha
    for k, plan in enumerate(plans[:7]):
        assert plan.depths == (10 * (k + 1),)  # the K = 8 split's inner depths, one a stage
        assert sum(plan.weights.values()) == 10 * layer * 2 + V * h * 2 + h * 2 + (V * h * 2 if k == 0 else 0)
        assert (plan.adapters, plan.optimizer) == (adapter * 4, adapter * 12)
        rows, work = T * h * (2 + 8 + (8 - k)) * 2, T * (3 * i + 4 * h) * 2 + 64 * T * T * 2
        assert plan.activations == rows + work + T * (4 * h + 2 * m) * 4 + 3 * T * V * 4
        assert plan.teacher == 2 * T * V * 4
    assert plans[7].depths == () and plans[7].adapters == 0 and plans[7].teacher == 9 * T * V * 4
    assert (
        17.6e9 < sum(plans[1].weights.values()) < 17.7e9
        and 4.29e9 < plans[1].adapters + plans[1].optimizer < 4.3e9
    )
    path = str(EXAMPLE_CONFIGS / "llama-2-70b.json")
    assert main(["plan", "--config", path, "--train", "--explorers", "8", "--gpu-memory", "80GB"]) == 0
    out = capsys.readouterr().out
    assert "adapter training on K=8 ranks, weights in float16" in out and out.count(": fits") == 8
    assert main(["plan", "--config", path, "--train", "--explorers", "2", "--gpu-memory", "80GB"]) == 1
    assert capsys.readouterr().out.count("does NOT fit") == 2  # 40 layers (69 GB) and adapters a GPU
