"""Adapter training on rank processes this process starts and owns (``dex train-adapters --backend
distributed``): ``train_distributed``. A ``TrainingGroup`` is an ``ExplorerGroup`` (the same start, reports, checks
and blame) whose ranks run ``rank_main``: each joins the world and runs ``train_ranks.train_rank``. This process
holds no weights (with a checkpoint folder the ranks read their own parts; a model built in memory hands each
rank its part), shows the progress (tokens/s, ETA), and on Ctrl-C asks every rank to stop at the end of a step,
with a checkpoint and the adapter file of that step; a second Ctrl-C ends the processes (the last checkpoint
stays whole). A rank that dies ends the run with the rank named. ``run_training``: the three backends of the
command.
"""

from __future__ import annotations

import pickle
import resource
import signal
import threading
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch

from ..config import DecoderOptions, DexError
from ..device import return_freed_memory
from ..distributed.group import ExplorerGroup
from ..distributed.rank import init_world, leave, main, reporter
from ..log import stderr
from ..model.adapters import model_identity
from ..model.load import load_model
from ..model.stage_load import PartSource
from ..runtime.unloaded import UnloadedModel, device_type
from .ranks import OP_TIMEOUT, Progress, make_job, step_report, train_on_torchrun, train_rank
from .stage import TrainJob
from .train import TrainConfig, train_adapters


@dataclass(frozen=True)
class TrainStart:
    """What a training rank's parent sends it once (as ``rank.Start`` for an explorer)."""

    job: TrainJob
    source: PartSource
    device: str
    threads: int
    count: int
    init_method: str
    timeout: float  # seconds any exchange may wait for a peer
    share: bool
    stage: bool


class TrainingGroup(ExplorerGroup):
    """K training ranks owned by this process (see the module docstring)."""

    entry = "from dex_core.training.group import rank_main; rank_main()"

    def __init__(self, job: TrainJob, model, options: DecoderOptions, folder=None):
        self.job = job
        super().__init__(
            job, model, options, folder
        )  # a job has what the group reads of settings: K, part(k)

    def _start_message(self, rank: int, join_timeout: float) -> bytes:
        return pickle.dumps(
            TrainStart(
                self.job,
                self._source(rank),
                self.devices[rank],
                self.threads,
                self.count,
                (self._tmp / "rendezvous").as_uri(),
                max(join_timeout, self.op_timeout),
                True,
                self.stage_rows,
            )
        )

    def train(self, progress=True) -> dict:
        """Wait for the run's end, showing its progress (``progress``: a bar, or a callable given each step's
        report); Ctrl-C asks every rank to stop at the end of a step, a second one ends the processes."""
        show, stopping = Progress(self.job.cfg, progress), False
        while True:
            try:
                kind, _, payload = self._get(self._check_run)
                if kind == "trained":
                    show(payload)
                elif kind == "done":
                    show.close()
                    return payload
            except KeyboardInterrupt:
                if stopping:
                    self.close()
                    raise
                stopping = True
                self._send_all(("stop",))


def _listen(conn, stop: threading.Event, closed: threading.Event) -> None:
    try:
        while True:
            msg = conn.recv()
            (stop if msg[0] == "stop" else closed).set()
    except (EOFError, OSError):  # the parent is gone
        leave(0)


def _serve(conn, rank: int, send) -> None:
    """A training rank started by ``TrainingGroup``: join, train, and stay until the parent closes the group."""
    start: TrainStart = pickle.loads(conn.recv_bytes())  # from this rank's own parent, authenticated
    torch.set_num_threads(start.threads)
    return_freed_memory()  # a micro-batch's activations go back when freed
    stop, closed = threading.Event(), threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stop.set())  # Ctrl-C in a terminal reaches the ranks too
    threading.Thread(target=_listen, args=(conn, stop, closed), daemon=True).start()
    send("status", rank, ("joining", 0, 0, ""))
    timeout = timedelta(seconds=start.timeout)
    data, _ = init_world(
        start.device, start.init_method, rank, start.count, timeout, start.share, start.stage
    )

    def on_step(trainer) -> None:
        send("progress", rank, trainer.step)
        if rank == 0:
            send("trained", rank, step_report(trainer))

    def ready(trainer) -> None:  # the peak RSS so far (KiB on Linux): what loading the part took
        send(
            "ready",
            rank,
            (
                data,
                {"step": trainer.step, "loaded_peak_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss},
            ),
        )

    facts = train_rank(
        start.job, rank, start.device, start.source, data, stop.is_set, on_step, reporter(send, rank), ready
    )
    if rank == 0:
        send("done", rank, facts)
    closed.wait()


def rank_main() -> None:
    """Body of a training rank process (``TrainingGroup.entry``)."""
    main(serve=_serve)


def train_distributed(
    model,
    cfg: TrainConfig,
    out,
    checkpoint=None,
    *,
    explorers: int,
    devices=None,
    device="auto",
    progress=True,
    log=stderr,
    **given,
) -> dict:
    """Train adapters on ``explorers`` rank processes on this machine and save them to ``out``; ``checkpoint``:
    a folder, resumed from when it holds a checkpoint. ``model``: a spec (a named model, a folder, a hub id;
    this process reads its config and 64 rows of its embedding, each rank its own part) or a model built in
    memory. ``devices``: one per rank; else ``device`` ('auto': the GPUs when torch sees one, a GPU a rank or taken
    in turn as the explorers take them; 'cpu'). ``given``: as ``make_job`` takes them (``windows``, ``ranking``,
    ``dtype``). Returns the training facts."""
    kind = device_type(devices, device)
    if devices is None and kind == "cpu":
        devices = ("cpu",) * explorers
    options = DecoderOptions(devices=devices, op_timeout=OP_TIMEOUT)
    if isinstance(model, str):  # its config, tokenizer, identity and skeleton, and no weights
        unloaded = UnloadedModel.read(model, given.pop("dtype", "auto"), kind, log=log)
        folder, shape, config = unloaded.folder, unloaded.view.model, unloaded.config
        given |= {"folder": str(folder), "dtype": unloaded.view.dtype}
        job = make_job(cfg, config, unloaded.identity, explorers, kind, out, checkpoint, **given)
    else:
        folder, shape = None, model
        given.setdefault("dtype", model.model.norm.weight.dtype)
        job = make_job(cfg, model.config, model_identity(model), explorers, kind, out, checkpoint, **given)
    group = TrainingGroup(job, shape, options, folder)
    try:
        return group.train(progress)
    finally:
        group.close()


def run_training(args, cfg: TrainConfig, log=stderr) -> dict | None:
    """``dex train-adapters``: train on the backend ``args.backend`` names; the facts (None on a torchrun rank
    other than 0, which reports nothing)."""
    if args.backend == "sequential":
        # float32 weights: the trainer autocasts
        model, tokenizer = load_model(args.model, dtype="float32", device=args.device)
        return train_adapters(model, tokenizer, cfg, args.out, args.checkpoint)
    if args.checkpoint and Path(args.checkpoint).is_file():
        raise DexError(
            f"--checkpoint {args.checkpoint} is a file; the {args.backend} backend checkpoints into a folder"
        )
    if args.backend == "torchrun":
        return train_on_torchrun(args.model, cfg, args.out, args.checkpoint, args.device, log=log)
    return train_distributed(
        args.model,
        cfg,
        args.out,
        args.checkpoint,
        explorers=args.explorers,
        devices=args.devices,
        device=args.device,
        log=log,
    )
