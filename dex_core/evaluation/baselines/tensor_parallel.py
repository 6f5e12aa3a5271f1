"""Tensor parallelism as an AR baseline (``dex bench``'s ``ar-tp``): transformers' own tensor-parallel loading,
``from_pretrained(folder, tp_plan="auto")`` under torch.distributed (gloo on CPU, NCCL on GPUs), never a
sharding of ours.

``TensorParallelAR`` starts one fresh interpreter per TP rank, as ``ExplorerGroup`` starts explorers: the
environment torchrun would give it (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``), the rendezvous in a private
folder (``rank.init_world``), an authenticated local connection to its parent, and an end of its own within a
second of the parent's death. Each rank loads the checkpoint folder sharded by the model's own plan; every rank
then runs the AR reference's loop (``ar_stream``: its sampler, the model's token ids as the only generation
settings) over the same requests in lockstep. The logits are gathered on every rank, so every rank chooses the
same token; rank 0 answers each request with the tokens and its seconds (with the prefill, and the prefill apart).

The size must divide the attention and the KV head counts (the plan splits heads across ranks): ``tp_size``
refuses any other before a process starts. In float64 ar-tp equals AR token for token; in float32 or bfloat16
the sharded matmuls sum in another order and can flip near-ties, so ``dex bench`` certifies its tokens one by
one (``evaluation.verify``) as it does every method's.
"""

from __future__ import annotations

import argparse
import atexit
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
import weakref
from dataclasses import dataclass
from datetime import timedelta
from multiprocessing.connection import Client, Listener, wait
from pathlib import Path

import torch

from ...config import DexError, GenerationOptions
from ...device import dtype_name, exact_float32_matmuls
from ...distributed.placement import default_threads
from ...distributed.rank import exit_with_parent, init_world, leave
from ...log import libraries_quiet, quiet_libraries
from ...runtime.reference import ar_stream
from ...trace.events import TokenEvent

KEY_ENV = "DEX_TP_KEY"
SILENT_SECONDS = 600.0  # the longest a rank may take to start (imports, its shard) or to answer one request
_LIVE: weakref.WeakSet = weakref.WeakSet()


class TensorParallelError(RuntimeError):
    """A tensor-parallel rank failed; the message names the rank and the cause."""


def head_counts(config) -> tuple[int, int]:
    """(attention heads, KV heads) of a model config (a multimodal one's text config)."""
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    heads = config.num_attention_heads
    return heads, getattr(config, "num_key_value_heads", None) or heads


def tp_sizes(config) -> list[int]:
    """The TP sizes (>= 2) that divide both head counts."""
    heads, kv = head_counts(config)
    return [n for n in range(2, math.gcd(heads, kv) + 1) if heads % n == 0 and kv % n == 0]


def tp_size(config, size: int | None = None) -> int:
    """``size`` if it divides both head counts, or (None) the smallest such size >= 2; else a DexError."""
    heads, kv = head_counts(config)
    sizes = tp_sizes(config)
    if size is None and sizes:
        return sizes[0]
    if size in sizes:
        return size
    works = f"sizes that work: {', '.join(map(str, sizes))}" if sizes else "no size >= 2 divides both"
    asked = "tensor parallelism" if size is None else f"tp_size {size}"
    raise DexError(
        f"{asked} needs a size that divides the model's {heads} attention heads and {kv} KV heads; {works}"
    )


def tp_devices(device, size: int) -> list[str]:
    """One device per rank: all CPU, or ``cuda:0..size-1`` (transformers binds rank k to ``cuda:k``)."""
    if torch.device(device).type == "cpu":
        return ["cpu"] * size
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus < size:
        raise DexError(
            f"tensor parallelism over {size} ranks needs {size} GPUs, one per rank; {gpus} visible "
            "(choose a smaller tp_size or run it on the CPU)"
        )
    return [f"cuda:{k}" for k in range(size)]


@dataclass
class TPAnswer:
    """Rank 0's answer to one request."""

    tokens: list[int]
    seconds: float  # the whole generation on rank 0, prefill included
    prefill_seconds: float  # of which the prompt's forward and the first token
    stop: str  # "eos" or "length"


def _config(folder):
    # deferred: transformers takes seconds to import (docs/ARCHITECTURE.md, Imports)
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(folder)


def _close_all() -> None:
    for group in list(_LIVE):
        group.close()


