"""How fast the debugger's figures build from a real trace, and DEX's bookkeeping share of round time.

    python benchmarks/figure_timing.py --explorers 4 --tokens 24 --repeats 5

Generates one greedy DEX trace on the default model (K = 4, 24 new tokens by default), replays it into
per-round views, then times each figure's build for every view (after one warm-up call that imports
plotly): the lattice figure, the token strip, the FSM panel and the round table. It prints the median
and p95 build time per figure and for a whole frame (all four), against the 100 ms per frame the
debugger aims for, and the generation's bookkeeping share (plan + masks + commit + collapse over round
time) against its 10 % goal. ``--out`` writes the numbers as JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import visualize as viz
from dex_core import DexConfig, DexDecoder, load_model
from dex_core.config import DEVICE_HELP

FIGURES = {
    "lattice_figure": viz.lattice_figure,
    "tokens_html": viz.tokens_html,
    "fsm_html": viz.fsm_html,
    "round_table_html": viz.round_table_html,
}
FRAME_GOAL_SECONDS = 0.1
BOOKKEEPING_GOAL = 0.10


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values``, nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="default")
    parser.add_argument("--device", default=DexConfig.device, help=DEVICE_HELP)
    parser.add_argument("--explorers", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=24, help="new tokens in the timed trace")
    parser.add_argument("--prompt", default="def fibonacci(n):")
    parser.add_argument("--repeats", type=int, default=5, help="builds per figure and view")
    parser.add_argument("--out", help="write the results as JSON here")
    args = parser.parse_args(argv)

    model, tokenizer = load_model(args.model, device=args.device)
    prompt = tokenizer(args.prompt)["input_ids"]
    result = DexDecoder(model, explorers=args.explorers, tokenizer=tokenizer).generate(prompt, args.tokens)
    views = viz.replay(result.trace)
    for build in FIGURES.values():  # warm-up: imports plotly, fills caches
        build(views[0])

    seconds: dict[str, list[float]] = {name: [] for name in FIGURES}
    frames: list[float] = []
    for _ in range(args.repeats):
        for view in views:
            frame = 0.0
            for name, build in FIGURES.items():
                tic = time.perf_counter()
                build(view)
                elapsed = time.perf_counter() - tic
                seconds[name].append(elapsed)
                frame += elapsed
            frames.append(frame)

    rows = {
        name: {"median_ms": 1e3 * statistics.median(s), "p95_ms": 1e3 * percentile(s, 0.95)}
        for name, s in {**seconds, "frame": frames}.items()
    }
    print(
        f"{args.model}, K={args.explorers} {list(result.stats.depths)}, {len(result.tokens)} tokens, "
        f"{len(views)} views x {args.repeats} repeats"
    )
    for name, row in rows.items():
        print(f"  {name:<17} median {row['median_ms']:7.2f} ms   p95 {row['p95_ms']:7.2f} ms")
    frame_ok = rows["frame"]["median_ms"] < 1e3 * FRAME_GOAL_SECONDS
    share = result.stats.bookkeeping_share
    print(
        f"frame median {'within' if frame_ok else 'OVER'} the {1e3 * FRAME_GOAL_SECONDS:.0f} ms goal; "
        f"largest lattice {max(viz.lattice_size(v) for v in views)} nodes"
    )
    print(
        f"bookkeeping share of round time {100 * share:.2f}% "
        f"({'within' if share < BOOKKEEPING_GOAL else 'OVER'} the {100 * BOOKKEEPING_GOAL:.0f}% goal)"
    )
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(
                {
                    "model": args.model,
                    "explorers": args.explorers,
                    "tokens": len(result.tokens),
                    "views": len(views),
                    "repeats": args.repeats,
                    "figures": rows,
                    "bookkeeping_share": share,
                },
                fh,
                indent=1,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
