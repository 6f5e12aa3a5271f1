"""``dex serve`` and ``python -m dex_core.serving`` (the entry point torchrun starts): under torchrun, this rank's
part of a group (``dex_core.serving.torchrun``); with ``--http``, the OpenAI-compatible API
(``dex_core.serving.api``) over the sequential or distributed schedule, or, under torchrun, on rank 0 while
every other rank follows its requests."""

import argparse
import os
import sys

from ..config import DexConfig, DexError
from ..device import exact_float32_matmuls
from ..distributed.torchrun import USAGE, world
from ..flags import from_args
from ..log import stderr
from . import torchrun


def run(args: argparse.Namespace) -> None:
    """Serve as ``args`` say (``dex_core.serving.torchrun.add_arguments``' flags)."""
    under_torchrun = "WORLD_SIZE" in os.environ
    if not args.http:
        return torchrun.run(args)
    if args.queue < 0 or args.request_seconds < 0:
        raise DexError("--queue and --request-seconds must be >= 0")
    if args.max_batch is not None and args.max_batch < 1:
        raise DexError("--max-batch must be >= 1")
    from .api import serve_http  # deferred: FastAPI and uvicorn load only to serve HTTP

    if under_torchrun:  # K is the launch's; rank 0 serves, the others follow (DexDecoder.from_pretrained)
        rank, count = world()
        config, log = from_args(DexConfig, args, explorers=count, backend="torchrun"), torchrun.rank_log(rank)
    else:
        config, log = from_args(DexConfig, args), stderr
    bounds = {"queue": args.queue, "seconds": args.request_seconds, "most": args.max_batch}
    serve_http(config, args.http, log, bounds)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="dex_core.serving", description=f"One DEX explorer per rank: {USAGE}"
    )
    torchrun.add_arguments(parser)
    args = parser.parse_args(argv)
    exact_float32_matmuls()  # once per process: float32 stays float32 (device.py)
    try:
        run(args)
    except DexError as err:
        print(f"dex serve: error: {err}", file=sys.stderr)
        return 2
    return 0
