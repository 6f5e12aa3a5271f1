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

from .config import DexConfig, DexError, add_flags, from_args

# DexConfig fields that make sense per rank (backend and devices are fixed by torchrun)
FLAGS = ("model", "depths", "adapters", "decs", "max_new_tokens", "temperature", "top_k", "top_p", "seed",
         "eos_token_id", "chat", "dtype", "threads", "op_timeout", "start_timeout")
USAGE = "torchrun --nproc-per-node 4 -m dex_core.serve --prompt 'Hello'"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--prompt", action="append", help="a prompt (repeatable); default: lines of stdin")
    add_flags(parser, DexConfig, FLAGS)


def run(args: argparse.Namespace) -> None:
    """Serve the prompts of ``args`` as this torchrun rank."""
    import torch
    import torch.distributed as dist

    from .adapters import choose_depths, resolve_adapters
    from .group import default_threads
    from .console import TextStream, print_report
    from .lattice import resolve_prune
    from .models import load_model
    from .proposal import adapter_ranking, shortlist_ids
    from .rank import join_group, serve_request, stage_payload
    from .request import encode_prompt, eos_ids, make_request
    from .trace import start_event

    if "WORLD_SIZE" not in os.environ:
        raise DexError(f"dex serve runs one explorer per process under torchrun, e.g. {USAGE}")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    config = from_args(DexConfig, args, explorers=world)
    model, tokenizer = load_model(config.model, dtype=config.dtype)
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
    del model
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    device = f"cuda:{local}" if local < gpus else "cpu"
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
        for event in serve_request(view, depths, explorer, link, box[0], config.decs, 0, prune[0]):
            if rank == 0 and event["event"] == "round" and event["commit"]:
                stream.push(event["commit"]["token"])
        if rank == 0:
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
