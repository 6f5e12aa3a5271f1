"""How ``Lattice.trim`` ranks a round's new rows under a budget: the kept rule against two pricings of a row by what
its reuse commits, on the tune split (issue 60).

    python benchmarks/chain_pricing.py --out docs/results/chain-pricing.json

Rankings (``Lattice.rank``, replaced in this process only; every one keeps a slot's parent ahead of it, so no kept
slot loses its parent):

- ``rounds_saved`` (the library's since issue 60, ``Lattice.worth``): ``Slot.score`` times the rounds its reuse
  saves: K - 1 - k for a branch started by a stage-k candidate (the token then costs k + 1 rounds, not K), K - 1
  for a chain slot (it commits in its predecessor's round); capped by its parent's when the parent is new this round;
- ``parent`` (the rule before): ``Slot.score`` alone, the probability that the slot is reused (a draft chain's slot
  scores as the slot before it);
- ``chain_length``: the score times the tokens the slot's match would commit, itself and the chain slots behind it
  (1 for a slot with no chain after it).

Counts, not time: rounds per token of the default model (its shipped adapters, draft chains on, greedy) at
``--setting K:budget:sets``, e.g. ``8:4:chat,humaneval`` (the budget issue's K = 8 line) and ``4:8:grounded`` (the
CPU default on grounded prompts), ``--prompts`` tune prompts a set, ``--max-new-tokens`` each; every output
checked against the library's ranking's (all are exact, so they must be equal).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dex_core.algorithm.lattice import Lattice  # noqa: E402

LIBRARY = Lattice.rank


def parent(lattice: Lattice, node) -> tuple:
    """The rule before issue 60: by ``Slot.score`` alone."""
    return node.kind != "root", -lattice.slots[node.slot].score, node.id


def chain_behind(lattice: Lattice, slot) -> int:
    """The chain slots after ``slot``."""
    count, child = 0, slot.chain_child
    while child is not None and child in lattice.slots:
        count, child = count + 1, lattice.slots[child].chain_child
    return count


def chain_length(lattice: Lattice, node) -> tuple:
    slot = lattice.slots[node.slot]
    return node.kind != "root", -slot.score * (1 + chain_behind(lattice, slot)), node.id


RANKINGS = {"rounds_saved": LIBRARY, "parent": parent, "chain_length": chain_length}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--setting", action="append", help="K:budget:sets (default: 8:4:chat,humaneval, 4:8:grounded)"
    )
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    from dex_core import DexDecoder, load_model
    from dex_core.data.sets import prompt_set
    from dex_core.runtime.request import encode_item

    model, tokenizer = load_model("default", device="cpu")
    report = {"prompts_a_set": args.prompts, "new_tokens": args.max_new_tokens, "settings": {}}
    for setting in args.setting or ["8:4:chat,humaneval", "4:8:grounded"]:
        K, budget, sets = setting.split(":")
        items = [it for name in sets.split(",") for it in prompt_set(name, args.prompts, "tune")]
        prompts = [encode_item(tokenizer, it) for it in items]
        row, outputs = {}, {}
        for name, rank in RANKINGS.items():
            Lattice.rank = rank
            decoder = DexDecoder(model, explorers=int(K), tokenizer=tokenizer, prune=int(budget))
            results = [decoder.generate(p, args.max_new_tokens) for p in prompts]
            outputs[name] = [r.tokens for r in results]
            tokens = sum(r.stats.tokens for r in results)
            row[name] = round(sum(r.stats.rounds for r in results) / tokens, 4)
            print(f"{setting} {name}: {row[name]} rounds a token", flush=True)
        Lattice.rank = LIBRARY
        row["outputs_equal"] = all(o == outputs["rounds_saved"] for o in outputs.values())
        report["settings"][setting] = row
    text = json.dumps(report, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
