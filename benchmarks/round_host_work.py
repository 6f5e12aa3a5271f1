"""Host work per DEX round against K and the lattice's row budget, beside HF ``generate``'s whole token.

    python benchmarks/round_host_work.py --out docs/results/round-host-work.json
    git worktree add /tmp/dex-head HEAD && python benchmarks/round_host_work.py --baseline /tmp/dex-head

A tiny random Llama of 16 layers, hidden 256 (float32, one torch thread, the sequential schedule) decodes a
prompt that repeats (so draft chains find drafts) greedily, ``--new`` tokens, draft chains on (``auto``), for each
K and each ``prune`` (the row budget: ``none``, ``auto``, numbers). Host work per round is all a round does besides
its stages' layers and heads: the round's time less every explorer's expansion (its ``timings``: token choice,
DECS masks, planning and inserting, commits, collapses, the trace records, the link). Beside it, HF
``generate``'s time per token on the same model and prompt (``generate`` of ``--new`` tokens less that of one,
over ``--new`` - 1: its prefill left out), and the ratio of the two. Per setting, of ``--repeat`` runs the one with
the least host work (the least disturbed); the first round (after the prefill) is left out. Also reported: rounds
per token and the most rows any round ran. ``--baseline DIR`` measures the ``dex_core`` of another checkout in a
child process beside this one (its ``prune`` may mean something else: the baseline's own meaning is measured).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import json
import os
import statistics
import sys
import time

from baseline import measured_in

SPANS = ("decode", "masks", "plan", "commit", "collapse", "trace", "communication")


def model_and_prompt(seed: int = 0):
    import torch

    from dex_core.testing import tiny_model

    model = tiny_model(
        "llama", layers=16, hidden_size=256, intermediate_size=512, num_attention_heads=8,
        num_key_value_heads=4, vocab=512, seed=seed, max_position_embeddings=1024,
    ).to(torch.float32)  # fmt: skip
    g = torch.Generator().manual_seed(seed)
    piece = torch.randint(0, 512, (24,), generator=g).tolist()
    return model, piece * 4


def hf_token_seconds(model, prompt: list[int], new: int, repeat: int) -> float:
    """HF greedy ``generate``'s seconds per token after the first (the least of ``repeat``)."""
    import torch

    ids = torch.tensor([prompt])

    def timed(n):
        tic = time.perf_counter()
        model.generate(
            ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=n, min_new_tokens=n
        )
        return time.perf_counter() - tic

    timed(2)  # warm-up
    return min((timed(new) - timed(1)) / (new - 1) for _ in range(repeat))


@contextlib.contextmanager
def critical_stamps(decoder):
    """While the block runs, each round's *critical* host time, recorded into the list it gives: from the round's
    read (the link's ``exchange`` returning) to the next round's first stage step's call, what an accelerator waits
    through."""
    from dex_core.runtime.links import LocalLink

    read, gaps = [None], []
    exchange = LocalLink.exchange

    def timed_exchange(self, *args):
        out = exchange(self, *args)
        read[0] = time.perf_counter()
        return out

    def timed(step):
        def call(hidden, table):
            if read[0] is not None:
                gaps.append(time.perf_counter() - read[0])
                read[0] = None
            return step(hidden, table)

        return call

    LocalLink.exchange = timed_exchange  # this process runs one decoder at a time
    for e in decoder.explorers:
        e.step = timed(e.step)
    try:
        yield gaps
    finally:
        LocalLink.exchange = exchange


def dex_run(model, prompt: list[int], new: int, K: int, prune) -> dict:
    from dex_core import DexDecoder
    from dex_core.trace.events import RoundEvent

    decoder = DexDecoder(model, explorers=K, prune=prune, draft="auto", proposal_vocab="full")
    with critical_stamps(decoder) as gaps:
        rounds = [e for e in decoder.stream(prompt, new) if isinstance(e, RoundEvent)]
    tokens = sum(len(e.commits) for e in rounds)
    later = rounds[1:]
    host = [e.timings["round"] - sum(e.timings["expand"]) for e in later]
    return {
        "host": statistics.fmean(host),
        "critical": statistics.fmean(gaps[1:] or gaps),  # the first round's left out, as for host
        **{span: statistics.fmean(e.timings[span] for e in later) for span in SPANS},
        "rounds_per_token": len(rounds) / max(1, tokens),
        "most_rows": max(sum(len(b) for b in e.batches) for e in rounds),
        "budget": decoder.prune,
    }


