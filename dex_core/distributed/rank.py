"""One explorer rank: its part of the model, joining the process group, serving requests, and ``main``, the
body of a rank process that ``ExplorerGroup`` starts in a fresh interpreter (never re-importing the
caller's ``__main__``).

A started rank listens on a unix socket in the group's private folder and accepts its parent (the connection
is authenticated with a key the parent passes in the environment). Its parent sends one start message: the
run's settings (``RunSettings``), where its part of the model comes from (``PartSource``: a checkpoint folder
it reads its own tensors from, or the tensors themselves for a model built in memory) and how to join. The
rank builds its part (``dex_core.model.stage_load``), reporting progress as the bytes arrive, joins
torch.distributed and then serves typed ``Request``s until told to close; rank 0 sends the trace events
in batches (``EventBatch``). Each round every rank stores the round it starts to wait on its peers in its slot of
the group's board of rounds (``round_board``): shared memory, not a message. It ends itself within a second when
its parent dies, idle or busy.
"""

from __future__ import annotations

import argparse
import inspect
import json
import mmap
import os
import pickle
import queue
import shutil
import socket
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from datetime import timedelta
from multiprocessing.connection import Listener
from typing import NamedTuple

import torch
import torch.distributed as dist

from ..config import DexError, stage_bounds
from ..device import exact_float32_matmuls
from ..model.explorer import Explorer
from ..model.proposal import ProposalHead
from ..model.stage_load import PartSource, load_stage
from ..model.view import model_view
from ..runtime.engine import run_rounds
from ..runtime.heap import settle
from ..runtime.request import Request
from ..runtime.settings import RunSettings
from .event_batch import EventBatch
from .link import DistLink
from .roster import Inbox, serve_shared

KEY_ENV = "DEX_GROUP_KEY"
REPORT_SECONDS = 0.25  # a loading rank reports its progress at most this often (and once it is done)


@dataclass(frozen=True)
class Start:
    """What a rank's parent sends it once: the run's settings, where its part of the model comes from, and how to
    join its peers."""

    settings: RunSettings  # with only this rank's adapter, when the adapters are modules
    source: PartSource
    device: str
    threads: int
    count: int  # explorers in the group
    init_method: str  # the rendezvous
    op_timeout: float  # seconds one exchange may wait for a peer
    join_timeout: float  # seconds the rendezvous and the first exchanges may wait (the group's start bound)
    share: bool  # whether ranks may share a GPU (rows staged through the host)
    stage: bool  # stage the rows through the host whatever the devices (the shared-GPU path, tested on CPU)
    rounds: str  # the group's board of rounds (``round_board``), whose slot ``rank`` this rank writes


def round_board(path: str) -> memoryview:
    """The group's board of rounds: the file ``path`` (one int64 slot a rank, zeros, made by ``ExplorerGroup`` in its
    private folder) mapped shared, as a view of ints. Each round rank k stores in slot k the round it starts to
    wait on its peers: one writer a slot, so a plain store, with no lock and no message (a pickled message a round
    from every rank would cost each round a send and the parent a wake-up). The parent reads the slots to see the
    ranks move and, when a run stalls, to name the rank behind."""
    with open(path, "r+b") as file:
        return memoryview(mmap.mmap(file.fileno(), 0)).cast("q")


def open_part(settings: RunSettings, source: PartSource, rank: int, device: str, progress=None):
    """Build explorer ``rank``'s part of the model on ``device``; return (view, explorer, the loading report:
    the checkpoint keys read, each with the number of rows read or None for all, and the bytes placed)."""
    dtype = getattr(torch, settings.dtype)
    stage = load_stage(source.config, settings.part(rank), source.open(), device, dtype, progress)
    view = model_view(stage.model)
    depth = settings.depths[rank]
    adapter = settings.adapters.build([depth], device, dtype).get(depth)
    head = None if stage.head_rows is None else ProposalHead(view, settings.shortlist, stage.head_rows)
    explorer = Explorer(view, rank, settings.K, *stage_bounds(settings.depths, rank), adapter, head)
    if settings.compile:
        explorer.compile_step(settings.compile)
    settle()  # the part lives as long as the process: collections stop visiting it (runtime.heap)
    return view, explorer, {"read": stage.read, "bytes": stage.bytes}


def device_report(device: str, share: bool = False, stage: bool = False) -> dict:
    """What a rank tells its peers before the data group exists: its device and, on CUDA, which GPU; whether its
    starter lets ranks share a GPU (``share``: ``ExplorerGroup`` does, torchrun does not) and asks for the rows
    to be staged through the host whatever the devices (``stage``: the shared-GPU path, run on CPU by tests)."""
    d, gpu = torch.device(device), None
    if d.type == "cuda":  # the GPU itself, whatever index CUDA_VISIBLE_DEVICES gives it in this process
        gpu = str(getattr(torch.cuda.get_device_properties(d), "uuid", "")) or None
    return {"device": str(d), "host": socket.gethostname(), "gpu": gpu, "share": share, "stage": stage}


