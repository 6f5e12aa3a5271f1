"""What ``prune="auto"``'s rule gives on this machine: the most rows a stage runs for at most 10% over one row.

    python benchmarks/row_budget.py --out docs/results/row-budget.json

Profiles the default model on this machine (``analysis.profile.measure_profile``: one decoder layer and the light
proposal head at 1, 2, 4, 8, 16 rows after a 64-token context, median of ``--repeats``, not cached, this process's
torch threads) and applies ``analysis.profile.row_budget`` to a non-final stage of each K = 2..8 (30 / K layers
and the light head). Then the same for one real-size layer of each of the GPU check's shapes, shrunk for a CPU
(``evaluation.bench.real_size.scaled``; on a GPU the check times them at full size and reports the rule itself).
The per-row cost ratios are printed beside, so the noise of a 2-core machine shows.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def ratios(profile: dict, layers: float) -> dict:
    one = layers * profile["layer"][1] + profile["proposal"][1]
    return {
        n: round((layers * profile["layer"][n] + profile["proposal"][n]) / one, 3) for n in profile["layer"]
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=40)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    import torch

    from dex_core import load_model
    from dex_core.analysis.profile import measure_profile, row_budget
    from dex_core.evaluation.bench.real_size import SHAPES, Plan, scaled, time_shape

    model, _ = load_model("default", device="cpu")
    profile = measure_profile(model, repeats=args.repeats, cache=False, link=("cpu", "cpu"))
    L = model.config.num_hidden_layers
    report = {"threads": torch.get_num_threads(), "default_model": {}, "real_size_scaled": {}}
    for K in range(2, 9):
        layers = L / K
        report["default_model"][K] = {
            "budget": row_budget(profile, layers),
            "cost_ratio": ratios(profile, layers),
        }
    for name, shape in SHAPES.items():
        plan = Plan(context=256, repeats=args.repeats // 4, rows=(1, 2, 4, 8, 16), ranks=())
        tables = time_shape(scaled(shape), "cpu", plan, {})  # the eager stage step
        table = {"layer": tables["layer"], "proposal": tables["proposal"]}
        layers = shape["layers"] / 8
        report["real_size_scaled"][name] = {
            "K": 8,
            "budget": row_budget(table, layers),
            "cost_ratio": ratios(table, layers),
        }
    print(json.dumps(report, indent=1))
    if args.out:
        args.out.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
