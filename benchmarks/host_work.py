"""Host work per round against the length of the context: is it flat?

    python benchmarks/host_work.py --contexts 256,1024,4096
    git worktree add /tmp/dex-head HEAD && python benchmarks/host_work.py --baseline /tmp/dex-head

A tiny random Llama (float32, 4 layers, hidden 64, ``max_position_embeddings`` 8192, one torch thread)
keeps the layers cheap, so the bookkeeping around them shows: for each context length N a prompt of N
random tokens is decoded greedily with K = 4 explorers (``--new`` tokens, token text and top-5 in the
trace), as the app's Live tab follows it. Per round, host work is what the round does besides its layers,
heads and token choice: from the round event's ``timings`` the plan, the masks, the commit, the collapse
(every explorer's cache commit) and the trace records; and, outside the engine, the replay index the Live
tab extends (``visualize.ReplayCache``) and the streamed text (``dex_core.console.TextStream``, per commit).
Per run, means over its rounds (a commit's cost spread over the rounds, as it is paid); of ``--repeat``
runs per context (different random prompts, contexts interleaved), the one with the least host work
(the least disturbed on a shared machine). The layers' time per round (stage forwards, heads, token
choice) is shown beside, for scale; ``late/early`` compares the host work of a run's last third of rounds
with its first third (work that grows with the run, such as re-indexing the trace, shows there).

``--baseline DIR`` runs the same measurement in a child process that imports ``dex_core`` and
``visualize`` from DIR (a checkout of another revision, e.g. a ``git worktree`` of HEAD) and prints both
tables. Acceptance (issue 21): host work per round at 4,096 tokens within ±30% of that at 256.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import sys
import time

from baseline import measured_in

ENGINE = ("plan", "masks", "commit", "collapse", "trace")
PARTS = (*ENGINE, "replay", "stream")


def measure(context: int, new: int, explorers: int, seed: int) -> dict[str, list[float]]:
    """Per-round seconds of each part of the host work, and of the layers, for one run."""
    import torch

    import visualize as viz
    from dex_core import DexDecoder
    from dex_core.runtime.console import TextStream
    from dex_core.testing import tiny_model, tiny_tokenizer
    from dex_core.trace.events import RoundEvent

    model = tiny_model(
        "llama", layers=4, hidden_size=64, intermediate_size=128, max_position_embeddings=8192, seed=seed
    ).to(torch.float32)
    tokenizer = tiny_tokenizer()
    prompt = torch.randint(0, 96, (context,), generator=torch.Generator().manual_seed(seed)).tolist()
    decoder = DexDecoder(model, explorers=explorers, tokenizer=tokenizer, trace_top=5, prune="none")
    cache, stream, events = viz.ReplayCache(size=2), TextStream(tokenizer, io.StringIO()), []
    parts: dict[str, list[float]] = {p: [] for p in (*PARTS, "layers")}
    for event in decoder.stream(prompt, new):
        events.append(event)
        if not isinstance(event, RoundEvent):
            continue
        tic = time.perf_counter()
        cache(events)[-1]
        parts["replay"].append(time.perf_counter() - tic)
        tic = time.perf_counter()
        for commit in event.commits:
            stream.push(commit.token)
        parts["stream"].append(time.perf_counter() - tic)
        t = event.timings
        for name in ENGINE:
            parts[name].append(t[name])
        parts["layers"].append(sum(t["expand"]) + t["decode"])
    return {name: values[1:] for name, values in parts.items()}  # the first round follows the prefill


def run(contexts: list[int], new: int, explorers: int, repeat: int) -> dict:
    import torch

    import dex_core

    torch.set_num_threads(1)
    runs: dict[int, list[dict]] = {c: [] for c in contexts}
    for seed in range(repeat):  # the contexts interleaved, so that a busy spell of the machine hits them all
        for context in contexts:
            parts = measure(context, new, explorers, seed)
            mean = {name: statistics.fmean(values) for name, values in parts.items()}
            host = [sum(round_parts) for round_parts in zip(*(parts[p] for p in PARTS))]
            third = len(host) // 3
            runs[context].append(
                {
                    **mean,
                    "host": sum(mean[p] for p in PARTS),
                    "rounds": len(host),
                    "late/early": statistics.fmean(host[-third:]) / statistics.fmean(host[:third]),
                }
            )
    rows = {c: min(r, key=lambda run: run["host"]) for c, r in runs.items()}  # the least disturbed run
    return {"source": os.path.dirname(os.path.dirname(os.path.abspath(dex_core.__file__))), "rows": rows}


def table(result: dict, title: str) -> str:
    rows = result["rows"]
    head = ["context", "rounds", *PARTS, "host/round", "layers/round", "late/early"]
    lines = [
        f"{title} ({result['source']}): µs per round, mean over the rounds of the least disturbed run",
        "  ".join(f"{h:>10}" for h in head),
    ]
    for context, r in rows.items():
        cells = [
            context,
            r["rounds"],
            *(f"{r[p] * 1e6:.0f}" for p in PARTS),
            f"{r['host'] * 1e6:.0f}",
            f"{r['layers'] * 1e6:.0f}",
            f"{r['late/early']:.2f}",
        ]
        lines.append("  ".join(f"{c:>10}" for c in cells))
    first, last = list(rows.values())[0]["host"], list(rows.values())[-1]["host"]
    keys = list(rows)
    ratio = last / first
    lines.append(
        f"host work per round at {keys[-1]} / at {keys[0]}: {ratio:.2f} "
        f"({'flat' if abs(ratio - 1) <= 0.3 else 'NOT flat'} within ±30%); late/early: the last third "
        "of a run's rounds against its first third"
    )
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False
    )
    parser.add_argument("--contexts", default="256,1024,4096", help="prompt lengths, comma-separated")
    parser.add_argument("--new", type=int, default=48, help="new tokens per run")
    parser.add_argument("--explorers", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=3, help="runs per context (different random prompts)")
    parser.add_argument(
        "--baseline", help="also measure the dex_core/visualize of this checkout (before/after)"
    )
    parser.add_argument("--out", help="write the numbers as JSON")
    args = parser.parse_args(argv)
    contexts = [int(c) for c in args.contexts.split(",")]
    results = {}
    if args.baseline:
        argv = ["--contexts", args.contexts, "--new", str(args.new), "--explorers", str(args.explorers)]
        results["before"] = measured_in(args.baseline, __file__, [*argv, "--repeat", str(args.repeat)])
        print(table(results["before"], "before"), flush=True)
    results["after"] = run(contexts, args.new, args.explorers, args.repeat)
    print(table(results["after"], "after" if args.baseline else "this tree"))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
