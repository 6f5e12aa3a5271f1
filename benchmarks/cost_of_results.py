"""Re-count the committed ``dex bench`` reports (docs/results/bench-*.json) under the cost model
(``dex_core.model.cost``): every method's cost per token in layer-equivalents with the LM head and adapters
included, memory-bound view, next to the layers-only figure the reports were made with.

Those reports predate the cost model and did not record DEX's per-round batch sizes, so DEX is counted
in its steady state (``ModelCost.dex_steady``: every non-final explorer busy every round, the final one once
per token), an upper bound of its exact cost; self-speculation's and HF early exit's draft-verify steps are
recovered exactly from their layers-only critical path (n E + L per step). New ``dex bench`` runs report the
exact figures, and this script leaves their reports out.

    python benchmarks/cost_of_results.py [--out docs/results/cost-of-bench.json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from dex_core import load_model
from dex_core.model.adapter_choice import resolve_adapters
from dex_core.model.cost import ModelCost

ROOT = Path(__file__).resolve().parents[1]


def recount(report: dict, cost: ModelCost, plain: ModelCost) -> list[dict]:
    L, adapter_depths = report["num_layers"], report["adapter_depths"]
    rows = []
    for r in report["results"]:
        method, lf = r["method"], r["layer_forwards_per_token"]
        row = {"set": r["set"], "method": method, "layers_only": lf}
        if method.startswith("ar"):
            row["cost_per_token"] = cost.ar()
        elif method == "dex":
            covered = [d for d in adapter_depths if r["adapters"] and d in r["depths"][:-1]]
            row.update(
                explorers=r["explorers"],
                depths=r["depths"],
                rounds_per_token=r["rounds_per_token"],
                cost_per_token=cost.dex_steady(r["depths"], r["rounds_per_token"], covered),
                kind="steady-state upper bound",
            )
        else:  # self-spec / hf-early-exit: steps per token from the layers-only path n E + L per step
            E, n = r["exit"], r["draft"]
            steps = lf / (n * E + L)
            model = cost if r.get("adapters") else plain
            row.update(
                exit=E,
                draft=n,
                steps_per_token=steps,
                cost_per_token=steps * model.self_spec_step(E, n, "memory", bool(r.get("adapters"))),
            )
        row["cost_vs_ar"] = cost.ar() / row["cost_per_token"]
        rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(ROOT / "docs" / "results" / "cost-of-bench.json"))
    args = parser.parse_args()
    model, _ = load_model("default", device="cpu")  # only its shapes are counted
    cost = ModelCost.of(model, resolve_adapters("default", model))
    plain = ModelCost(cost.num_layers, cost.head, 0.0)
    out = {
        "model": "default",
        "head_layer_equivalents": cost.head,
        "adapter_layer_equivalents": cost.adapter,
        "ar_cost_per_token": cost.ar(),
        "view": "memory-bound layer-equivalents, heads and adapters included",
        "rows": [],
    }
    print(f"head {cost.head:.2f} LE, adapter {cost.adapter:.2f} LE, AR {cost.ar():.2f} LE per token")
    print("| set | method | configuration | layers only | cost/token (all work) | vs AR |")
    print("|---|---|---|---|---|---|")
    for path in sorted((ROOT / "docs" / "results").glob("bench-*.json")):
        report = json.loads(path.read_text())
        if any("cost_per_token" in r for r in report["results"]):
            continue  # made since the cost model: it reports the exact figures itself
        for row in recount(report, cost, plain):
            out["rows"].append(row)
            config = (
                f"K={row['explorers']} {row['depths']} ({row['kind']})"
                if "explorers" in row
                else f"exit {row['exit']}, draft {row['draft']}"
                if "exit" in row
                else ""
            )
            print(
                f"| {row['set']} | {row['method']} | {config} | {row['layers_only']:.2f} | "
                f"{row['cost_per_token']:.2f} | {row['cost_vs_ar']:.3f} |"
            )
    Path(args.out).write_text(json.dumps(out, indent=1))
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
