"""Every depth ready (issue 43): depth-side speedup and cost per K from a ``dex ead`` report, checked by real runs.

    dex ead --adapters FILE --split tune --sets humaneval,chat --prompts 20 --max-new-tokens 128 \
        --best-within-adapters --out docs/results/ead-dense-tune.json
    python scripts/ship_adapters.py FILE docs/results/ead-dense-tune.json       # stores each K's best set
    dex ead --adapters FILE,default,none --sets humaneval,chat --prompts 20 --max-new-tokens 128 \
        --best-within-adapters --out docs/results/ead-dense.json
    python benchmarks/depth_readiness.py docs/results/ead-dense.json --adapters FILE --measure 2 \
        --out docs/results/depth-readiness.json

For each adapter choice of the report and each K = 2..8 (pooled over its sets; greedy, DECS, no pruning, no
draft chains): the uniform split (K = 2 within 4 within 8: nested) and the set a decoder takes for K (the file's
stored best set — chosen on the tune split, measured here on the eval split — else the uniform split), each with

- the depth-side speedup K / (rounds per token), replayed from every layer's candidates on HF greedy's answers:
  what a DEX run with that set measures (``dex_core.analysis.ead``; tests/analysis/test_ead.py proves the rule);
- the K-device memory-bound speedup over AR, heads and adapters included (``ModelCost.dex_steady`` against
  ``ModelCost.ar``), and the same counted by layers alone (``ModelCost.layers_only``).

``--measure N`` runs DEX for real on the first N prompts of each set at every K (each K's decoder set and uniform
split) and records its rounds per token beside the replay of the same answers, and whether its tokens equal HF
greedy's. Not a test: it loads the real model (minutes).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from dex_core import DecoderOptions, DexDecoder
from dex_core.analysis.ead import set_cost
from dex_core.config import resolve_depths
from dex_core.data.sets import prompt_set
from dex_core.model.adapter_choice import choose_depths, resolve_adapters
from dex_core.model.cost import ModelCost
from dex_core.model.lens import layer_candidates
from dex_core.model.load import load_model
from dex_core.runtime.reference import hf_greedy
from dex_core.runtime.request import encode_item


def speedups(cost: ModelCost, depths, rounds: float, adapter_depths) -> dict:
    """K-device memory-bound speedups over AR at ``rounds`` per token: all the work, and layers alone."""
    layers = cost.layers_only()
    return {
        "cost_speedup": cost.ar() / cost.dex_steady(depths, rounds, adapter_depths),
        "layers_only_speedup": layers.ar() / layers.dex_steady(depths, rounds, ()),
    }


def table(run: dict, cost: ModelCost, decoder_sets: dict) -> list[dict]:
    """Per K: the uniform split's and the decoder set's replayed depth-side speedup and cost speedups."""
    rows = []
    for p in run["all"]["predicted"]:
        K, row = p["explorers"], {"explorers": p["explorers"]}
        chosen = decoder_sets.get(K, p["depths"])
        for name, result in (("uniform", p["uniform"]), ("decoder", _same_or_best(p, chosen))):
            if result is None:  # a stored set the report did not analyse (it searched under other rules)
                row[name] = {"depths": list(chosen), "depth_speedup": None}
                continue
            depths, rounds = result["depths"], result["rounds_per_token"]
            row[name] = {
                "depths": depths,
                "rounds_per_token": rounds,
                "depth_speedup": result["depth_speedup"],
                **speedups(cost, depths, rounds, run["adapter_depths"]),
            }
        rows.append(row)
    return rows


def _same_or_best(p: dict, chosen) -> dict | None:
    """The report's result for set ``chosen`` of K: the file's stored set's, the uniform split's or the best
    set's (else None)."""
    for result in (p.get("stored", {}), p["uniform"], p.get("best", {})):
        if result.get("depths") == list(chosen):
            return result
    return None


def measure(model, tokenizer, adapters_spec: str, sets, count: int, tokens: int, ks) -> list[dict]:
    """Real DEX runs (each K's decoder set and uniform split) on ``count`` prompts a set, beside the replay."""
    adapters = resolve_adapters(adapters_spec, model)
    out = []
    pairs = [
        (ids, hf_greedy(model, ids, tokens))
        for name in sets
        for ids in (encode_item(tokenizer, item) for item in prompt_set(name, count))
    ]
    for K in ks:
        chosen = choose_depths(model, DecoderOptions(explorers=K, adapters=adapters_spec))[0]
        for depths in dict.fromkeys([chosen, resolve_depths(model.config.num_hidden_layers, explorers=K)]):
            decoder = DexDecoder(model, depths=depths, adapters=adapters_spec, prune="none", draft="none")
            same = rounds = total = 0
            replay_rounds = 0.0
            for ids, ref in pairs:
                result = decoder.generate(ids, tokens)
                same += result.tokens == ref
                rounds, total = rounds + result.stats.rounds, total + len(result.tokens)
                shortlist = decoder.shortlist
                cands = layer_candidates(model, ids, ref, adapters, shortlist=shortlist)
                replay_rounds += set_cost(cands, ref, depths)["rounds_per_token"] * len(ref)
            decoder.close()
            out.append(
                {
                    "explorers": K,
                    "depths": list(depths),
                    "identical": same,
                    "prompts": len(pairs),
                    "measured_rounds_per_token": rounds / total,
                    "replayed_rounds_per_token": replay_rounds / total,
                }
            )
            print(f"  measured K={K} {list(depths)}: {out[-1]}", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("ead_report")
    ap.add_argument("--adapters", default="default", help="the adapter choice of the report to measure")
    ap.add_argument("--model", default="default")
    ap.add_argument("--measure", type=int, default=0, help="prompts a set to run DEX on for real (0: none)")
    ap.add_argument("--measure-tokens", type=int, default=64)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.set_grad_enabled(False)
    report = json.loads(Path(args.ead_report).read_text())
    model, tokenizer = load_model(args.model, dtype="float32", device="cpu")
    result = {"ead_report": args.ead_report, "runs": {}}
    for run in report["runs"]:
        spec = run["adapters"]
        adapters = resolve_adapters(spec, model)
        cost = ModelCost.of(model, adapters, run["proposal_vocab"])
        ks = [p["explorers"] for p in run["all"]["predicted"]]
        decoder_sets = {K: choose_depths(model, DecoderOptions(explorers=K, adapters=spec))[0] for K in ks}
        result["runs"][spec] = {
            "adapter_depths": run["adapter_depths"],
            "rows": table(run, cost, decoder_sets),
        }
        _print(spec, result["runs"][spec]["rows"])
    if args.measure:
        sets = list(report["runs"][0]["sets"])
        result["measured"] = measure(
            model, tokenizer, args.adapters, sets, args.measure, args.measure_tokens, ks
        )
    Path(args.out).write_text(json.dumps(result, indent=1))


def _print(spec: str, rows: list[dict]) -> None:
    print(
        f"adapters {spec}: K | uniform depth-side, cost, layers-only | decoder set: depths, depth-side, cost, layers"
    )
    for r in rows:
        print(
            f"  {r['explorers']} | {_cells(r['uniform'])} | {r['decoder']['depths']} {_cells(r['decoder'])}"
        )


def _cells(result: dict) -> str:
    if result["depth_speedup"] is None:
        return "(not in the report)"
    return " ".join(f"{result[k]:.3f}" for k in ("depth_speedup", "cost_speedup", "layers_only_speedup"))


if __name__ == "__main__":
    main()
