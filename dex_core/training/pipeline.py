"""The schedule of distributed adapter training on a joined world (``run_pipeline``), and its checkpoints
(``Checkpoints``).

Micro-batch i enters rank 0 at its tick i and reaches the final rank K - 1 after K - 1 stage times; the final
rank's teacher for i comes back to rank k just as rank k forwards micro-batch i + (K - 1 - k). So rank k runs,
at tick t: the forward of micro-batch t (rows from rank k - 1, or the windows at rank 0; its output to rank
k + 1, or at the final rank the teacher to every rank), then the loss of micro-batch t - (K - 1 - k) with that
micro-batch's teacher. Every stage works on a micro-batch at every tick once the pipeline is full: K devices
train about K times as fast as one, and none holds the whole model. At the end of each optimizer step the ranks
sum three numbers on the control group — the squared gradient norm (clipping is over all adapters, as in one
process), the loss, and whether anyone asked to stop — and step their own optimizers. Rows and teachers go
point to point on the data group (NCCL between GPUs, gloo on CPU or staged through the host); the sums on gloo.

A stop (Ctrl-C, or the parent's word) takes effect at the end of a step on every rank alike: each rank takes the
one micro-batch its predecessor forwarded beyond that step and drops it, checkpoints and ends.
"""

from __future__ import annotations

import collections
import json
import math
import time
from pathlib import Path

import torch
import torch.distributed as dist

from ..config import DexError

MANIFEST = "manifest.json"


class Wire:
    """Tensors between ranks on the data backend: directly, or through host memory (``staged``). Rows go down the
    stages on the default group, teachers up on a group of their own (``teachers``): on NCCL each pair of ranks
    then has one communicator a direction, and a send never waits behind a receive queued on the same stream."""

    def __init__(self, staged: bool):
        self.staged, self.pending = staged, collections.deque()
        self.teachers = dist.new_group(backend=dist.get_backend())

    def send(self, tensor: torch.Tensor, dst: int, group=None, keep: int = 1) -> None:
        """Send ``tensor`` to rank ``dst`` without waiting; the sends older than the last ``keep`` are waited for
        (their tensors freed). A receiver takes a row or a teacher within K ticks of its sending, so a rank
        keeping K ticks' sends never waits on a peer that waits on it."""
        tensor = tensor.detach().contiguous()
        tensor = tensor.cpu() if self.staged else tensor
        self.pending.append((dist.isend(tensor, dst, group=group), tensor))  # kept until the send completes
        while len(self.pending) > keep:
            self.pending.popleft()[0].wait()

    def recv(self, shape, dtype: torch.dtype, device, src: int, group=None) -> torch.Tensor:
        buffer = torch.empty(shape, dtype=dtype, device="cpu" if self.staged else device)
        dist.recv(buffer, src, group=group)
        return buffer.to(device)

    def finish(self) -> None:
        for work, _ in self.pending:
            work.wait()
        self.pending.clear()


class Checkpoints:
    """A run's checkpoint folder: per step, one file per rank (``rank-K-step-S.pt``, written whole then renamed)
    and rank 0's ``manifest.json`` naming the step every rank's file holds. The manifest moves only once every
    rank's file of the new step is complete, and old files go only after it moved: a run killed at any moment
    leaves a whole checkpoint. With ranks on several nodes, each rank's folder is on its own node."""

    def __init__(self, folder, rank: int, ctrl):
        self.folder, self.rank, self.ctrl = Path(folder), rank, ctrl
        self.folder.mkdir(parents=True, exist_ok=True)

    def file(self, step: int) -> Path:
        return self.folder / f"rank-{self.rank}-step-{step:07d}.pt"

    def manifest(self, trainer) -> dict:
        return {
            "format": "dex-adapter-training",
            "version": 1,
            "step": trainer.step,
            "ranks": trainer.job.K,
            "config": trainer.job.config(),
            "tokens": trainer.tokens(),
            "seconds": round(trainer.seconds, 3),
        }

    def resume(self, trainer) -> None:
        """Load this rank's file of the manifest's step, if the folder has a manifest (rank 0 reads it and tells
        the others); a manifest of another run or another rank count is an error on every rank."""
        box = [None]
        if self.rank == 0:
            box[0] = self._read(trainer)
        dist.broadcast_object_list(box, src=0, group=self.ctrl)  # rank 0's own reading, between our ranks
        found = box[0]
        if isinstance(found, str):
            raise DexError(found)
        if found is not None:
            trainer.load(self.file(found["step"]), found["step"])
            self._remove_others(found["step"])

    def _read(self, trainer) -> dict | str | None:
        path = self.folder / MANIFEST
        if not path.is_file():
            return None
        try:
            found = json.loads(path.read_text())
        except (OSError, ValueError) as err:
            return f"checkpoint manifest {path} is unreadable ({err}); remove the folder to start afresh"
        if found.get("format") != "dex-adapter-training" or found.get("ranks") != trainer.job.K:
            return (
                f"checkpoint folder {self.folder} was written by {found.get('ranks')} ranks, not "
                f"{trainer.job.K}: resume it with as many, or remove it"
            )
        if found.get("config") != json.loads(json.dumps(trainer.job.config())):  # as JSON keeps it
            return f"checkpoint folder {self.folder} was made with other training options; remove it or match them"
        return found

    def save(self, trainer) -> None:
        """Every rank writes its file of this step; then rank 0 moves the manifest; then old files go."""
        partial = self.file(trainer.step).with_suffix(".partial")
        torch.save(trainer.state(), partial)
        partial.replace(self.file(trainer.step))
        dist.barrier(group=self.ctrl)
        if self.rank == 0:
            partial = self.folder / f"{MANIFEST}.partial"
            partial.write_text(json.dumps(self.manifest(trainer), indent=1))
            partial.replace(self.folder / MANIFEST)
        dist.barrier(group=self.ctrl)
        self._remove_others(trainer.step)

    def _remove_others(self, step: int) -> None:
        for path in self.folder.glob(f"rank-{self.rank}-step-*"):
            if path != self.file(step):
                path.unlink(missing_ok=True)


