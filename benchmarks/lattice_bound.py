"""The most lattice entries and rows one stage holds in a round, against the bound a run's KV cache is sized for.

    python benchmarks/lattice_bound.py --out docs/results/lattice-bound.json

A run sizes each stage's cache once, at its start, for its prompt, its new tokens and ``budget × K`` lattice entries
and rows (``runtime.engine.start``), so that a compiled step keeps one buffer through the run. This script measures,
on a tiny random Llama (8 layers, float64) decoding a prompt that repeats (so draft chains find drafts), 60 tokens
greedily, the largest ``lattice entries + rows`` any stage's mask table covered in any round (``TreeMask.table``),
for each K, row budget (``prune``) and draft setting, beside ``budget × K``. Unbounded lattices (``prune=none``)
have no bound: their cache may grow mid-run (logged once).
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys


def measure(explorers, prunes, drafts, new: int) -> list[dict]:
    import torch

    from dex_core import DexDecoder
    from dex_core.model import explorer
    from dex_core.testing import tiny_model

    most = {"now": 0}
    table = explorer.TreeMask.table

    def watched(self, cache, rows, slots, paths, positions):
        most["now"] = max(most["now"], len(cache.slots) + rows)
        return table(self, cache, rows, slots, paths, positions)

    explorer.TreeMask.table = watched
    model = tiny_model("llama", layers=8)
    piece = torch.randint(0, 96, (12,), generator=torch.Generator().manual_seed(1)).tolist()
    rows = []
    for K, prune, draft in itertools.product(explorers, prunes, drafts):
        most["now"] = 0
        budget = None if prune == "none" else int(prune)
        result = DexDecoder(model, explorers=K, prune=budget or "none", draft=draft).generate(piece * 4, new)
        bound = None if budget is None else budget * K
        row = {"K": K, "prune": prune, "draft": draft, "most": most["now"], "bound": bound}
        rows.append(row | {"within": bound is None or most["now"] <= bound, "rounds": result.stats.rounds})
        print(json.dumps(rows[-1]), flush=True)
    explorer.TreeMask.table = table
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--explorers", default="2,4,8")
    parser.add_argument("--prune", default="none,2,8,64")
    parser.add_argument("--draft", default="none,auto")
    parser.add_argument("--new", type=int, default=60)
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    explorers = [int(k) for k in args.explorers.split(",")]
    rows = measure(explorers, args.prune.split(","), args.draft.split(","), args.new)
    bounded = [r for r in rows if r["bound"] is not None]
    print(f"{sum(r['within'] for r in bounded)} of {len(bounded)} bounded runs within budget x K")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"new": args.new, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