class TensorParallelAR:
    """``size`` rank processes (None: the smallest size that divides the heads), each holding its shard of the
    model in ``source`` (a checkpoint folder, or a model built in memory, saved first into the group's private
    folder), loaded in ``dtype`` on ``device``.
    ``generate`` runs one request on every rank; ``close`` (or interpreter exit) ends them."""

    def __init__(
        self, source, size: int | None, dtype: torch.dtype, device="cpu", threads: int | None = None
    ):
        in_memory = not isinstance(source, (str, Path))
        self.size, self.dtype = tp_size(source.config if in_memory else _config(source), size), dtype
        self.devices = tp_devices(device, self.size)  # refused sizes and devices start no process
        self.threads = threads or default_threads(self.size)
        self._procs: list[subprocess.Popen] = []
        self._tmp = Path(tempfile.mkdtemp(prefix="dex-tp-"))
        if in_memory:
            source.save_pretrained(self._tmp / "model")
            source = self._tmp / "model"
        self.folder = Path(source)
        self._start()

    def _start(self) -> None:
        if not _LIVE:
            atexit.register(_close_all)
        _LIVE.add(self)
        key = os.urandom(32)
        entry = "from dex_core.evaluation.baselines.tensor_parallel import main; main()"  # never the caller's __main__
        for k, device in enumerate(self.devices):
            env = dict(
                os.environ,
                **{KEY_ENV: key.hex(), "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)},
                RANK=str(k),
                WORLD_SIZE=str(self.size),
                LOCAL_RANK=str(torch.device(device).index or 0),
                LOCAL_WORLD_SIZE=str(self.size),
            )
            if device == "cpu":
                env["CUDA_VISIBLE_DEVICES"] = ""  # transformers puts the mesh on the accelerator it sees
            args = ["--model", str(self.folder), "--dtype", dtype_name(self.dtype), "--device", device]
            args += ["--folder", str(self._tmp), "--threads", str(self.threads), "--parent", str(os.getpid())]
            args += ["--quiet", str(int(libraries_quiet()))]
            self._procs.append(
                subprocess.Popen([sys.executable, "-c", entry, *args], env=env, stdin=subprocess.DEVNULL)
            )
        try:
            self._conns = [self._connect(k, key) for k in range(self.size)]
            self._answers(SILENT_SECONDS, "loading its shard")
        except BaseException:
            self.close()
            raise

    def _connect(self, rank: int, key: bytes):
        address, deadline = str(self._tmp / f"rank-{rank}.sock"), time.monotonic() + SILENT_SECONDS
        while True:
            try:
                return Client(address, family="AF_UNIX", authkey=key)
            except (FileNotFoundError, ConnectionRefusedError):
                self._check(rank if time.monotonic() > deadline else None, "starting")
                time.sleep(0.05)

    def _check(self, silent: int | None, doing: str, got: dict | None = None) -> None:
        """Raise for a rank that raised (its message in ``got``), then for one that died, then for ``silent``
        (a rank past its deadline); the group is ended first."""
        got = got or {}
        failed = [(k, m) for k, m in sorted(got.items()) if m[0] == "error"]
        dead = [(k, p.returncode) for k, p in enumerate(self._procs) if p.poll() is not None and k not in got]
        if failed:
            rank, (_, cause, trace) = failed[0]
            self._fail(f"tensor-parallel rank {rank} failed while {doing}: {cause}\n{trace}")
        if dead:
            self._fail(f"tensor-parallel rank {dead[0][0]} died while {doing} (exit code {dead[0][1]})")
        if silent is not None:
            self._fail(f"tensor-parallel rank {silent} sent nothing while {doing}; every rank is ended")

    def _fail(self, message: str) -> None:
        self.close()
        raise TensorParallelError(message)

    def _answers(self, timeout: float, doing: str) -> list:
        """One message from every rank, by rank; a rank that died, raised or stayed silent ends the group."""
        got: dict = {}
        deadline = time.monotonic() + timeout
        while len(got) < self.size:
            waiting = [c for k, c in enumerate(self._conns) if k not in got]
            for conn in wait(waiting, timeout=0.1):
                try:
                    got[self._conns.index(conn)] = conn.recv()
                except (EOFError, OSError):  # that rank is gone; its exit code says how
                    rank = self._conns.index(conn)
                    try:
                        self._procs[rank].wait(timeout=5)
                    except subprocess.TimeoutExpired:
                        got[rank] = ("error", "it closed its connection", "")
                    self._check(None, doing, got)
            late = min((k for k in range(self.size) if k not in got), default=None)
            self._check(late if time.monotonic() > deadline else None, doing, got)
        return [got[k] for k in range(self.size)]

    def generate(
        self, prompt: list[int], max_new_tokens: int | None = None, options: GenerationOptions | None = None
    ) -> TPAnswer:
        """``prompt`` (token ids) decoded on every rank as ``ar_generate`` would (greedy unless ``options``
        samples, with its seed); rank 0's tokens and seconds."""
        if not self._procs:
            raise TensorParallelError("the tensor-parallel ranks are closed; start a new TensorParallelAR")
        options = GenerationOptions.build(options, max_new_tokens=max_new_tokens)
        for conn in self._conns:
            try:
                conn.send(("generate", list(prompt), options))
            except OSError:  # that rank is gone
                self._check(self._conns.index(conn), "taking a request")
        return self._answers(SILENT_SECONDS, "generating")[0][1]

    def close(self) -> None:
        """End every rank (politely, then by signal) and remove the private folder."""
        for conn in getattr(self, "_conns", []):
            try:
                conn.send(("close",))
            except OSError:
                pass
        self._conns = []
        for p in self._procs:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self._procs = []
        _LIVE.discard(self)
        shutil.rmtree(self._tmp, ignore_errors=True)

    def __enter__(self) -> TensorParallelAR:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _load(args):
    """Join the world (the rendezvous in the group's folder) and load this rank's shard by the model's plan."""
    # deferred: transformers takes seconds to import (docs/ARCHITECTURE.md, Imports)
    import transformers
    from transformers import AutoModelForCausalLM

    if args.quiet:  # as the parent's libraries are (dex_core.log.quiet_libraries)
        transformers.utils.logging.disable_progress_bar()
        transformers.utils.logging.set_verbosity_error()
    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    rendezvous = (Path(args.folder) / "rendezvous").as_uri()
    init_world(args.device, rendezvous, rank, size, timedelta(seconds=SILENT_SECONDS))
    if hasattr(transformers, "DistributedConfig"):  # the form that does not warn from transformers 5 on
        plan = {"distributed_config": transformers.DistributedConfig(tp_plan="auto", tp_size=size)}
    else:
        plan = {"tp_plan": "auto"}
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=getattr(torch, args.dtype), **plan)
    return model.eval()