def batches(windows, batch: int):
    """(batch, seq_len) micro-batches from an iterator of (seq_len,) windows."""
    while True:
        yield torch.stack([next(windows) for _ in range(batch)])


class _Tick:
    """One rank's state in the schedule."""

    def __init__(self, trainer, rank: int, count: int, wire: Wire, inputs):
        self.trainer, self.rank, self.count, self.wire, self.inputs = trainer, rank, count, wire, inputs
        self.final, self.lag = rank == count - 1, count - 1 - rank
        self.kept: dict[int, dict] = {}  # micro-batch -> rows at this stage's adapter depths
        self.teachers: dict[int, torch.Tensor] = {}  # the final rank's own teachers, until their loss

    def forward(self, i: int) -> None:
        t, device = self.trainer, self.trainer.device
        if self.rank == 0:
            inputs = next(self.inputs).to(device)
        else:
            inputs = self.wire.recv(t.hidden_shape(), t.view.dtype, device, self.rank - 1)
        out, self.kept[i] = t.forward(inputs)
        if not self.final:
            self.wire.send(out, self.rank + 1, keep=self.count)
            return
        teacher = t.teacher(out)
        for k in range(self.count - 1):
            self.wire.send(teacher, k, self.wire.teachers, keep=self.count * (self.count - 1))
        self.teachers[i] = teacher

    def loss(self, i: int) -> torch.Tensor:
        t = self.trainer
        if self.final:
            teacher = self.teachers.pop(i)
        else:
            teacher = self.wire.recv(t.teacher_shape(), t.dtype, t.device, self.count - 1, self.wire.teachers)
        return t.backward(self.kept.pop(i), teacher)

    def drop(self) -> None:
        """Take the rows the previous rank forwarded past a stop, and drop them."""
        t = self.trainer
        self.wire.recv(t.hidden_shape(), t.view.dtype, t.device, self.rank - 1)


def run_pipeline(trainer, rank: int, count: int, ctrl, wire: Wire, inputs, stop, after_step) -> bool:
    """Train ``trainer``'s stage to the configured steps: ``inputs`` (rank 0: an iterator of (B, T) token
    micro-batches from where the run stands), ``stop()`` this rank's wish to stop, ``after_step()`` called at each
    step's end (checkpoints, progress). Returns whether the run stopped early."""
    cfg = trainer.cfg
    total = (cfg.steps - trainer.step) * cfg.accum  # micro-batches left
    tick = _Tick(trainer, rank, count, wire, inputs)
    horizon = last = total  # forwards, and losses, this rank still runs: fewer after a stop
    share, since, t, stopped = 0.0, time.perf_counter(), 0, False
    while t - tick.lag < last:
        if t < horizon:
            tick.forward(t)
        i = t - tick.lag
        if 0 <= i < last:
            share = share + tick.loss(i)
            if (i + 1) % cfg.accum == 0:
                sums = [trainer.grad_norm_squared(), float(share), float(stop())]
                sums = torch.tensor(sums, dtype=torch.float64, device="cpu")  # summed on the gloo group
                dist.all_reduce(sums, group=ctrl)
                now = time.perf_counter()
                trainer.optimizer_step(math.sqrt(sums[0]), float(sums[1]), now - since)
                share, since = 0.0, now
                if sums[2] > 0 and trainer.step < cfg.steps:
                    stopped, last, horizon = True, i + 1, t + 1
                    if rank > 0 and t + 1 < total:
                        tick.drop()
                after_step(stopped)
        t += 1
    wire.finish()
    return stopped
