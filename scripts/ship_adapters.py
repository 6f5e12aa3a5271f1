"""Make a trained adapter file the shipped one: store its token ranking and its best set per K, then copy it.

    python scripts/ship_adapters.py runs/adapters.safetensors runs/ead.json [--explorers 2,3,4] [--model gemma3-270m]
    python scripts/ship_adapters.py my-adapters.safetensors ead.json --model ./my-model --store-only

``runs/ead.json`` is the report of ``dex ead --adapters FILE --split tune --best-within-adapters --out ...``
on the same file: for each K, the exploration set with the lowest cost per token (heads and adapters
included, pooled over its prompt sets) among those at least as fast depth-side as the previous K's minus
0.02 (``dex_core.analysis.best_sets``) is recorded in the file (``DexDecoder(explorers=K)`` then uses
it), the ranking of the light proposal heads is stored, and the file is copied to
``assets/adapters/`` under the named model's name (``NamedModel.adapters``), where ``adapters="auto"`` finds it.
With ``--store-only`` (any model spec: your own model's adapters) the file keeps both and is copied nowhere.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys

from dex_core.config import parse_ints
from dex_core.data.ranking import token_ranking
from dex_core.model.adapter_choice import store_best_sets
from dex_core.model.load import load_model
from dex_core.model.named import NAMED
from dex_core.model.proposal import store_ranking


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("adapters")
    parser.add_argument("ead_report")
    parser.add_argument(
        "--explorers", default="2,3,4,5,6,7,8", help="the values of K whose best sets are stored"
    )
    parser.add_argument("--model", default="default", help="the model they are for (a named one, to ship)")
    parser.add_argument(
        "--store-only", action="store_true", help="store the ranking and the sets in the file, copy nothing"
    )
    args = parser.parse_args(argv)
    if not args.store_only and args.model not in NAMED:
        parser.error(
            f"--model must be a named model to ship ({', '.join(sorted(NAMED))}); or use --store-only"
        )
    report = json.loads(open(args.ead_report).read())
    run = next(r for r in report["runs"] if r["adapters"] == args.adapters)
    best = {
        p["explorers"]: p["best"]
        for p in run["all"]["predicted"]
        if p["explorers"] in parse_ints(args.explorers, "explorers")
    }
    for K, b in sorted(best.items()):
        print(
            f"K={K}: {b['depths']}, {b['cost_per_token']:.2f} LE/token ({b['cost_share_of_ar']:.3f} of AR's), "
            f"depth-side speedup {b['depth_speedup']:.3f}x"
            + ("" if b.get("floor_met", True) else f" (below the floor {b['floor']:.3f}: the fastest set)")
        )
    model, tokenizer = load_model(args.model, device="cpu")  # only its identity is checked
    store_ranking(args.adapters, model, token_ranking(tokenizer, model.config.vocab_size))
    store_best_sets(args.adapters, model, {K: b["depths"] for K, b in best.items()})
    if args.store_only:
        print(f"stored in {args.adapters}")
        return 0
    shutil.copyfile(args.adapters, NAMED[args.model].adapters)
    print(f"shipped as {NAMED[args.model].adapters}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
