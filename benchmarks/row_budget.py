"""What ``prune="auto"``'s rule gives on this machine: rows priced by what they buy (``analysis.profile.row_budget``).

    python benchmarks/row_budget.py --out docs/results/row-budget.json

For each K of ``--explorers``: the cost side, the default model's round curve on this machine in a decode's order
(``analysis.profile.stage_curve``: the model split into K uniform stages, each with its light head and the last with
the full head, every stage run once a repeat at n = 1..16 new rows after a 256-token prefix, so each streams its
weights as in a round; median of ``--repeats``, this process's torch threads); the value side, rounds per token at
each budget of ``--budgets`` on the tune split (``prompt_set(name, --prompts, "tune")`` of grounded, chat and
HumanEval, ``--max-new-tokens`` each, greedy, the shipped adapters and draft chains on: the library's defaults), the
sets' geometric mean. The rule: the budget with the least rounds per token x round seconds. Each set's own pick is
reported beside it, and the round curve as ratios to the 2-row step, so the noise shows. Then the cost-only rule
(no rounds measured: every step within 10% of 2 rows) on one real-size layer of each of the GPU check's shapes,
shrunk for a CPU (``evaluation.bench.real_size.scaled``; on a GPU the check times them at full size).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def ratios(curve: dict) -> dict:
    """The curve as multiples of its 2-row step."""
    return {n: round(s / curve[2], 3) for n, s in sorted(curve.items())}


def rounds_per_token(model, tokenizer, explorers: int, budgets: list[int], args) -> dict:
    """{set: {budget: rounds per token}} on the tune split at the library's defaults but ``prune``."""
    from dex_core import DexDecoder
    from dex_core.data.sets import prompt_set
    from dex_core.runtime.request import encode_item

    out = {}
    for name in ("grounded", "chat", "humaneval"):
        prompts = [encode_item(tokenizer, item) for item in prompt_set(name, args.prompts, "tune")]
        out[name] = {}
        for b in budgets:
            decoder = DexDecoder(model, explorers=explorers, tokenizer=tokenizer, prune=b)
            stats = [decoder.generate(p, args.max_new_tokens).stats for p in prompts]
            out[name][b] = round(sum(s.rounds for s in stats) / sum(s.tokens for s in stats), 4)
        print(f"K = {explorers}, {name}: rounds per token {out[name]}", flush=True)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--explorers", default="4", help="the values of K to measure")
    parser.add_argument("--budgets", default="2,4,8,16")
    parser.add_argument("--prompts", type=int, default=4, help="tune prompts a set")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    import torch

    from dex_core import load_model
    from dex_core.analysis.profile import row_budget, stage_curve, stage_seconds
    from dex_core.evaluation.bench.real_size import SHAPES, Plan, scaled, time_shape

    model, tokenizer = load_model("default", device="cpu")
    budgets = [int(b) for b in args.budgets.split(",")]
    report = {
        "threads": torch.get_num_threads(),
        "rule": "least rounds per token x round seconds",
        "default_model": {},
    }
    for K in map(int, args.explorers.split(",")):
        _, curve = stage_curve(model, K, repeats=args.repeats)
        print(f"K = {K}: a round at n rows / at 2 rows {ratios(curve)}", flush=True)
        by_set = rounds_per_token(model, tokenizer, K, budgets, args)
        rounds = {b: math.prod(r[b] for r in by_set.values()) ** (1 / len(by_set)) for b in budgets}
        report["default_model"][K] = {
            "budget": row_budget(curve, rounds),
            "each_set": {name: row_budget(curve, r) for name, r in by_set.items()},
            "rounds_per_token": by_set | {"geometric_mean": {b: round(r, 4) for b, r in rounds.items()}},
            "round_ms": {n: round(s * 1e3, 2) for n, s in curve.items()},
            "round_ratio_to_2_rows": ratios(curve),
        }
        print(f"K = {K}: budget {report['default_model'][K]['budget']}", flush=True)
    report["real_size_scaled"] = {}
    for name, shape in SHAPES.items():
        plan = Plan(context=256, repeats=max(1, args.repeats // 4), rows=(1, 2, 4, 8, 16), ranks=())
        tables = time_shape(scaled(shape), "cpu", plan, {})  # the eager stage step
        curve = stage_seconds({"layer": tables["layer"], "proposal": tables["proposal"]}, shape["layers"] / 8)
        report["real_size_scaled"][name] = {
            "K": 8,
            "budget": row_budget(curve),
            "ratio_to_2_rows": ratios(curve),
        }
    print(json.dumps(report, indent=1))
    if args.out:
        args.out.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
