"""Row rankings for the row budget, replayed without the model: how close each keeps K = 8 to the unbounded lattice.

    python benchmarks/ranking_replay.py --split tune --prompts 8 --max-new-tokens 64 --out runs/ranking-tune.json
    python benchmarks/ranking_replay.py --split eval --prompts 10 --max-new-tokens 96 --out runs/ranking-eval.json

A stage's candidate for a slot depends only on the slot's prefix (the committed tokens, then the input tokens of the
slots on its path) and on the stage (DECS masks only the same slot's shallower candidates). So one unbounded run per
prompt (``DexDecoder(explorers=K, prune='none', draft='auto')``, every candidate's probability read as a budget
reads them) records every (prefix, stage) -> (candidate, probability) a budgeted lattice can
reach, and the lattice itself (``algorithm.lattice.Lattice`` with its ``ChainPlanner``, pure bookkeeping) then
replays any budget and any ranking of its rows in milliseconds, committing the same tokens. A prefix the unbounded
run never reached counts as a miss (its candidate matches nothing), reported per setting (chains grown elsewhere,
or a candidate that differed between two rows of one prefix in float32): such a slot starts nothing that commits.

Per setting: rounds a token over the prompts (tokens summed), and its ratio to the replayed unbounded lattice's. The
replayed unbounded rounds are checked against the real run's. Rankings (``RANKINGS``): ``worth`` (the library's,
``Lattice.worth``), ``calibrated`` (the same, with each stage's candidate probability replaced by the rate at which
that stage's candidates of that probability decile were the committed token, measured on ``--calibrate-split``:
the tune split when reporting on eval) and ``oracle`` (the rows on the path of the tokens it will commit first: the
bound of any ranking at that budget, ``Oracle``). The recording is cached per prompt set in ``--out``'s folder
(``<out>.table.json``), so a second run replays at once.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from dex_core import DecoderOptions, DexDecoder, load_model
from dex_core.algorithm.chains import ChainPlanner
from dex_core.algorithm.lattice import Lattice
from dex_core.data.sets import prompt_set
from dex_core.runtime import engine
from dex_core.runtime.request import encode_item

UNBOUNDED_ROWS = (
    512  # a budget no round reaches here (``record`` checks): nothing trimmed, probabilities read
)
MISS = -3  # the candidate of a prefix the unbounded run never reached: matches no token


def prefix_of(lattice: Lattice, committed: list[int], slot_id: int) -> tuple[int, ...]:
    """The tokens before ``slot_id``'s position under its path: the committed ones, then its path's inputs."""
    path = lattice.slots[slot_id].path
    return (*committed, *(lattice.slots[s].input_token for s in path[1:]))


def record(decoder: DexDecoder, prompt: list[int], new: int) -> tuple[dict, int, int]:
    """One unbounded run of ``prompt``: {(prefix, stage): (candidate, probability)}, its rounds and tokens."""
    table, real, start = {}, engine.insert, engine.start

    def started(*args):  # every candidate's probability read, as a budget would
        run = start(*args)
        run.choosing = dataclasses.replace(run.choosing, probs=True)
        return run

    def insert(run, plan, outputs):
        committed = [*run.request.prompt, *run.tokens]
        for k, out in outputs.items():
            for n, token, prob in zip(plan.batches[k], out.tokens, out.probs or [1.0] * len(out.tokens)):
                table[(prefix_of(run.lattice, committed, n.slot), k)] = (token, prob)
        return real(run, plan, outputs)

    engine.insert, engine.start = insert, started
    try:
        result = decoder.generate(prompt, new)
    finally:
        engine.insert, engine.start = real, start
    return table, result.stats.rounds, len(result.tokens)


def replay(
    table: dict, prompt: list[int], tokens: int, K: int, draft, budget: int | None, truth=None
) -> tuple:
    """The lattice of ``prompt`` replayed from ``table`` until ``tokens`` are committed: (rounds, misses, the
    committed tokens). ``truth``: the tokens to commit, known in advance (``Oracle``: the bound of any ranking)."""
    committed = list(prompt)
    chains = ChainPlanner(draft, prompt, len(prompt) + tokens - 1)
    lattice = (
        Lattice(K, prompt[-1], len(prompt), chains) if truth is None else Oracle(K, prompt, chains, truth)
    )
    rounds, misses = 0, 0
    while len(committed) - len(prompt) < tokens:
        plan = lattice.plan_round(budget)
        rounds += 1
        chosen, probs = {}, {}
        for k, batch in enumerate(plan.batches):
            for n in batch:
                token, prob = table.get((prefix_of(lattice, committed, n.slot), k), (MISS, 0.0))
                misses += token == MISS
                chosen[n.id], probs[n.id] = token, prob
        lattice.insert(chosen, probs)
        while lattice.ready() and len(committed) - len(prompt) < tokens:
            commit = lattice.validate_and_commit()
            committed.append(commit.token)
            lattice.collapse(commit)
    return rounds, misses, committed


class Oracle(Lattice):
    """A lattice whose budget keeps first the rows on the path of the tokens it will commit (``truth``, the prompt
    first), shallowest first, then the rest by ``Lattice.worth``: no ranking does better at a budget."""

    def __init__(self, K: int, prompt: list[int], chains, truth: list[int]):
        super().__init__(K, prompt[-1], len(prompt), chains)
        self.truth, self.committed = truth, len(prompt)

    def collapse(self, commit):
        self.committed += 1
        return super().collapse(commit)

    def worth(self, node) -> float:
        slot = self.slots.get(node.slot)
        if node.kind == "root" or slot is None or any(s not in self.slots for s in slot.path):
            return super().worth(node)
        prefix = prefix_of(self, self.truth[: self.committed], node.slot)
        on_path = len(prefix) <= len(self.truth) and tuple(self.truth[: len(prefix)]) == prefix
        return 1e9 - len(prefix) if on_path else super().worth(node)


def calibration(tables: list[dict], K: int) -> list[list[float]]:
    """Per stage and probability decile: how often that stage's candidate was the token the final stage chose for
    the same prefix (the slot's own final candidate, where the unbounded run computed it)."""
    hits = [[[0, 0] for _ in range(10)] for _ in range(K)]
    for table in tables:
        for (prefix, k), (token, prob) in table.items():
            final = table.get((prefix, K - 1))
            if final is not None and k < K - 1:
                cell = hits[k][min(9, int(prob * 10))]
                cell[0] += token == final[0]
                cell[1] += 1
    return [[(h + 1) / (n + 2) for h, n in stage] for stage in hits]  # Laplace: an empty decile says 1/2


def calibrated(table: dict, rates: list[list[float]], K: int) -> dict:
    """``table`` with each non-final candidate's probability replaced by its stage and decile's rate."""
    return {
        key: (token, prob if key[1] == K - 1 else rates[key[1]][min(9, int(prob * 10))])
        for key, (token, prob) in table.items()
    }


def recorded_tables(args, split: str) -> list[dict]:
    """Each prompt's recording (cached beside ``--out``): {"prompt", "tokens", "rounds", "table"}."""
    cache = Path(f"{args.out}.{split}.table.json")
    if cache.is_file():
        return [
            {**p, "table": {(tuple(k[0]), k[1]): tuple(v) for k, v in p["table"]}}
            for p in json.loads(cache.read_text())
        ]
    model, tokenizer = load_model("default")
    decoder = DexDecoder(
        model,
        explorers=args.explorers,
        adapters="auto",
        tokenizer=tokenizer,
        prune=UNBOUNDED_ROWS,
        draft="auto",
    )
    half = args.prompts // 2
    items = prompt_set("humaneval", args.prompts - half, split) + prompt_set("chat", half, split)
    out = []
    for i, item in enumerate(items):
        prompt = encode_item(tokenizer, item)
        table, rounds, tokens = record(decoder, prompt, args.max_new_tokens)
        out.append({"prompt": prompt, "tokens": tokens, "rounds": rounds, "table": table})
        print(
            f"{split} {i + 1}/{len(items)}: {tokens} tokens, {rounds} rounds, {len(table)} prefixes",
            flush=True,
        )
    rows = [{**p, "table": [[[list(k[0]), k[1]], list(v)] for k, v in p["table"].items()]} for p in out]
    cache.write_text(json.dumps(rows))
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--explorers", type=int, default=8)
    parser.add_argument("--split", default="eval", choices=("eval", "tune"))
    parser.add_argument("--calibrate-split", default="tune", choices=("eval", "tune"))
    parser.add_argument("--prompts", type=int, default=10)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--budgets", default="4,6,8")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    K, bounds = args.explorers, DecoderOptions(draft="auto").draft  # the bounds the recording ran with
    prompts = recorded_tables(args, args.split)
    fitted = prompts if args.calibrate_split == args.split else recorded_tables(args, args.calibrate_split)
    rates = calibration([p["table"] for p in fitted], K)
    tables = {"worth": [p["table"] for p in prompts]}
    tables["calibrated"] = [calibrated(t, rates, K) for t in tables["worth"]]
    tokens = sum(p["tokens"] for p in prompts)
    real = sum(p["rounds"] for p in prompts)
    unbounded = [
        replay(t, p["prompt"], p["tokens"], K, bounds, None) for t, p in zip(tables["worth"], prompts)
    ]
    base = sum(r for r, _, _ in unbounded)
    print(f"unbounded: {base / tokens:.3f} rounds/token replayed, {real / tokens:.3f} run", flush=True)
    rows = []
    for name in ("worth", "calibrated", "oracle"):
        for budget in [int(b) for b in args.budgets.split(",")]:
            runs = [
                replay(table, p["prompt"], p["tokens"], K, bounds, budget, c if name == "oracle" else None)
                for table, p, (_, _, c) in zip(tables.get(name, tables["worth"]), prompts, unbounded)
            ]
            rounds, misses = sum(r for r, _, _ in runs), sum(m for _, m, _ in runs)
            rows.append(
                {
                    "ranking": name,
                    "budget": budget,
                    "rounds_per_token": rounds / tokens,
                    "unbounded_rounds_per_token": base / tokens,
                    "ratio": rounds / base,
                    "misses": misses,
                }
            )
            print(f"{name:10s} budget {budget}: {rounds / tokens:.3f} rounds/token, {rounds / base:.3f}x "
                  f"unbounded, {misses} misses", flush=True)  # fmt: skip
    report = {"split": args.split, "K": K, "tokens": tokens, "real_unbounded_rounds": real, "rows": rows}
    Path(args.out).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
