"""A group started by torchrun: every rank one explorer, on one node or several, serving rank 0's requests.

Every rank runs the same program (``torchrun ... app/main.py --backend torchrun``, ``torchrun ... -m dex_core.cli
generate --backend torchrun ...``, ``dex serve``, or any script that calls
``DexDecoder.from_pretrained(spec, backend="torchrun")``). ``join`` reuses torchrun's rendezvous (``env://``; it
may span nodes): rank 0 resolves the run's settings (``RunSettings``) and hands them to the others through the
rendezvous store, and each rank reads only its own part of the checkpoint. Then rank 0 holds a
``TorchrunGroup`` whose ``run`` broadcasts a request on the control group and yields the trace events of
rank 0's share of it, as ``ExplorerGroup.run`` does, while every other rank ``follow``s: it serves each
request until rank 0 ``close``s the group. The number of explorers is the launch's world size.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
from datetime import timedelta

import torch
import torch.distributed as dist

from ..config import DecoderOptions, DexError, pick
from ..device import resolve_dtype
from ..model.checkpoint import Checkpoint, locate
from ..model.stage_load import PartSource, checkpoint_identity, skeleton
from ..model.view import model_view
from ..runtime.crew import Crew
from ..runtime.request import Request
from ..runtime.settings import RunSettings, resolve_run
from ..trace.events import EndEvent
from .crew_wire import rank_crew
from .group import IMPORT_SECONDS, LOAD_RATE
from .placement import default_threads
from .rank import connect, init_world, open_part, serve_request

SHARE, ALONE = "share", "alone"  # what rank 0 tells the others when requests start and stop sharing rounds
USAGE = "torchrun --nproc-per-node 4 -m dex_core.serving --prompt 'Hello'"


def torchrun_device(env, want: str = "auto") -> str:
    """This torchrun rank's device, from ``LOCAL_RANK`` / ``LOCAL_WORLD_SIZE`` in ``env`` and the GPUs it sees.

    ``want`` ``cpu``: CPU. ``auto`` (CPU when the rank sees no GPU) or ``cuda``: with at least one GPU per
    local rank, ``cuda:LOCAL_RANK``; with exactly one visible GPU, ``cuda:0`` (per-rank
    CUDA_VISIBLE_DEVICES; ranks that all see the same single GPU are refused when the group starts, as NCCL
    refuses two ranks on one GPU); with fewer GPUs than local ranks, a DexError, never CPU for some ranks and
    GPUs for others. Every rank decides alike, and the group checks that they agree before it starts.
    """
    local = int(env.get("LOCAL_RANK", env.get("RANK", 0)))
    ranks = int(env.get("LOCAL_WORLD_SIZE", env.get("WORLD_SIZE", 1)))
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if want == "cpu" or (want == "auto" and gpus == 0):
        return "cpu"
    if want not in ("auto", "cuda"):
        raise DexError(
            f"under torchrun each rank takes the GPU of its LOCAL_RANK: give --device auto, cuda or cpu "
            f"(choose the GPUs with CUDA_VISIBLE_DEVICES); got {want!r}"
        )
    if gpus == 0:
        raise DexError(
            "--device cuda, but this rank sees no GPU: check CUDA_VISIBLE_DEVICES or use --device cpu"
        )
    if gpus >= ranks:
        return f"cuda:{local}"
    if gpus == 1:
        return "cuda:0"
    raise DexError(
        f"this node shows {gpus} GPUs to {ranks} ranks, and NCCL needs one GPU per rank: start at most "
        f"{gpus} ranks per node (--nproc-per-node {gpus}), give each rank its own GPU "
        "(CUDA_VISIBLE_DEVICES per rank), or run every rank on CPU (--device cpu)"
    )


def world(env=os.environ) -> tuple[int, int]:
    """(rank, world size) of this torchrun process; DexError outside torchrun."""
    if "WORLD_SIZE" not in env or "RANK" not in env:
        raise DexError(f"the torchrun backend runs one explorer per process under torchrun, e.g. {USAGE}")
    return int(env["RANK"]), int(env["WORLD_SIZE"])


class _Stop:
    """Rank 0's wish to end the request in progress early: the link tells every rank at the next round."""

    wanted = False

    def is_set(self) -> bool:
        return self.wanted