class DataLink(NamedTuple):
    """How the ranks move hidden rows: the data group's backend, and whether rows go through host memory."""

    backend: str  # nccl or gloo
    staged: bool  # device -> host before each send, host -> device after each receive


def data_backend(reports: list[dict]) -> DataLink:
    """The data link from every rank's ``device_report`` (index = rank), alike on every rank: NCCL when every
    rank has a GPU of its own, gloo on CPU. Ranks that share a GPU (NCCL refuses that) get gloo with the rows
    staged through the host, where every report allows sharing; so does every rank when any report asks for
    ``stage``. A mix of CPU and GPU ranks, or a shared GPU that a report does not allow, is a DexError."""
    kinds = [torch.device(r["device"]).type for r in reports]
    if len(set(kinds)) > 1:
        ranks = ", ".join(f"rank {k} on {r['device']}" for k, r in enumerate(reports))
        raise DexError(
            f"the explorer ranks disagree on the device ({ranks}); every rank needs its own GPU or every "
            "rank runs on CPU: give each rank a GPU (at most one rank per visible GPU, or one "
            "CUDA_VISIBLE_DEVICES per rank) or hide the GPUs from all of them (CUDA_VISIBLE_DEVICES=)"
        )
    staged = any(r.get("stage") for r in reports)
    if kinds[0] == "cpu":
        return DataLink("gloo", staged)
    seen: dict = {}
    for k, r in enumerate(reports):
        where = (r["host"], r["gpu"])
        if r["gpu"] is not None and where in seen:
            if not all(x.get("share") for x in reports):
                raise DexError(
                    f"explorer ranks {seen[where]} and {k} are on the same GPU ({r['device']} on "
                    f"{r['host']}); NCCL refuses two ranks on one GPU: give each rank its own GPU or use "
                    "fewer explorers (torchrun ranks cannot share a GPU; DexDecoder(backend='distributed')"
                    " can, staging the rows through the host)"
                )
            staged = True
        seen[where] = k
    return DataLink("gloo", True) if staged else DataLink("nccl", False)


def init_options(backend: str, device: str) -> dict:
    """Keywords of ``init_process_group`` beyond the rendezvous: on NCCL ``device_id``, so that the world's
    communicator forms inside the call, with every rank, not lazily at the first exchange."""

    if backend == "nccl" and "device_id" in inspect.signature(dist.init_process_group).parameters:
        return {"device_id": torch.device(device)}
    return {}


def init_world(
    device: str,
    init_method: str,
    rank: int,
    count: int,
    timeout: timedelta,
    share: bool = False,
    stage: bool = False,
):
    """Rendezvous, agree on the data link over the rendezvous store (before any communicator exists, so a
    disagreement is a clear error on every rank, not a hang in ``new_group``), start the default process
    group on its backend, and return (the link, the store)."""

    store, _, _ = next(dist.rendezvous(init_method, rank, count, timeout=timeout))
    store.set_timeout(timeout)
    board = dist.PrefixStore("dex-devices", store)
    board.set(str(rank), json.dumps(device_report(device, share, stage)))
    link = data_backend([json.loads(board.get(str(k))) for k in range(count)])
    if torch.device(device).type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(
        link.backend,
        store=dist.PrefixStore("default_pg", store),
        rank=rank,
        world_size=count,
        timeout=timeout,
        **init_options(link.backend, device),
    )
    return link, store


def connect(
    view,
    rank: int,
    count: int,
    data: DataLink,
    device: str,
    trace_top: int,
    op_timeout: float,
    cancel=None,
    progress=None,
    control: bool = False,
) -> DistLink:
    """This rank's link to its peers on an initialized world (``init_world``, or torchrun's), warmed up.
    ``control``: a gloo group for the Python objects torchrun serving broadcasts (on NCCL; on gloo the world is
    one), made by every rank of the world together, only where it is used."""

    ctrl = dist.new_group(backend="gloo") if control and data.backend == "nccl" else None
    link = DistLink(
        rank,
        count,
        view.model.config.hidden_size,
        view.dtype,
        device,
        ctrl,
        trace_top,
        op_timeout,
        cancel,
        progress,
        data.staged,
    )
    warm_up(link)
    return link


def warm_up(link: DistLink) -> None:
    """One row from each rank to the next, in which every rank takes part, before the first request. On NCCL
    the first exchange between two ranks sets up their connection (hundreds of ms); a fresh group's first
    round may involve only ranks 0 and 1 (a one-token prompt skips the prefill), and setup there must not
    wait for ranks that are already in the control all-gather."""
    row = torch.zeros(1, link.hidden_size, dtype=link.dtype, device=link.device)  # (1, hidden)
    link._swap(row, 1)
    link.reset()


def serve_request(view, explorer, link, request: Request, settings: RunSettings):
    """Run one generation request on this rank; yields the trace events (identical on every rank)."""
    with torch.no_grad():
        yield from run_rounds(view, settings, [explorer], link, request)


class _Cancel:
    """Set by the parent for one request id; the link asks ``is_set()`` each round."""

    def __init__(self):
        self.current, self.ids = None, set()

    def is_set(self) -> bool:
        return self.current in self.ids


