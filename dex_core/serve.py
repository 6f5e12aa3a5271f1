"""The torchrun entry point: one explorer per rank, across processes or nodes.

``torchrun --nproc-per-node K -m dex_core.serve --model SPEC --prompt ...`` (or ``dex serve`` under
torchrun): each rank loads the model itself, keeps its stage, and rank 0 reads the prompts
(``--prompt``, repeatable, else one per line on stdin), broadcasts each typed request on the control
group and prints the text and the stats.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings

import torch

from .config import DexConfig, DexError
from .flags import add_flags, from_args

# DexConfig fields that make sense per rank (backend and devices are fixed by torchrun; device: auto, cuda or cpu)
FLAGS = ("model", "depths", "adapters", "decs", "max_new_tokens", "temperature", "top_k", "top_p", "seed",
         "eos_token_id", "chat", "dtype", "device", "threads", "op_timeout", "start_timeout")
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
        raise DexError(f"under torchrun each rank takes the GPU of its LOCAL_RANK: give --device auto, cuda or cpu "
                       f"(choose the GPUs with CUDA_VISIBLE_DEVICES); got {want!r}")
    if gpus == 0:
        raise DexError("--device cuda, but this rank sees no GPU: check CUDA_VISIBLE_DEVICES or use --device cpu")
    if gpus >= ranks:
        return f"cuda:{local}"
    if gpus == 1:
        return "cuda:0"
    raise DexError(f"this node shows {gpus} GPUs to {ranks} ranks, and NCCL needs one GPU per rank: start at most "
                   f"{gpus} ranks per node (--nproc-per-node {gpus}), give each rank its own GPU "
                   "(CUDA_VISIBLE_DEVICES per rank), or run every rank on CPU (--device cpu)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--prompt", action="append", help="a prompt (repeatable); default: lines of stdin")
    add_flags(parser, DexConfig, FLAGS)


def run(args: argparse.Namespace) -> None:
    """Serve the prompts of ``args`` as this torchrun rank."""
    import torch.distributed as dist

    from .adapters import choose_depths, resolve_adapters
    from .group import default_threads
    from .console import TextStream, print_report
    from .device import resolve_prune
    from .models import load_model
    from .proposal import adapter_ranking, shortlist_ids
    from .rank import join_group, serve_request, stage_payload
    from .request import GenerationConfigWarning, encode_prompt, eos_ids, ignored_settings, make_request
    from .trace import round_commits, start_event

    if "WORLD_SIZE" not in os.environ:
        raise DexError(f"dex serve runs one explorer per process under torchrun, e.g. {USAGE}")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    config = from_args(DexConfig, args, explorers=world)
    device = torchrun_device(os.environ, config.device)  # before the model loads: fail fast
    model, tokenizer = load_model(config.model, dtype=config.dtype, device="cpu")  # each rank moves only its stage
    depths, how = choose_depths(model, config)
    if len(depths) != world:
        raise DexError(f"{len(depths)} exploration depths {list(depths)} need {len(depths)} processes; "
                       f"torchrun started {world}")
    adapters = resolve_adapters(config.adapters, model, depths)
    eos = eos_ids(model, config.eos_token_id)
    shortlist = shortlist_ids(model.config.vocab_size, depths, config.proposal_vocab,
                              adapter_ranking(config.adapters, model), tokenizer)
    payload = stage_payload(model, depths, rank, adapters.get(depths[rank]), shortlist)
    L, rows = model.config.num_hidden_layers, model.config.vocab_size if shortlist is None else len(shortlist)
    if rank == 0:  # the ranks rebuild the model from its config: say now what its generation config asks for
        for note in ignored_settings(model.generation_config, config.generation()):
            warnings.warn(note, GenerationConfigWarning, stacklevel=1)
    del model
    torch.set_num_threads(config.threads or default_threads(world))
    view, explorer, link = join_group(payload, device, "env://", world, 0, config.op_timeout, config.start_timeout)
    prune = [resolve_prune(config.prune, [device])]  # rank 0's choice, so that every rank plans the same lattice
    dist.broadcast_object_list(prune, src=0, group=link.ctrl)
    prompts = iter(args.prompt or (line.rstrip("\n") for line in sys.stdin))
    while True:
        request = None
        if rank == 0:
            text = next(prompts, None)
            while text is not None and not text.strip():
                text = next(prompts, None)
            if text is not None:
                ids = encode_prompt(tokenizer, text, config.chat)
                request = make_request(view, ids, config.generation(), eos)
        box = [request]
        dist.broadcast_object_list(box, src=0, group=link.ctrl)
        if box[0] is None:
            break
        stream, tic = TextStream(tokenizer), time.perf_counter()
        for event in serve_request(view, depths, explorer, link, box[0], config.decs, 0, prune[0], config.draft):
            for commit in round_commits(event) if rank == 0 and event["event"] == "round" else []:
                stream.push(commit["token"])
        if rank == 0:
            stream.finish()
            start = start_event("dex", depths, L, box[0], config.decs, adapters, rows, how, prune[0])
            print_report(event["stats"], start, time.perf_counter() - tic, "distributed")
    dist.destroy_process_group()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="dex_core.serve", description=f"One DEX explorer per rank: {USAGE}")
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        run(args)
    except DexError as err:
        print(f"dex serve: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
