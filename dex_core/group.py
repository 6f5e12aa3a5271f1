"""Explorer processes for the distributed schedule: the group a parent spawns, and the per-rank body.

``ExplorerGroup`` (behind ``DexDecoder(..., backend="distributed")``): the parent spawns K processes,
hands each only its stage's weights (stage 0 also the embeddings; every rank the final norm and LM
head to propose candidates), sends typed ``Request``s on per-rank queues and receives rank 0's trace
events on a result queue. The processes idle on their queues between calls. ``join_group`` and
``serve_request`` are the per-rank body, shared with the torchrun entry point (``dex_core.serve``).

Faults: a rank that raises reports ``(rank, cause)`` to the parent and exits at once, which closes
its sockets, so its peers fail within about a second; the parent also watches exit codes. Either
way the parent ends every process and raises ``ExplorerError``; the next call starts a fresh group.
"""

from __future__ import annotations

import dataclasses
import os
import queue
import shutil
import tempfile
import time
import traceback
from datetime import timedelta

import torch

from .config import DecoderOptions, DexError, default_threads, stage_bounds
from .engine import run_rounds
from .explorer import Explorer
from .models import model_view
from .request import Request
from .transport import DistLink

_PEER_LOSS = ("Connection closed by peer", "Connection reset", "Broken pipe", "timed out", "Timeout",
              "NCCL communicator was aborted")


class ExplorerError(RuntimeError):
    """An explorer process failed; the message names the rank and the cause."""


def resolve_devices(devices, count: int) -> list[str]:
    """One device per explorer: the given list, else cuda:0..K-1 when K GPUs are visible, else cpu."""
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if devices is None:
        return [f"cuda:{k}" for k in range(count)] if gpus >= count else ["cpu"] * count
    devices = [str(d) for d in devices]
    if len(devices) != count:
        raise DexError(f"devices lists {len(devices)} devices for {count} explorers; give one per explorer")
    kinds = {torch.device(d).type for d in devices}
    if not kinds <= {"cpu", "cuda"} or len(kinds) > 1:
        raise DexError(f"devices must be all cpu or all cuda:N; got {devices}")
    for d in devices:
        index = torch.device(d).index
        if torch.device(d).type == "cuda" and (index is None or index >= gpus):
            raise DexError(f"{d} is not available: {gpus} GPU(s) visible for {count} explorers; "
                           f"use fewer explorers or devices=cpu")
    return devices


def stage_payload(model, depths, rank: int, adapter=None) -> dict:
    """The config and the tensors explorer ``rank`` needs (its layers, norm, LM head; rank 0 embeddings)."""
    start, stop = stage_bounds(depths, rank)
    prefixes = tuple(f"model.layers.{i}." for i in range(start, stop)) + ("model.norm.", "lm_head.")
    if rank == 0:
        prefixes += ("model.embed_tokens.",)
    state = model.state_dict()
    tensors = {k: v for k, v in state.items() if k.startswith(prefixes)}
    if "lm_head.weight" not in tensors:  # tied embeddings saved once
        tensors["lm_head.weight"] = state["model.embed_tokens.weight"]
    return {"config": model.config, "tensors": tensors, "depths": list(depths), "rank": rank, "adapter": adapter}


def build_stage_model(payload: dict, device: str):
    """A model skeleton on the meta device holding real tensors only for this stage."""
    from transformers import AutoModelForCausalLM

    config = payload["config"]
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    tensors = {k: v.to(device) for k, v in payload["tensors"].items()}
    model.load_state_dict(tensors, strict=False, assign=True)
    with torch.device(device):  # the rotary buffers are computed, not loaded
        model.model.rotary_emb = type(model.model.rotary_emb)(config=config)
    adapter = payload["adapter"]
    return model.eval(), (adapter.to(device) if adapter is not None else None)


def join_group(payload: dict, device: str, init_method: str | None, count: int, trace_top: int,
               op_timeout: float, start_timeout: float, cancel=None):
    """Join the process group as explorer ``payload['rank']``; return (view, explorer, link)."""
    import torch.distributed as dist

    rank = payload["rank"]
    backend = "nccl" if torch.device(device).type == "cuda" else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=count,
                                timeout=timedelta(seconds=start_timeout))
    ctrl = dist.new_group(backend="gloo") if backend == "nccl" else None
    model, adapter = build_stage_model(payload, device)
    view = model_view(model)
    start, stop = stage_bounds(payload["depths"], rank)
    explorer = Explorer(view, rank, count, start, stop, adapter)
    link = DistLink(rank, count, model.config.hidden_size, view.dtype, device, ctrl, trace_top, op_timeout, cancel)
    return view, explorer, link


def serve_request(view, depths, explorer, link, request: Request, decs: bool, trace_top: int):
    """Run one generation request on this rank; yields the trace events (identical on every rank)."""
    with torch.no_grad():
        yield from run_rounds(view, depths, [explorer], link, request, decs, trace_top)


def _worker(payload, opts, requests, results, cancel) -> None:
    """Body of a spawned explorer process."""
    rank = payload["rank"]
    try:
        torch.set_num_threads(opts["threads"])
        view, explorer, link = join_group(payload, opts["device"], opts["init_method"], opts["count"],
                                          opts["trace_top"], opts["op_timeout"], opts["start_timeout"], cancel)
        del payload
        results.put(("ready", rank, None))
        while (request := requests.get()) is not None:
            for event in serve_request(view, opts["depths"], explorer, link, request, opts["decs"], opts["trace_top"]):
                if rank == 0:
                    results.put(("event", request.id, event))
    except BaseException as err:  # report, flush, and leave at once so the peers notice
        cause = f"{type(err).__name__}: {err}".strip()
        results.put(("error", rank, (cause, traceback.format_exc())))
        results.close()
        results.join_thread()
        os._exit(1)
    import torch.distributed as dist

    dist.destroy_process_group()