def run(
    explorers: list[int], prunes: list[str], new: int, repeat: int, order="device", heap="settled"
) -> dict:
    import torch

    import dex_core
    from dex_core.runtime import engine

    torch.set_num_threads(1)
    if order == "accelerator" and hasattr(
        engine, "overlaps"
    ):  # a revision before it: records where it decides
        engine.overlaps = lambda view: True
    model, prompt = model_and_prompt()
    settled = heap == "settled" and importlib.util.find_spec("dex_core.runtime.heap") is not None
    if settled:  # as DEX's own processes do once their model is loaded (a revision before it did not)
        importlib.import_module("dex_core.runtime.heap").settle()
    hf = hf_token_seconds(model, prompt, new, repeat)
    rows = []
    for K in explorers:
        for prune in prunes:
            value = None if prune == "none" else prune if prune == "auto" else int(prune)
            runs = [dex_run(model, prompt, new, K, value) for _ in range(repeat)]
            best = min(runs, key=lambda r: r["critical"])
            rows.append(
                {
                    "K": K,
                    "prune": prune,
                    **best,
                    "host/hf_token": best["host"] / hf,
                    "critical/hf_token": best["critical"] / hf,
                }
            )
    source = os.path.dirname(os.path.dirname(os.path.abspath(dex_core.__file__)))
    out = {"source": source, "hf_token_seconds": hf, "new": new, "order": order, "heap_settled": settled}
    return out | {"rows": rows}


def table(result: dict, title: str) -> str:
    head = [
        "K",
        "prune",
        "budget",
        "most rows",
        "rounds/tok",
        "host ms",
        *SPANS,
        "host/HF tok",
        "critical ms",
    ]
    head.append("crit/HF tok")
    lines = [
        f"{title} ({result['source']}, {result.get('order', 'device')} order, heap "
        f"{'settled' if result.get('heap_settled') else 'as is'}): HF generate "
        f"{result['hf_token_seconds'] * 1e3:.2f} ms a token; per round, ms",
        "  ".join(f"{h:>11}" for h in head),
    ]
    for r in result["rows"]:
        cells = [r["K"], r["prune"], r["budget"], r["most_rows"], f"{r['rounds_per_token']:.2f}"]
        cells += [
            f"{r['host'] * 1e3:.2f}",
            *(f"{r[s] * 1e3:.2f}" for s in SPANS),
            f"{r['host/hf_token']:.3f}",
            f"{r['critical'] * 1e3:.2f}",
            f"{r['critical/hf_token']:.3f}",
        ]
        lines.append("  ".join(f"{c!s:>11}" for c in cells))
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--explorers", default="2,4,8")
    parser.add_argument("--prune", default="none,auto,1", help="row budgets, comma-separated")
    parser.add_argument("--new", type=int, default=48)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--baseline", help="also measure the dex_core of this checkout (before/after)")
    parser.add_argument(
        "--order",
        choices=("device", "accelerator"),
        default="device",
        help="device: the order the CPU runs (a round's event before the next round's steps); accelerator: the "
        "order a GPU runs (the record made once the next round's steps are enqueued), on this CPU",
    )
    parser.add_argument(
        "--heap",
        choices=("settled", "as-is"),
        default="settled",
        help="settled: collected and frozen once the model is built, as DEX's processes do (dex_core.runtime.heap; "
        "a revision without it runs as is); as-is: never",
    )
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    results = {}
    if args.baseline:
        argv = [
            "--explorers",
            args.explorers,
            "--prune",
            args.prune,
            "--new",
            str(args.new),
            "--order",
            args.order,
            "--heap",
            args.heap,
        ]
        results["before"] = measured_in(args.baseline, __file__, [*argv, "--repeat", str(args.repeat)])
        print(table(results["before"], "before"), flush=True)
    explorers = [int(k) for k in args.explorers.split(",")]
    results["after"] = run(explorers, args.prune.split(","), args.new, args.repeat, args.order, args.heap)
    print(table(results["after"], "after" if args.baseline else "this tree"))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
