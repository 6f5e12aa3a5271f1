"""Adapter training where the model lives: K rank processes, each holding one stage of the model and training the
adapters inside it (``dex_core.training.stage``, scheduled by ``dex_core.training.pipeline``). Here: the job
every rank agrees on (``make_job``), a rank's whole run (``train_rank``), the progress display, and the torchrun
launch (``train_on_torchrun``: ``torchrun --nproc-per-node K -m dex_core.cli train-adapters --backend torchrun ...``;
every rank runs the command, rank 0 decides the job and hands it to the others through torchrun's store and shows
the progress; ranks may span nodes, each writing its checkpoint file in its own node's folder). Ranks started and
owned by one parent process: ``dex_core.training.group``.

Rank 0 reads the training text (or the windows given) and writes the adapter file at the end, receiving the other
ranks' adapters. Data-parallel replicas of the pipeline are not built: one pipeline of K ranks.
"""

from __future__ import annotations

import itertools
import os
import pickle
import signal
import threading
from dataclasses import replace
from datetime import timedelta

import torch
import torch.distributed as dist
from tqdm.auto import tqdm

from ..config import DexError, resolve_depths
from ..data.ranking import token_ranking
from ..device import dtype_name, resolve_dtype, return_freed_memory
from ..distributed.group import IMPORT_SECONDS
from ..distributed.placement import default_threads
from ..distributed.rank import init_world
from ..distributed.torchrun import torchrun_device, world
from ..log import quiet, stderr
from ..model.adapters import new_adapters, save_adapters
from ..model.checkpoint import Checkpoint, locate
from ..model.load import load_tokenizer
from ..model.stage_load import PartSource, checkpoint_identity, load_stage
from .data import training_windows
from .pipeline import Checkpoints, Wire, batches, run_pipeline
from .stage import StageTrainer, TrainJob
from .train import TrainConfig, facts_of, resolved

# seconds the ranks may go without a word to their parent: a step, or a checkpoint of a large model
OP_TIMEOUT = 900.0


def make_job(
    cfg: TrainConfig, config, identity: dict, count: int, device_type: str, out, checkpoint=None, **given
) -> TrainJob:
    """The job of training ``cfg`` on K = ``count`` ranks (a uniform split of the layers) on ``device_type``
    devices; ``given``: ``dtype`` (default: what a DEX run picks there, float32 on CPU, the checkpoint's half
    precision on GPUs), ``ranking``, ``windows``, ``folder`` (``TrainJob``)."""
    layers = config.num_hidden_layers
    cfg = resolved(cfg, layers, device_type)
    if cfg.data == "onpolicy" and given.get("windows") is None:
        raise DexError(
            "--data onpolicy generates the model's own answers, which needs the whole model in one process: "
            "train on-policy with --backend sequential, or use --data sharegpt"
        )
    if not 2 <= count <= layers:
        raise DexError(f"distributed training needs 2 to {layers} ranks (one stage each); got {count}")
    dtype = dtype_name(given.pop("dtype", None) or resolve_dtype("auto", device_type, config))
    if dtype in ("float16", "bfloat16"):  # half weights: the matrix work is half already, no autocast on top
        cfg = replace(cfg, bf16=False)
    windows = given.pop("windows", None)
    if windows is not None:
        windows = torch.as_tensor(windows, device="cpu").long()  # host data: rank 0 moves each micro-batch
        if windows.ndim != 2 or windows.shape[1] != cfg.seq_len or not len(windows):
            raise DexError(f"windows must be (n, {cfg.seq_len}) token ids; got shape {list(windows.shape)}")
    ranking = given.pop("ranking", None)
    if 0 < cfg.shortlist < config.vocab_size and ranking is None and given.get("folder") is None:
        raise DexError("a shortlist loss needs a token ranking: give one, or a model with its tokenizer")
    return TrainJob(
        cfg,
        resolve_depths(layers, explorers=count),
        identity,
        dtype,
        str(out),
        None if checkpoint is None else str(checkpoint),
        None if ranking is None else tuple(int(t) for t in ranking),
        windows,
        **given,
    )


def _agree(job: TrainJob, rank: int, ctrl, tokenizer) -> TrainJob:
    """The job with the token ranking every rank uses: given, or derived by rank 0 from the tokenizer."""
    box = [job.ranking]
    if rank == 0 and job.ranking is None and tokenizer is not None:
        box[0] = tuple(token_ranking(tokenizer, job.identity["vocab_size"]))
    dist.broadcast_object_list(box, src=0, group=ctrl)  # rank 0's own ranking, between our ranks
    return replace(job, ranking=box[0])


def _inputs(job: TrainJob, trainer: StageTrainer, tokenizer):
    """Rank 0's micro-batches from where the run stands: the windows given, in order, or the training text."""
    cfg, done = job.cfg, trainer.step * job.cfg.accum * job.cfg.batch
    if job.windows is not None:
        n = len(job.windows)
        windows = (job.windows[i % n] for i in itertools.count(done))
    else:
        windows = training_windows(tokenizer, cfg.seq_len, cfg.seed, cfg.data, done, trainer.step)
    return batches(windows, cfg.batch)


