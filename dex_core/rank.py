"""One explorer rank: its stage's weights, joining the process group, serving requests, and ``main``, the
body of a rank process that ``ExplorerGroup`` starts in a fresh interpreter (never re-importing the
caller's ``__main__``).

A started rank listens on a unix socket in the group's private folder, accepts its parent (the
connection is authenticated with a key the parent passes in the environment), loads its stage from a
safetensors file the parent wrote (stage 0 also the embeddings; every rank the final norm and LM head),
joins torch.distributed and then serves typed ``Request``s until told to close. It ends itself within
a second when its parent dies, idle or busy.
"""

from __future__ import annotations

import argparse
import copy
import inspect
import json
import os
import pickle
import queue
import socket
import sys
import threading
import time
import traceback
from datetime import timedelta
from pathlib import Path
from typing import NamedTuple

import torch

from .config import DexError, stage_bounds
from .engine import run_rounds
from .explorer import Explorer
from .models import model_view
from .proposal import ProposalHead
from .request import Request
from .transport import DistLink

KEY_ENV = "DEX_GROUP_KEY"
SHORTLIST = "proposal.shortlist"  # payload tensor: the token ids of a light proposal head


def stage_payload(model, depths, rank: int, adapter=None, shortlist=None) -> dict:
    """The config and the tensors explorer ``rank`` needs (its layers, norm, LM head; rank 0 embeddings;
    the shortlist of its light proposal head, if it has one)."""
    start, stop = stage_bounds(depths, rank)
    prefixes = tuple(f"model.layers.{i}." for i in range(start, stop)) + ("model.norm.", "lm_head.")
    if rank == 0:
        prefixes += ("model.embed_tokens.",)
    state = model.state_dict()
    tensors = {k: v for k, v in state.items() if k.startswith(prefixes)}
    if "lm_head.weight" not in tensors:  # tied embeddings saved once
        tensors["lm_head.weight"] = state["model.embed_tokens.weight"]
    if shortlist is not None and rank < len(depths) - 1:
        tensors[SHORTLIST] = shortlist
    adapter = None if adapter is None else copy.deepcopy(adapter).cpu()  # a rank places it on its own device
    return {"config": model.config, "tensors": {k: v.cpu() for k, v in tensors.items()}, "depths": list(depths),
            "rank": rank, "adapter": adapter}


def write_payload(payload: dict, folder: Path) -> Path:
    """Save a stage payload for a rank process: tensors as safetensors (mapped, not pickled), the rest pickled."""
    from safetensors.torch import save_file

    rank = payload["rank"]
    seen, tensors = {}, {}
    for k, v in payload["tensors"].items():  # tied weights share storage; safetensors wants them apart
        ptr = (v.untyped_storage().data_ptr(), v.storage_offset(), tuple(v.shape))
        tensors[k] = v.detach().clone() if ptr in seen else v.detach().contiguous()
        seen[ptr] = k
    save_file(tensors, str(folder / f"stage-{rank}.safetensors"))
    path = folder / f"stage-{rank}.pkl"
    path.write_bytes(pickle.dumps({k: v for k, v in payload.items() if k != "tensors"}))
    return path


def read_payload(path: Path) -> dict:
    from safetensors.torch import load_file

    payload = pickle.loads(path.read_bytes())  # written by this rank's own parent into its private folder
    payload["tensors"] = load_file(str(path.with_suffix(".safetensors")))
    return payload


