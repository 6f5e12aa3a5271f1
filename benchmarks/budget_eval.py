"""The row budget on prompts it was not tuned on (issue 60): the library's CPU defaults, this tree against a
baseline checkout, side by side in one run.

    git worktree add /tmp/dex-base <the commit before> && \\
    python benchmarks/budget_eval.py --baseline /tmp/dex-base --out docs/results/budget-eval.json

Two worker processes, each loading the default model (float32, CPU) and one ``DexDecoder(model, explorers=K)`` with
every other option at its default (so ``prune="auto"`` is each tree's own CPU default): one imports ``dex_core`` from
``--baseline``, the other from this tree. The driver sends them the same eval-split prompts (``prompt_set(name,
count, "eval")``; the rule is tuned on the ``tune`` split) one at a time, alternating which goes first, so only one
worker computes at a time and both see the same machine; each answers with its tokens, rounds and wall-clock
seconds (``generate`` end to end: prefill, every round, bookkeeping). Per set: tokens/s (tokens over the sum of the
runs' seconds) and rounds per token for each side, and the ratio. Every answer is checked against HF greedy
(``hf_greedy``, computed by this tree's worker after the timed runs). ``--out`` is written after every prompt and a
run with the same ``--out`` resumes where it stopped.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SETS = {"grounded": 15, "chat": 10, "humaneval": 10}  # eval prompts a set (grounded holds 15 a split)


def worker(explorers: int) -> None:
    """Answer the driver's lines ({"set", "index", "new"} or {"reference": ...}) on stdout, a JSON line each."""
    import time

    from dex_core import DexDecoder, hf_greedy, load_model
    from dex_core.data.sets import prompt_set
    from dex_core.runtime.request import encode_item

    model, tokenizer = load_model("default", device="cpu")
    decoder = DexDecoder(model, explorers=explorers, tokenizer=tokenizer)
    decoder.generate(encode_item(tokenizer, prompt_set("chat", 1, "tune")[0]), 8)  # warm-up
    print(json.dumps({"budget": decoder.prune}), flush=True)
    for line in sys.stdin:
        ask = json.loads(line)
        ids = encode_item(tokenizer, prompt_set(ask["set"], SETS[ask["set"]], "eval")[ask["index"]])
        if ask.get("reference"):
            print(json.dumps({"tokens": hf_greedy(model, ids, ask["new"])}), flush=True)
            continue
        tic = time.perf_counter()
        result = decoder.generate(ids, ask["new"])
        seconds = time.perf_counter() - tic
        print(
            json.dumps({"tokens": result.tokens, "rounds": result.stats.rounds, "seconds": seconds}),
            flush=True,
        )


class Worker:
    def __init__(self, checkout: Path, explorers: int):
        env = {**os.environ, "PYTHONPATH": str(checkout)}
        command = [sys.executable, __file__, "--worker", "--explorers", str(explorers)]
        self.process = subprocess.Popen(
            command, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        self.budget = self.read()["budget"]

    def read(self) -> dict:
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"a worker ended (exit {self.process.wait()})")
        return json.loads(line)

    def ask(self, **fields) -> dict:
        self.process.stdin.write(json.dumps(fields) + "\n")
        self.process.stdin.flush()
        return self.read()

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait(timeout=60)


def summary(runs: list[dict]) -> dict:
    tokens = sum(len(r["tokens"]) for r in runs)
    seconds = sum(r["seconds"] for r in runs)
    rounds = sum(r["rounds"] for r in runs)
    return {
        "prompts": len(runs),
        "tokens": tokens,
        "tokens_per_second": round(tokens / seconds, 3),
        "rounds_per_token": round(rounds / tokens, 4),
        "identical_to_hf_greedy": sum(r["exact"] for r in runs),
    }


def report(rows: dict) -> dict:
    out = {}
    for name, runs in rows.items():
        sides = {side: summary([r[side] for r in runs]) for side in ("baseline", "this_tree")}
        speed = sides["this_tree"]["tokens_per_second"] / sides["baseline"]["tokens_per_second"]
        out[name] = sides | {"speedup": round(speed, 3)}
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", type=Path, help="a checkout of the commit to compare with")
    parser.add_argument("--explorers", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--sets", default="grounded,chat,humaneval")
    parser.add_argument("--prompts", type=int, help="at most this many eval prompts a set")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.explorers)
        return 0
    saved = json.loads(args.out.read_text()) if args.out and args.out.is_file() else {}
    rows = saved.get("rows", {})
    sides = {
        "baseline": Worker(args.baseline.resolve(), args.explorers),
        "this_tree": Worker(ROOT, args.explorers),
    }
    budgets = {side: w.budget for side, w in sides.items()}
    try:
        for name in args.sets.split(","):
            runs = rows.setdefault(name, [])
            for index in range(len(runs), min(SETS[name], args.prompts or SETS[name])):
                order = list(sides) if index % 2 == 0 else list(sides)[::-1]  # who runs first alternates
                row = {
                    side: sides[side].ask(set=name, index=index, new=args.max_new_tokens) for side in order
                }
                ref = sides["this_tree"].ask(set=name, index=index, new=args.max_new_tokens, reference=True)
                for side in sides:
                    row[side]["exact"] = row[side]["tokens"] == ref["tokens"]
                runs.append(row)
                result = {"explorers": args.explorers, "new_tokens": args.max_new_tokens, "budgets": budgets}
                result |= {"summary": report({n: r for n, r in rows.items() if r}), "rows": rows}
                if args.out:
                    args.out.write_text(json.dumps(result, indent=1) + "\n")
                print(name, index, {side: round(row[side]["seconds"], 2) for side in order}, flush=True)
    finally:
        for w in sides.values():
            w.close()
    print(json.dumps(report(rows), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
