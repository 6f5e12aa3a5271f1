"""Lattice pruning: rows per round against rounds per token, and what each costs per token.

    python benchmarks/pruning.py --explorers 4 --prompts 10 --max-new-tokens 128 --out runs/pruning.json
    PYTHONPATH=/tmp/dex-head python benchmarks/pruning.py ...   # another checkout's dex_core (its prune's meaning)

For each row budget B (``--prune``, 'none' = unbounded, 'auto' = the device's) and each draft setting
(``--draft``: 'auto' = chains on, 'none' = off) the same greedy prompts (HumanEval and ShareGPT held-out, half
each) run through ``DexDecoder(explorers=K, prune=B, draft=D)`` with the shipped adapters (named in the report by
their file's hash) and their best set for K; every output is checked against HF ``generate``. ``--out`` is
written after every setting and a run started again with the same ``--out`` skips the settings it holds
(resumable). Per setting: rounds per token, rows per round (all explorers, and the widest explorer) and the most
rows any round and any stage ran, cost per token from ``dex_core.model.cost`` in both
views (memory-bound: a batch costs one row; rows-counted: every row counts) with heads and adapters,
and the projected K-device tokens/s of the sequential run (slowest explorer per round + bookkeeping +
decode; communication left out) against AR's tokens/s (HF ``generate``, the references) measured in
the same run with the same torch threads. Where the time goes, per explorer: rows per round, its share
of the expansion seconds, and how often it is the round's slowest; and, as a bound labelled as one, the
projected tokens/s if every round's expansion were spread evenly over the K devices.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from dex_core import DecoderOptions, DexConfig, DexDecoder, hf_greedy, load_model
from dex_core.config import DEVICE_HELP
from dex_core.data.sets import prompt_set
from dex_core.model.cost import ModelCost
from dex_core.runtime.request import encode_item
from dex_core.trace.events import RoundEvent


def adapter_hash() -> str:
    """The shipped adapter file, named by its content (sha256, first 16 hex digits)."""
    import hashlib

    from dex_core.model.adapters import DEFAULT_ADAPTERS

    return hashlib.sha256(Path(DEFAULT_ADAPTERS).read_bytes()).hexdigest()[:16]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default=DexConfig.device, help=DEVICE_HELP)
    parser.add_argument("--explorers", type=int, default=4)
    parser.add_argument(
        "--depths", help="exploration set, e.g. 6,14,22,30 (default: the shipped best set for K)"
    )
    parser.add_argument("--prune", default="none,1,2,3,4", help="row budgets B to compare, comma-separated")
    parser.add_argument(
        "--draft", default="auto", help="draft settings to compare, comma-separated (auto, none)"
    )
    parser.add_argument("--prompts", type=int, default=10)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--out")
    args = parser.parse_args(argv)

    model, tokenizer = load_model("default", device=args.device)
    half = args.prompts // 2
    items = prompt_set("humaneval", args.prompts - half) + prompt_set("chat", half)
    prompts = [encode_item(tokenizer, it) for it in items]
    hf_greedy(model, prompts[0], 8)  # warm-up
    tic = time.perf_counter()
    refs = [hf_greedy(model, p, args.max_new_tokens) for p in prompts]
    ar_seconds = time.perf_counter() - tic  # AR (HF generate) measured in this run, with the same threads
    bounds = [DecoderOptions(prune=b.strip()).prune for b in args.prune.split(",")]  # none, auto or B
    decoders = {
        (b, d): DexDecoder(
            model,
            explorers=args.explorers,
            depths=args.depths,
            adapters="auto",
            tokenizer=tokenizer,
            prune=b,
            draft=d,
        )
        for d in args.draft.split(",")
        for b in bounds
    }
    first = next(iter(decoders.values()))
    cost = ModelCost.of(model, first.adapters, first.proposal_vocab)
    covered = sorted(first.adapters)
    done = json.loads(Path(args.out).read_text())["rows"] if args.out and Path(args.out).is_file() else []
    rows = list(done)
    for (b, d), decoder in decoders.items():
        if any(r["prune"] == b and r.get("draft") == d for r in done):
            continue
        decoder.generate(prompts[0], 8)  # warm-up
        stats, exact, expand = [], 0, []  # expand: per round, each explorer's expansion seconds
        for p, ref in zip(prompts, refs):
            result = decoder.generate(p, args.max_new_tokens)
            exact += result.tokens == ref
            stats.append(result.stats)
            expand += [e.timings["expand"] for e in result.trace if isinstance(e, RoundEvent)]
        T = sum(s.tokens for s in stats)
        batches = [bs for s in stats for bs in s.batch_sizes]
        R = len(batches)
        row = {
            "prune": b,
            "budget": decoder.prune,
            "draft": d,
            "most_rows_per_round": max(map(sum, batches)),
            "most_rows_per_stage": max(map(max, batches)),
            "depths": list(decoder.depths),
            "exact_prompts": exact,
            "prompts": len(prompts),
            "tokens": T,
            "rounds_per_token": R / T,
            "rows_per_round": sum(map(sum, batches)) / R,
            "widest_rows_per_round": sum(max(bs) for bs in batches) / R,
            "cost_per_token_memory": cost.dex(decoder.depths, batches, T, "memory", covered),
            "cost_per_token_rows": cost.dex(decoder.depths, batches, T, "rows", covered),
            "ar_cost_per_token": cost.ar(),
            "projected_tokens_per_second": T / sum(s.projected_seconds for s in stats),
            "ar_tokens_per_second": sum(map(len, refs)) / ar_seconds,
        }
        row["projected_over_ar"] = row["projected_tokens_per_second"] / row["ar_tokens_per_second"]
        K, spent = decoder.K, sum(map(sum, expand))
        balanced = sum(s.projected_seconds for s in stats) - sum(map(max, expand)) + spent / K
        row.update(
            explorer_rows_per_round=[sum(bs[k] for bs in batches) / R for k in range(K)],
            explorer_expand_share=[sum(e[k] for e in expand) / spent for k in range(K)],
            explorer_slowest_share=[sum(e.index(max(e)) == k for e in expand) / R for k in range(K)],
            balanced_bound_over_ar=T / balanced / row["ar_tokens_per_second"],
        )
        rows.append(row)
        if args.out:  # after every setting: a stopped run resumes from here
            report = {
                "explorers": args.explorers,
                "max_new_tokens": args.max_new_tokens,
                "adapters": adapter_hash(),
            }
            Path(args.out).write_text(json.dumps({**report, "rows": rows}, indent=1))
        print(
            f"prune {b} (budget {decoder.prune}), draft {d}: exact {exact}/{len(prompts)}, rounds/token "
            f"{row['rounds_per_token']:.3f}, most rows {row['most_rows_per_round']} a round "
            f"({row['most_rows_per_stage']} a stage), rows/round "
            f"{row['rows_per_round']:.2f} (widest {row['widest_rows_per_round']:.2f}), cost/token memory-bound "
            f"{row['cost_per_token_memory']:.2f} / rows-counted {row['cost_per_token_rows']:.2f} LE (AR "
            f"{cost.ar():.2f}), projected {row['projected_tokens_per_second']:.2f} tok/s = "
            f"{row['projected_over_ar']:.3f}x AR's measured {row['ar_tokens_per_second']:.2f}",
            flush=True,
        )
        print(
            "  per explorer: rows/round "
            + " / ".join(f"{v:.2f}" for v in row["explorer_rows_per_round"])
            + "; share of expansion seconds "
            + " / ".join(f"{v:.2f}" for v in row["explorer_expand_share"])
            + "; slowest in "
            + " / ".join(f"{v:.2f}" for v in row["explorer_slowest_share"])
            + " of rounds; bound "
            f"with every round's expansion spread evenly over {K} devices: {row['balanced_bound_over_ar']:.3f}x AR",
            flush=True,
        )
    return 0 if all(r["exact_prompts"] == r["prompts"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