def build_stage_model(payload: dict, device: str):
    """A model skeleton on the meta device holding real tensors only for this stage."""
    from transformers import AutoModelForCausalLM

    config = payload["config"]
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    tensors = {k: v.to(device) for k, v in payload["tensors"].items() if k != SHORTLIST}
    model.load_state_dict(tensors, strict=False, assign=True)
    with torch.device(device):  # the rotary buffers are computed, not loaded
        model.model.rotary_emb = type(model.model.rotary_emb)(config=config)
    adapter = payload["adapter"]
    return model.eval(), (adapter.to(device) if adapter is not None else None)


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
        raise DexError(f"the explorer ranks disagree on the device ({ranks}); every rank needs its own GPU or every "
                       "rank runs on CPU: give each rank a GPU (at most one rank per visible GPU, or one "
                       "CUDA_VISIBLE_DEVICES per rank) or hide the GPUs from all of them (CUDA_VISIBLE_DEVICES=)")
    staged = any(r.get("stage") for r in reports)
    if kinds[0] == "cpu":
        return DataLink("gloo", staged)
    seen: dict = {}
    for k, r in enumerate(reports):
        where = (r["host"], r["gpu"])
        if r["gpu"] is not None and where in seen:
            if not all(x.get("share") for x in reports):
                raise DexError(f"explorer ranks {seen[where]} and {k} are on the same GPU ({r['device']} on "
                               f"{r['host']}); NCCL refuses two ranks on one GPU: give each rank its own GPU or use "
                               "fewer explorers (torchrun ranks cannot share a GPU; DexDecoder(backend='distributed')"
                               " can, staging the rows through the host)")
            staged = True
        seen[where] = k
    return DataLink("gloo", True) if staged else DataLink("nccl", False)


def init_options(backend: str, device: str) -> dict:
    """Keywords of ``init_process_group`` beyond the rendezvous: on NCCL ``device_id``, so that the world's
    communicator forms inside the call, with every rank, not lazily at the first exchange."""
    import torch.distributed as dist

    if backend == "nccl" and "device_id" in inspect.signature(dist.init_process_group).parameters:
        return {"device_id": torch.device(device)}
    return {}


def init_world(device: str, init_method: str, rank: int, count: int, timeout: timedelta, share: bool = False,
               stage: bool = False) -> DataLink:
    """Rendezvous, agree on the data link over the rendezvous store (before any communicator exists, so a
    disagreement is a clear error on every rank, not a hang in ``new_group``), start the default process
    group on its backend, and return the link."""
    import torch.distributed as dist

    store, _, _ = next(dist.rendezvous(init_method, rank, count, timeout=timeout))
    store.set_timeout(timeout)
    board = dist.PrefixStore("dex-devices", store)
    board.set(str(rank), json.dumps(device_report(device, share, stage)))
    link = data_backend([json.loads(board.get(str(k))) for k in range(count)])
    if torch.device(device).type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(link.backend, store=dist.PrefixStore("default_pg", store), rank=rank, world_size=count,
                            timeout=timeout, **init_options(link.backend, device))
    return link


def join_group(payload: dict, device: str, init_method: str | None, count: int, trace_top: int,
               op_timeout: float, start_timeout: float, cancel=None, progress=None, share=False, stage=False):
    """Join the process group as explorer ``payload['rank']``; return (view, explorer, link), warmed up.
    ``share``/``stage``: see ``device_report``."""
    import torch.distributed as dist

    rank = payload["rank"]
    if dist.is_initialized():  # a world started elsewhere: rows on a GPU over gloo go through the host
        backend = dist.get_backend()
        data = DataLink(backend, stage or (backend == "gloo" and torch.device(device).type == "cuda"))
    else:
        data = init_world(device, init_method, rank, count, timedelta(seconds=start_timeout), share, stage)
    ctrl = dist.new_group(backend="gloo") if data.backend == "nccl" else None
    model, adapter = build_stage_model(payload, device)
    view = model_view(model)
    start, stop = stage_bounds(payload["depths"], rank)
    shortlist = payload["tensors"].get(SHORTLIST)
    explorer = Explorer(view, rank, count, start, stop, adapter, None if shortlist is None else ProposalHead(view, shortlist))
    link = DistLink(rank, count, model.config.hidden_size, view.dtype, device, ctrl, trace_top, op_timeout, cancel,
                    progress, data.staged)
    warm_up(link)
    return view, explorer, link


