"""Draft chains on the default model: rounds per token, tokens drafted, rows per round and cost per token
with and without chains, per prompt set and K (counts, not clocks: the same on any machine).

    python benchmarks/draft_chains.py [--sets grounded,chat,humaneval] [--prompts 3] [--tokens 64]
                                      [--explorers 2,4] [--drafts "none;auto"] [--prune auto]
                                      [--out runs/draft-chains.json]

Each run is checked token for token against HF greedy. Cost per token is the cost model's
(``dex_core.model.cost``): layer-equivalents with heads, adapters and every row counted, memory-bound (a batch
costs its weights once, the accelerator case) and rows-counted (every row costs, a compute-bound CPU),
against AR's 38. Wall-clock tokens/s come from ``dex bench`` (docs/BENCHMARKS.md).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from dex_core import DexDecoder, hf_greedy, load_model
from dex_core.data.sets import prompt_set
from dex_core.model.cost import ModelCost
from dex_core.runtime.request import encode_item


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sets", default="grounded,chat,humaneval")
    parser.add_argument("--prompts", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--explorers", default="2,4")
    parser.add_argument("--drafts", default="none;auto")
    parser.add_argument("--prune", default="auto", help="lattice pruning: auto (1 on this CPU), none, or B")
    parser.add_argument("--out", default="runs/draft-chains.json")
    args = parser.parse_args(argv)
    model, tokenizer = load_model("default", device="cpu")
    sets = {
        s: [encode_item(tokenizer, it) for it in prompt_set(s, args.prompts)] for s in args.sets.split(",")
    }
    refs = {s: [hf_greedy(model, p, args.tokens) for p in prompts] for s, prompts in sets.items()}
    rows = []
    for K in map(int, args.explorers.split(",")):
        for draft in args.drafts.split(";"):
            dex = DexDecoder(model, explorers=K, tokenizer=tokenizer, draft=draft, prune=args.prune)
            cost = ModelCost.of(model, dex.adapters, dex.proposal_vocab)
            covered = [d for d in dex.adapters if d in dex.depths[:-1]]
            for name, prompts in sets.items():
                results = [dex.generate(p, args.tokens) for p in prompts]
                T = sum(len(r.tokens) for r in results)
                rounds = sum(r.stats.rounds for r in results)
                batches = [b for r in results for b in r.stats.batch_sizes]
                row = {
                    "set": name,
                    "explorers": K,
                    "prune": args.prune,
                    "depths": list(dex.depths),
                    "draft": draft,
                    "tokens": T,
                    "identical": sum(r.tokens == ref for r, ref in zip(results, refs[name])),
                    "prompts": len(prompts),
                    "rounds_per_token": rounds / T,
                    "tokens_per_round": T / rounds,
                    "drafted_share": sum(r.stats.drafted for r in results) / T,
                    "rows_per_round": [sum(b[k] for b in batches) / rounds for k in range(K)],
                    "cost_share_memory": cost.dex(dex.depths, batches, T, "memory", covered) / cost.ar(),
                    "cost_share_rows": cost.dex(dex.depths, batches, T, "rows", covered) / cost.ar(),
                }
                rows.append(row)
                print(
                    f"K={K} {name:9s} draft {draft:5s} identical {row['identical']}/{row['prompts']} "
                    f"rounds/token {row['rounds_per_token']:.3f} drafted {row['drafted_share']:.2f} "
                    f"rows/round {[round(x, 2) for x in row['rows_per_round']]} cost vs AR: memory-bound "
                    f"{row['cost_share_memory']:.3f}, rows-counted {row['cost_share_rows']:.3f}",
                    flush=True,
                )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"config": vars(args), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