class ExplorerGroup:
    """K explorer processes owned by this (parent) process; see the module docstring."""

    def __init__(self, model, depths, adapters: dict, options: DecoderOptions):
        self.model, self.depths, self.adapters = model, list(depths), dict(adapters)
        self.count = len(self.depths)
        self.devices = resolve_devices(options.devices, self.count)
        self.threads = options.threads or default_threads(self.count)
        self.decs, self.trace_top = options.decs, options.trace_top
        self.op_timeout, self.start_timeout = options.op_timeout, options.start_timeout
        self._procs: list | None = None
        self._next_id = 0
        self.start()

    @property
    def alive(self) -> bool:
        return self._procs is not None

    def pids(self) -> list[int]:
        return [p.pid for p in self._procs or []]

    def start(self) -> None:
        ctx = torch.multiprocessing.get_context("spawn")
        self._tmp = tempfile.mkdtemp(prefix="dex-group-")
        self._requests = [ctx.Queue() for _ in range(self.count)]
        self._results = ctx.Queue()
        self._cancel = ctx.Event()
        self._procs = []
        for rank in range(self.count):
            opts = {"device": self.devices[rank], "threads": self.threads, "count": self.count,
                    "init_method": "file://" + os.path.join(self._tmp, "rendezvous"), "depths": self.depths,
                    "decs": self.decs, "trace_top": self.trace_top, "op_timeout": self.op_timeout,
                    "start_timeout": self.start_timeout}
            payload = stage_payload(self.model, self.depths, rank, self.adapters.get(self.depths[rank]))
            proc = ctx.Process(target=_worker, name=f"dex-explorer-{rank}", daemon=True,
                               args=(payload, opts, self._requests[rank], self._results, self._cancel))
            proc.start()
            self._procs.append(proc)
        ready: set[int] = set()
        deadline = time.monotonic() + self.start_timeout
        while len(ready) < self.count:
            kind, rank, _ = self._get(deadline, "starting")
            if kind == "ready":
                ready.add(rank)

    def _get(self, deadline: float | None, doing: str):
        """Next message from the explorers; raises ExplorerError on a report, a death or the deadline."""
        while True:
            try:
                msg = self._results.get(timeout=0.1)
            except queue.Empty:
                msg = None
            if msg is not None:
                if msg[0] == "error":
                    self._fail([msg])
                return msg
            dead = [(k, p.exitcode) for k, p in enumerate(self._procs) if p.exitcode is not None]
            if dead:
                self._fail([], dead)
            if deadline is not None and time.monotonic() > deadline:
                self.close()
                raise ExplorerError(f"explorer processes did not answer within {self.start_timeout:.0f} s "
                                    f"while {doing}; raise start_timeout or check the devices")

    def _fail(self, errors: list, dead=()) -> None:
        """Collect the reports for a moment, end every process, and raise with the root cause."""
        settle = time.monotonic() + 1.0
        while time.monotonic() < settle:
            try:
                msg = self._results.get(timeout=0.05)
            except queue.Empty:
                continue
            if msg[0] == "error":
                errors.append(msg)
        self.close()
        if errors:
            root = next((e for e in errors if not any(s in e[2][0] for s in _PEER_LOSS)), errors[0])
            _, rank, (cause, tb) = root
            raise ExplorerError(f"explorer rank {rank} failed: {cause}\n--- traceback of rank {rank} ---\n{tb}")
        rank, code = dead[0]
        raise ExplorerError(f"explorer rank {rank} died (exit code {code}) without reporting an error")

    def run(self, request: Request):
        """Send a request to every explorer; yield rank 0's trace events until the end event."""
        if self._procs is None:
            self.start()
        rid, self._next_id = self._next_id, self._next_id + 1
        self._cancel.clear()
        for q in self._requests:
            q.put(dataclasses.replace(request, id=rid))
        finished = False
        try:
            while True:
                kind, key, event = self._get(None, "generating")
                if kind == "event" and key == rid:
                    finished = event["event"] == "end"
                    yield event
                    if finished:
                        return
        finally:
            if not finished and self._procs is not None:  # the caller stopped early: stop the ranks too
                self._cancel.set()
                deadline = time.monotonic() + self.op_timeout
                while self._procs is not None:
                    kind, key, event = self._get(deadline, "stopping")
                    if kind == "event" and key == rid and event["event"] == "end":
                        break

    def close(self) -> None:
        """Ask the explorers to exit, then end any that do not; remove the rendezvous folder."""
        if self._procs is None:
            return
        procs, self._procs = self._procs, None
        for q in self._requests:
            try:
                q.put(None)
            except (ValueError, OSError):
                pass
        deadline = time.monotonic() + 5.0
        for p in procs:
            p.join(timeout=max(0.0, deadline - time.monotonic()))
        for p in procs:
            if p.is_alive():
                p.terminate()
                p.join(timeout=2.0)
            if p.is_alive():
                p.kill()
                p.join(timeout=2.0)
        for q in self._requests + [self._results]:
            q.cancel_join_thread()
            q.close()
        shutil.rmtree(self._tmp, ignore_errors=True)

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