def warm_up(link: DistLink) -> None:
    """One row from each rank to the next, in which every rank takes part, before the first request. On NCCL
    the first exchange between two ranks sets up their connection (hundreds of ms); a fresh group's first
    round may involve only ranks 0 and 1 (a one-token prompt skips the prefill), and setup there must not
    wait for ranks that are already in the control all-gather."""
    row = torch.zeros(1, link.hidden_size, dtype=link.dtype, device=link.device)  # (1, hidden)
    link._swap(row, 1)
    link.reset()


def serve_request(view, depths, explorer, link, request: Request, decs: bool, trace_top: int, prune=None,
                  draft=None):
    """Run one generation request on this rank; yields the trace events (identical on every rank)."""
    with torch.no_grad():
        yield from run_rounds(view, depths, [explorer], link, request, decs, trace_top, prune=prune, draft=draft)


class _Cancel:
    """Set by the parent for one request id; the link asks ``is_set()`` each round."""

    def __init__(self):
        self.current, self.ids = None, set()

    def is_set(self) -> bool:
        return self.current in self.ids


def _watch_parent(parent: int) -> None:
    while True:  # re-parented (the parent died): leave, idle or busy
        if os.getppid() != parent:
            os._exit(0)
        time.sleep(0.5)


def _read(conn, inbox: queue.Queue, cancel: _Cancel) -> None:
    try:
        while True:
            msg = conn.recv()
            if msg[0] == "cancel":
                cancel.ids.add(msg[1])
            else:
                inbox.put(msg)
    except (EOFError, OSError):  # the parent is gone
        os._exit(0)


def main(argv=None) -> None:
    """Body of a rank process: ``--rank K --folder DIR --parent PID``, the key in $DEX_GROUP_KEY."""
    from multiprocessing.connection import Listener

    import torch.distributed as dist

    parser = argparse.ArgumentParser(prog="dex_core.rank")
    for flag in ("--rank", "--parent"):
        parser.add_argument(flag, type=int, required=True)
    parser.add_argument("--folder", required=True)
    args = parser.parse_args(argv)
    threading.Thread(target=_watch_parent, args=(args.parent,), daemon=True).start()
    folder, rank = Path(args.folder), args.rank
    key = bytes.fromhex(os.environ.pop(KEY_ENV))
    with Listener(str(folder / f"rank-{rank}.sock"), family="AF_UNIX", authkey=key) as listener:
        conn = listener.accept()
    lock, inbox, cancel = threading.Lock(), queue.Queue(), _Cancel()

    def send(*msg):
        with lock:
            conn.send(msg)

    try:
        opts = conn.recv()
        torch.set_num_threads(opts["threads"])
        threading.Thread(target=_read, args=(conn, inbox, cancel), daemon=True).start()
        view, explorer, link = join_group(read_payload(folder / f"stage-{rank}.pkl"), opts["device"],
                                          opts["init_method"], opts["count"], opts["trace_top"], opts["op_timeout"],
                                          opts["start_timeout"], cancel, lambda r: send("progress", rank, r),
                                          opts["share"], opts["stage"])
        send("ready", rank, DataLink(dist.get_backend(), link.staged))
        while (msg := inbox.get())[0] == "request":
            request = msg[1]
            cancel.current = request.id
            for event in serve_request(view, opts["depths"], explorer, link, request, opts["decs"], opts["trace_top"],
                                       opts["prune"], opts["draft"]):
                if rank == 0:
                    send("event", request.id, event)
    except BaseException as err:  # report, and leave at once so the peers notice
        try:
            send("error", rank, (f"{type(err).__name__}: {err}".strip(), traceback.format_exc()))
        except OSError:
            pass
        print(f"[dex] explorer rank {rank} failed:\n{traceback.format_exc()}", file=sys.stderr, flush=True)
        os._exit(1)
    dist.destroy_process_group()