_LEFTOVER: list[str] = []  # rank 0's: the group's folder, to remove when the parent is gone (it could not)


def leave(code: int = 0) -> None:
    """End this rank process now (``os._exit``), rank 0 first removing the group's folder (``exit_with_parent``)."""
    for folder in _LEFTOVER:
        shutil.rmtree(folder, ignore_errors=True)
    os._exit(code)


def _watch_parent(parent: int) -> None:
    while True:  # re-parented (the parent died): leave, idle or busy
        if os.getppid() != parent:
            leave(0)
        time.sleep(0.5)


def exit_with_parent(parent: int, leftover: str | None = None) -> None:
    """A rank process's watch on its parent ``parent`` (a pid): when the parent dies, the rank leaves at once,
    idle or busy, removing the folder ``leftover`` first (the group's, which a killed parent could not), when
    given: explorer ranks and ar-tp's ranks give it at rank 0. Leaving on a lost connection does the same."""
    _LEFTOVER[:] = [leftover] if leftover else []
    threading.Thread(target=_watch_parent, args=(parent,), daemon=True).start()


def _read(conn, inbox: queue.Queue, cancel: _Cancel) -> None:
    try:
        while True:
            msg = conn.recv()
            if msg[0] == "cancel":
                cancel.ids.add(msg[1])
            else:
                inbox.put(msg)
    except (EOFError, OSError):  # the parent is gone
        leave(0)


def reporter(send, rank: int):
    """``progress(done, total, key)`` for ``load_stage``: a "loading" status at most every ``REPORT_SECONDS``
    (and when done), so that the parent sees a loading rank alive and knows how far it got."""
    last = [0.0]

    def progress(done: int, total: int, key: str) -> None:
        now = time.monotonic()
        if now - last[0] >= REPORT_SECONDS or done >= total:
            last[0] = now
            send("status", rank, ("loading", done, total, key))

    return progress


def main(argv=None, serve=None) -> None:
    """Body of a rank process: ``--rank K --folder DIR --parent PID``, the key in $DEX_GROUP_KEY. ``serve(conn, rank,
    send)`` is what it does once its parent is connected (default: ``_serve``, an explorer serving requests)."""
    parser = argparse.ArgumentParser(prog="dex_core.distributed.rank")
    for flag in ("--rank", "--parent"):
        parser.add_argument(flag, type=int, required=True)
    parser.add_argument("--folder", required=True)
    args = parser.parse_args(argv)
    exact_float32_matmuls()  # once per process: float32 stays float32 (device.py)
    exit_with_parent(args.parent, args.folder if args.rank == 0 else None)
    rank, key = args.rank, bytes.fromhex(os.environ.pop(KEY_ENV))
    with Listener(os.path.join(args.folder, f"rank-{rank}.sock"), family="AF_UNIX", authkey=key) as listener:
        conn = listener.accept()
    lock = threading.Lock()

    def send(*msg):
        with lock:
            conn.send(msg)

    try:
        (serve or _serve)(conn, rank, send)
    except BaseException as err:  # report, and leave at once so the peers notice
        try:
            send("error", rank, (f"{type(err).__name__}: {err}".strip(), traceback.format_exc()))
        except OSError:
            pass
        print(f"[dex] explorer rank {rank} failed:\n{traceback.format_exc()}", file=sys.stderr, flush=True)
        os._exit(1)
    dist.destroy_process_group()


def _serve(conn, rank: int, send) -> None:
    """Start as the parent's one message says (load the part, join the group, warm up), then serve requests until
    told to close."""
    start: Start = pickle.loads(
        conn.recv_bytes()
    )  # from this rank's own parent, over the authenticated socket
    messages, cancel = queue.Queue(), _Cancel()
    torch.set_num_threads(start.threads)
    threading.Thread(target=_read, args=(conn, messages, cancel), daemon=True).start()
    view, explorer, report = open_part(start.settings, start.source, rank, start.device, reporter(send, rank))
    board = round_board(start.rounds)

    def progress(round_: int) -> None:  # this rank's slot of the board: a store, not a message
        board[rank] = round_

    send("status", rank, ("joining", 0, 0, ""))
    data, _ = init_world(
        start.device,
        start.init_method,
        rank,
        start.count,
        timedelta(seconds=start.join_timeout),
        start.share,
        start.stage,
    )
    link = connect(
        view,
        rank,
        start.count,
        data,
        start.device,
        start.settings.trace_top,
        start.op_timeout,
        cancel,
        progress,
        control=True,  # the gloo group shared rounds agree on their roster over (``roster.agreed``)
    )
    send("ready", rank, (DataLink(dist.get_backend(), link.staged), report))
    inbox = Inbox(messages)
    while (msg := inbox.next())[0] != "close":
        if msg[0] == "share":  # requests share rounds from now, until the parent sends ("share", 1)
            ended = serve_shared(view, explorer, link, start.settings, inbox, cancel, send, board)
            if ended == "close":
                return
            continue
        cancel.current = msg[1].id
        batch = EventBatch(send, msg[1].id)
        for event in serve_request(view, explorer, link, msg[1], start.settings):
            if rank == 0:
                batch.add(event)