class TorchrunGroup:
    """This rank's place in a torchrun group (``join``): rank 0 ``run``s requests, the others ``follow``."""

    def __init__(self, settings: RunSettings, view, explorer, link, device: str, config, folder, tokenizer):
        self.settings, self.view, self.explorer, self.link = settings, view, explorer, link
        self.config, self.folder, self.tokenizer = (
            config,
            folder,
            tokenizer,
        )  # the HF config, checkpoint folder
        self.rank, self.count = link.rank, link.count
        self.devices = [device] * self.count if self.rank else self._gather(device)
        self.data_link = (dist.get_backend(), link.staged)
        self._open = True
        self.crew: Crew | None = None  # rank 0's, while requests share rounds (``share``)
        self._ids = 0  # requests sent

    def _gather(self, device: str) -> list[str]:
        names = [None] * self.count
        dist.all_gather_object(names, device, group=self.link.ctrl)
        return names

    def pids(self) -> list[int]:
        return [os.getpid()]  # the other ranks' processes may live on other nodes

    def share(self, most: int) -> None:
        """Rank 0: let ``most`` requests in flight share each round (``runtime.crew``: this rank's crew tells the
        others who joins and leaves before each step, ``follow_shared``); 1: one at a time (not while requests
        share rounds)."""
        if most > 1 and self.crew is None:
            self._tell(SHARE)
            self.crew = rank_crew(self.view, self.settings, self.explorer, self.link, most)
            self.crew.tell = self._tell
        elif most == 1 and self.crew is not None:
            if self.crew.members:
                raise DexError(
                    f"{len(self.crew.members)} requests share this group's rounds: let them end first"
                )
            self.crew = None
            self._tell(ALONE)
        if self.crew is not None:
            self.crew.most = most

    @property
    def shares(self) -> bool:
        return self.crew is not None

    def _tell(self, message) -> None:
        dist.broadcast_object_list([message], src=0, group=self.link.ctrl)

    def run(self, request: Request):
        """Rank 0: ``request``'s trace events, in rounds shared with every request in flight (``share``), or
        alone."""
        if self.rank != 0 or not self._open:
            raise DexError("only rank 0 of an open torchrun group sends requests")
        self._ids += 1
        if self.crew is not None:
            return self.crew.take(dataclasses.replace(request, id=self._ids))
        return self._alone(request)

    def _alone(self, request: Request):
        """Send ``request`` to every rank and yield this rank's trace events until the end event."""
        self._tell(request)
        self.link.cancel.wanted, finished = False, False
        events = serve_request(self.view, self.explorer, self.link, request, self.settings)
        try:
            for event in events:
                finished = isinstance(event, EndEvent)
                yield event
        finally:
            if not finished:  # the caller stopped early: every rank stops in step at the next round
                self.link.cancel.wanted = True
                for _ in events:
                    pass

    def follow(self) -> None:
        """Ranks other than 0: serve every request rank 0 sends, until it closes the group."""
        self._gather(str(self.link.device))
        while (message := self._told()) is not None:
            if message == SHARE and self.follow_shared() is None:
                break
            if isinstance(message, Request):
                for _ in serve_request(self.view, self.explorer, self.link, message, self.settings):
                    pass
        self._end()

    def _told(self):
        box = [None]
        dist.broadcast_object_list(box, src=0, group=self.link.ctrl)
        return box[0]

    def follow_shared(self) -> str | None:
        """Ranks other than 0, while rank 0's requests share rounds: before each step rank 0 says who joined and
        left since the last; this rank's crew does the same, then the step. Returns ALONE (one request at a time
        again) or None (the group closes)."""
        crew = rank_crew(self.view, self.settings, self.explorer, self.link)
        with torch.no_grad():
            while isinstance(told := self._told(), list):
                for kind, what in told:
                    if kind == "join":
                        crew._join(what)
                    else:  # gone already when it finished in the last step
                        crew._leave(next((m for m in crew.members if m.run.request.id == what), None))
                crew._advance()
                for m in crew.members:
                    m.events.clear()
        return told

    def close(self) -> None:
        """Rank 0: tell the other ranks to stop, and leave the process group."""
        if self.rank == 0 and self._open:
            self._tell(None)
            self._end()

    def _end(self) -> None:
        self._open = False
        if dist.is_initialized():
            dist.destroy_process_group()


def join(
    spec: str, options: DecoderOptions, dtype="auto", device="auto", log=lambda line: None
) -> TorchrunGroup:
    """Every rank: rendezvous through torchrun, agree on the settings (rank 0's), load this rank's part."""
    # deferred: transformers takes seconds to import (docs/ARCHITECTURE.md, Imports)
    from transformers import AutoConfig, AutoTokenizer

    rank, count = world()
    if options.depths is not None and len(options.depths) != count:
        raise DexError(
            f"{len(options.depths)} exploration depths {list(options.depths)} need {len(options.depths)} "
            f"processes; torchrun started {count}"
        )
    options = pick(DecoderOptions, options, explorers=count)  # K is the launch's: one explorer per rank
    device = torchrun_device(os.environ, device)  # before the model loads: fail fast
    folder = locate(spec, log if rank == 0 else lambda line: None)
    config, tokenizer = AutoConfig.from_pretrained(folder), AutoTokenizer.from_pretrained(folder)
    torch.set_num_threads(options.threads or default_threads(count))
    dtype = resolve_dtype(dtype, torch.device(device).type, config)
    shape = skeleton(config, dtype, folder)
    weights = sum(p.numel() * p.element_size() for p in shape.parameters())
    bound = timedelta(seconds=IMPORT_SECONDS + options.start_timeout + weights / LOAD_RATE)
    data, store = init_world(device, "env://", rank, count, bound)  # torchrun's rendezvous; it may span nodes
    if rank == 0:
        identity = checkpoint_identity(config, Checkpoint(folder))
        settings = resolve_run(
            identity, model_view(shape), options, torch.device(device).type, tokenizer, log
        )
        store.set("dex-settings", pickle.dumps(settings))  # to the other ranks, which rank 0's launch started
    settings = pickle.loads(store.get("dex-settings"))  # the cluster's own store, not a visitor's input
    view, explorer, _ = open_part(settings, PartSource(config, folder=str(folder)), rank, device)
    link = connect(
        view, rank, count, data, device, settings.trace_top, options.op_timeout, _Stop(), control=True
    )
    return TorchrunGroup(settings, view, explorer, link, device, config, folder, tokenizer)