def _generate(model, prompt: list[int], options: GenerationOptions) -> TPAnswer:
    seconds, end = [], None
    for event in ar_stream(model, prompt, options=options):
        if isinstance(event, TokenEvent):
            seconds.append(event.seconds)
        end = event
    return TPAnswer(end.tokens, seconds[-1] if seconds else 0.0, seconds[0] if seconds else 0.0, end.stop)


def main(argv=None) -> None:
    """Body of a rank process: load the shard, then serve the parent's requests until told to close."""
    parser = argparse.ArgumentParser(prog="dex_core.evaluation.baselines.tensor_parallel")
    for flag in ("--model", "--dtype", "--device", "--folder"):
        parser.add_argument(flag, required=True)
    for flag in ("--threads", "--parent", "--quiet"):
        parser.add_argument(flag, type=int, required=True)
    args = parser.parse_args(argv)
    exact_float32_matmuls()  # once per process: float32 stays float32 (device.py)
    torch.set_num_threads(args.threads)
    exit_with_parent(args.parent, args.folder if int(os.environ["RANK"]) == 0 else None)
    rank, key = int(os.environ["RANK"]), bytes.fromhex(os.environ.pop(KEY_ENV))
    with Listener(os.path.join(args.folder, f"rank-{rank}.sock"), family="AF_UNIX", authkey=key) as listener:
        conn = listener.accept()
    _serve(conn, args)


def _serve(conn, args) -> None:
    """Load the shard, then answer requests until told to close; on a failure report it and leave at once, so
    that the peers notice."""
    try:
        with quiet_libraries(bool(args.quiet)):
            model = _load(args)
        answer = ("ready", None)
        with torch.inference_mode():
            while (request := _exchange(conn, answer))[0] == "generate":
                answer = ("done", _generate(model, request[1], request[2]))
    except BaseException as err:
        try:
            conn.send(("error", f"{type(err).__name__}: {err}".strip(), traceback.format_exc()))
        except OSError:
            pass
        os._exit(1)
    torch.distributed.destroy_process_group()
    os._exit(0)  # the interpreter's own exit (transformers loaded) takes seconds; nothing is left to flush


def _exchange(conn, answer: tuple) -> tuple:
    """Send ``answer`` to the parent and return its next request; leave quietly if the parent is gone."""
    try:
        conn.send(answer)
        return conn.recv()
    except (EOFError, OSError):
        leave(0)