def train_rank(
    job: TrainJob, rank: int, device, source: PartSource, data, stop, on_step, status=None, ready=None
):
    """Rank ``rank``'s whole run on a joined world (``data``: its ``rank.DataLink``): agree on the ranking, load
    the part, resume, train, and (rank 0) write the adapter file; returns the facts at rank 0, else None.
    ``stop()``: this rank's wish to stop; ``on_step(trainer)`` after each step; ``status``: loading progress."""
    ctrl = dist.new_group(backend="gloo")
    wire = Wire(data.staged)
    reads = rank == 0 and job.folder is not None and (job.windows is None or job.ranking is None)
    tokenizer = load_tokenizer(job.folder) if reads else None
    job = _agree(job, rank, ctrl, tokenizer)
    dtype = getattr(torch, job.dtype)
    trainer = StageTrainer(
        job, rank, load_stage(source.config, job.part(rank), source.open(), device, dtype, status)
    )
    checkpoints = Checkpoints(job.checkpoint, rank, ctrl) if job.checkpoint else None
    if checkpoints:
        checkpoints.resume(trainer)
    if ready:
        ready(trainer)
    inputs = _inputs(job, trainer, tokenizer) if rank == 0 else None

    def after_step(stopped: bool) -> None:
        every, last = job.cfg.checkpoint_every, trainer.step == job.cfg.steps
        if checkpoints and (trainer.step % every == 0 or last or stopped):
            checkpoints.save(trainer)
        on_step(trainer)

    stopped = run_pipeline(trainer, rank, job.K, ctrl, wire, inputs, stop, after_step)
    return _finish(job, trainer, rank, ctrl, stopped)


def _finish(job: TrainJob, trainer: StageTrainer, rank: int, ctrl, stopped: bool) -> dict | None:
    """Rank 0 collects every rank's adapters and writes the adapter file; returns the facts there."""
    adapters = _collect(job, trainer, rank, ctrl)
    if rank != 0:
        return None
    facts = facts_of(job.cfg, trainer, stopped, given=job.windows is not None) | {
        "backend": "distributed",
        "ranks": job.K,
    }
    save_adapters(job.out, dict(sorted(adapters.items())), job.identity, facts, job.ranking)
    return facts


def _collect(job: TrainJob, trainer: StageTrainer, rank: int, ctrl) -> dict | None:
    """Rank 0: every rank's adapters, the others' in float16 (as the file keeps them): each rank sends its
    tensors on the control group, rank 0 receives them into adapters of the same shapes (no pickles, no copy of
    more than the file holds)."""
    if rank != 0:
        for adapter in trainer.adapters.values():
            for tensor in adapter.state_dict().values():
                dist.send(tensor.detach().to("cpu", torch.float16).contiguous(), 0, group=ctrl)
        return None
    adapters = dict(trainer.adapters)
    for k in range(1, job.K):
        for depth, adapter in new_adapters(
            trainer.view.model, job.depths(k), job.cfg.bottleneck, torch.float16, "cpu"
        ).items():
            for tensor in adapter.state_dict().values():
                dist.recv(tensor, k, group=ctrl)
            adapters[depth] = adapter
    return adapters


class Progress:
    """The parent's view of a run: a bar with the loss, tokens/s and ETA, or a callable's."""

    def __init__(self, cfg: TrainConfig, progress):
        self.cfg, self.call = cfg, progress if callable(progress) else None
        self.bar, self.enabled, self.start = None, bool(progress), None

    def __call__(self, report: dict) -> None:
        if self.call:
            self.call(report)
            return
        if self.start is None:
            self.start = report
            total, initial = self.cfg.steps, report["step"] - 1
            self.bar = tqdm(
                total=total, initial=initial, desc="adapters", unit="step", disable=not self.enabled
            )
        self.bar.update(1)
        seconds = report["seconds"] - self.start["seconds"]
        shown = {"loss": f"{report['loss']:.3f}"}
        if seconds > 0:  # from the second step on: this session's tokens over its seconds
            shown["tok_s"] = f"{(report['tokens'] - self.start['tokens']) / seconds:.0f}"
        self.bar.set_postfix(shown)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def step_report(trainer: StageTrainer) -> dict:
    return {
        "step": trainer.step,
        "loss": trainer.losses[-1],
        "tokens": trainer.tokens(),
        "seconds": trainer.seconds,
    }


def train_on_torchrun(
    spec: str, cfg: TrainConfig, out, checkpoint=None, device="auto", progress=True, log=stderr
):
    """This torchrun rank's share of training adapters on the launch's world (one stage per rank); the facts at
    rank 0, None elsewhere."""
    from transformers import AutoConfig  # deferred: seconds to import (docs/ARCHITECTURE.md, Imports)

    rank, count = world()
    device = torchrun_device(os.environ, device)
    return_freed_memory()  # a micro-batch's activations go back when freed
    folder = locate(spec, log if rank == 0 else quiet)
    config = AutoConfig.from_pretrained(folder)
    torch.set_num_threads(default_threads(int(os.environ.get("LOCAL_WORLD_SIZE", count))))
    timeout = timedelta(seconds=IMPORT_SECONDS + OP_TIMEOUT)
    data, store = init_world(
        device, "env://", rank, count, timeout
    )  # torchrun's rendezvous; it may span nodes
    if rank == 0:
        identity = checkpoint_identity(config, Checkpoint(folder))
        job = make_job(
            cfg, config, identity, count, torch.device(device).type, out, checkpoint, folder=str(folder)
        )
        store.set("dex-train-job", pickle.dumps(job))  # to the other ranks of rank 0's launch
    job = pickle.loads(store.get("dex-train-job"))  # the cluster's own store, not a visitor's input
    stop = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    show = Progress(job.cfg, progress if rank == 0 else False)
    source = PartSource(config, folder=str(folder))
    on_step = (lambda trainer: show(step_report(trainer))) if rank == 0 else (lambda trainer: None)
    try:
        return train_rank(job, rank, device, source, data, stop.is_set, on_step)
    finally:
        show.close()
        dist.destroy_process_group()
