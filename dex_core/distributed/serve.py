"""The torchrun entry point: one explorer per rank, across processes or nodes.

``torchrun --nproc-per-node K -m dex_core.serve --model SPEC --prompt ...`` (or ``dex serve`` under
torchrun): rank 0 resolves the run's settings (``RunSettings``) and hands them to the other ranks through
torchrun's rendezvous store; each rank then reads only its own part of the model from the checkpoint
(``dex_core.model.stage_load``; every node locates the model itself: the default model and .gguf files are converted
once per cache, hub models fetched once per HF cache). Rank 0 reads the prompts (``--prompt``, repeatable, else
one per line on stdin), broadcasts each typed request on the control group and prints the text and the stats.
"""

from __future__ import annotations

import argparse
import os
import pickle
import sys
import time
import warnings
from datetime import timedelta

import torch
import torch.distributed as dist

from ..config import DexConfig, DexError
from ..device import exact_float32_matmuls, resolve_dtype
from ..flags import add_flags, from_args
from ..model.checkpoint import Checkpoint, locate
from ..model.stage_load import PartSource, checkpoint_identity, skeleton
from ..model.view import model_view
from ..runtime.console import TextStream, print_report
from ..runtime.request import GenerationConfigWarning, encode_prompt, eos_ids, ignored_settings, make_request
from ..runtime.settings import RunSettings, resolve_run
from ..trace.events import round_commits, start_event
from .group import IMPORT_SECONDS, LOAD_RATE
from .placement import default_threads
from .rank import connect, init_world, open_part, serve_request

# DexConfig fields that make sense per rank (backend and devices are fixed by torchrun; device: auto, cuda or cpu)
FLAGS = (
    "model",
    "depths",
    "adapters",
    "decs",
    "proposal_vocab",
    "prune",
    "draft",
    "max_new_tokens",
    "temperature",
    "top_k",
    "top_p",
    "seed",
    "eos_token_id",
    "chat",
    "dtype",
    "device",
    "threads",
    "op_timeout",
    "start_timeout",
)
USAGE = "torchrun --nproc-per-node 4 -m dex_core.serve --prompt 'Hello'"


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


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--prompt", action="append", help="a prompt (repeatable); default: lines of stdin")
    add_flags(parser, DexConfig, FLAGS)


def _settings(config: DexConfig, folder, hf_config, tokenizer, device: str) -> RunSettings:
    """Rank 0's resolution of the run's settings (the other ranks receive them)."""
    dtype = resolve_dtype(config.dtype, torch.device(device).type, hf_config)
    shape = skeleton(hf_config, dtype, folder)
    for note in ignored_settings(shape.generation_config, config.generation()):
        warnings.warn(note, GenerationConfigWarning, stacklevel=1)
    identity = checkpoint_identity(hf_config, Checkpoint(folder))
    return resolve_run(identity, model_view(shape), config.decoder(), torch.device(device).type, tokenizer)


def run(args: argparse.Namespace) -> None:
    """Serve the prompts of ``args`` as this torchrun rank."""
    if "WORLD_SIZE" not in os.environ:
        raise DexError(f"dex serve runs one explorer per process under torchrun, e.g. {USAGE}")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    config = from_args(DexConfig, args, explorers=world)
    device = torchrun_device(os.environ, config.device)  # before the model loads: fail fast
    log = (
        (lambda line: print(f"[dex] {line}", file=sys.stderr, flush=True))
        if rank == 0
        else (lambda line: None)
    )
    # deferred: transformers takes seconds to import (docs/ARCHITECTURE.md, Imports)
    from transformers import AutoConfig, AutoTokenizer

    folder = locate(config.model, log)
    hf_config, tokenizer = AutoConfig.from_pretrained(folder), AutoTokenizer.from_pretrained(folder)
    torch.set_num_threads(config.threads or default_threads(world))
    bound = (
        IMPORT_SECONDS
        + config.start_timeout
        + sum(
            p.numel() * p.element_size()
            for p in skeleton(
                hf_config, resolve_dtype(config.dtype, torch.device(device).type, hf_config)
            ).parameters()
        )
        / LOAD_RATE
    )
    # torchrun's env:// rendezvous (it may span nodes), on the data link every rank agrees on
    data, store = init_world(device, "env://", rank, world, timedelta(seconds=bound))
    if rank == 0:
        settings = _settings(config, folder, hf_config, tokenizer, device)
        if settings.K != world:
            raise DexError(
                f"{settings.K} exploration depths {list(settings.depths)} need {settings.K} processes; "
                f"torchrun started {world}"
            )
        store.set("dex-settings", pickle.dumps(settings))
    settings = pickle.loads(store.get("dex-settings"))  # rank 0's, through the rendezvous store
    view, explorer, _ = open_part(settings, PartSource(hf_config, folder=str(folder)), rank, device)
    link = connect(view, rank, world, data, device, 0, config.op_timeout)
    _serve(args, config, settings, tokenizer, view, explorer, link, rank)
    dist.destroy_process_group()


def _serve(
    args, config: DexConfig, settings: RunSettings, tokenizer, view, explorer, link, rank: int
) -> None:
    """Rank 0 reads the prompts and broadcasts each request; every rank serves it; rank 0 prints the answers."""
    prompts = iter(args.prompt or (line.rstrip("\n") for line in sys.stdin))
    while True:
        request = None
        if rank == 0:
            text = next(prompts, None)
            while text is not None and not text.strip():
                text = next(prompts, None)
            if text is not None:
                ids = encode_prompt(tokenizer, text, config.chat)
                request = make_request(
                    view, ids, config.generation(), eos_ids(view.model, config.eos_token_id)
                )
        box = [request]
        dist.broadcast_object_list(box, src=0, group=link.ctrl)
        if box[0] is None:
            return
        stream, tic = TextStream(tokenizer), time.perf_counter()
        for event in serve_request(view, explorer, link, box[0], settings):
            for commit in round_commits(event) if rank == 0 and event["event"] == "round" else []:
                stream.push(commit["token"])
        if rank == 0:
            stream.finish()
            start = start_event(
                "dex",
                settings.depths,
                view.num_layers,
                box[0],
                settings.decs,
                settings.adapters.depths,
                settings.proposal_vocab or view.vocab,
                settings.depth_choice,
                settings.prune,
            )
            print_report(event["stats"], start, time.perf_counter() - tic, "distributed")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="dex_core.serve", description=f"One DEX explorer per rank: {USAGE}")
    add_arguments(parser)
    args = parser.parse_args(argv)
    exact_float32_matmuls()  # once per process: float32 stays float32 (device.py)
    try:
        run(args)
    except DexError as err:
        print(f"dex serve: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
