"""The torchrun entry point: one explorer per rank, across processes or nodes.

``torchrun --nproc-per-node K -m dex_core.serving --model SPEC --prompt ...`` (or ``dex serve`` under
torchrun): every rank joins the launch through the decoder's face (``DecoderPool.open``, backend torchrun:
``DexDecoder.from_pretrained``): rank 0 resolves the run's settings (``RunSettings``) and hands them to the other
ranks through torchrun's rendezvous store; each rank then reads only its own part of the model from the checkpoint
(``dex_core.model.stage_load``; every node locates the model itself: the default model and .gguf files are converted
once per cache, hub models fetched once per HF cache); the other ranks serve rank 0's requests until it closes the
group. Rank 0 reads the prompts (``--prompt``, repeatable, else one per line on stdin), checks each once, streams it
through its decoder and prints the text and the stats.
"""

from __future__ import annotations

import argparse
import sys
import time

from ..config import DexConfig
from ..distributed.torchrun import world
from ..flags import add_flags, from_args
from ..runtime.console import TextStream, print_report
from ..runtime.request import check_text, encode_prompt
from .pool import DecoderPool

# DexConfig fields that make sense per rank (backend and devices are fixed by torchrun; device: auto, cuda or cpu)
FLAGS = (
    "model",
    "explorers",  # --http only: under torchrun K is the number of ranks
    "backend",  # --http only: sequential or distributed
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


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--prompt", action="append", help="a prompt (repeatable); default: lines of stdin")
    parser.add_argument(
        "--http",
        metavar="HOST:PORT",
        help="serve an OpenAI-compatible API there instead of reading prompts (under torchrun rank 0 serves; "
        "outside it, --backend sequential or distributed); docs/SERVING.md",
    )
    parser.add_argument(
        "--max-batch",
        type=int,
        default=None,
        help="--http: requests that share each round (sequential backend; each exact as alone); default: 8 "
        "(measured on CPU; GPUs not yet); 1 on explorer processes",
    )
    parser.add_argument("--queue", type=int, default=8, help="--http: requests waiting at most; more get 429")
    parser.add_argument(
        "--request-seconds",
        type=float,
        default=0,
        help="--http: model seconds a request may take (0: no bound)",
    )
    add_flags(parser, DexConfig, FLAGS)


def run(args: argparse.Namespace) -> None:
    """Serve the prompts of ``args`` as this torchrun rank (``--http`` is the entry point's:
    ``dex_core.serving.serve``)."""
    rank, count = world()
    config = from_args(DexConfig, args, explorers=count, backend="torchrun")
    try:  # ranks other than 0 serve rank 0's requests in here, then end (SystemExit 0)
        pool = DecoderPool.open(
            config.model, config.decoder(), dtype=config.dtype, device=config.device, log=rank_log(rank)
        )
    except SystemExit as done:
        if done.code:
            raise
        return
    try:
        _serve(args, config, pool.decoder(config.decoder()))
    finally:
        pool.close()


def rank_log(rank: int):
    """Rank 0 says what happens, on stderr; the other ranks say nothing."""
    if rank != 0:
        return lambda line: None
    return lambda line: print(f"[dex] {line}", file=sys.stderr, flush=True)


def _serve(args, config: DexConfig, decoder) -> None:
    """Rank 0: each prompt as a request to every rank; the answers printed as they come, then the stats."""
    for text in args.prompt or (line.rstrip("\n") for line in sys.stdin):
        if not text.strip():
            continue
        ids = encode_prompt(decoder.tokenizer, check_text(text), config.chat)
        stream, tic, events = TextStream(decoder.tokenizer), time.perf_counter(), []
        for event in decoder.stream(ids, options=config.generation()):
            events.append(event)
            for commit in event.commits:
                stream.push(commit.token)
        stream.finish()
        print_report(events[-1].stats, events[0], time.perf_counter() - tic, "distributed")
