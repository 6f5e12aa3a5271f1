"""A shared round's parts, side by side at 1, 2, 4 and 8 requests in flight (issue 61: why sharing pays what it pays).

    python benchmarks/shared_round_parts.py --out docs/results/shared-round-parts.json

The default model (float32, K = 4, the CPU's defaults, the sequential schedule) in this process, its rounds shared
(``DexDecoder.share(8)``, as ``dex serve --http`` runs them): for each count c, the first c chat prompts of the chat
set's eval split (greedy, ``--tokens`` new tokens each) streamed at once, an event of each in turn. Per shared round:
its milliseconds and their parts (the stages' layers, ``Explorer.expand_seats``; the heads, ``crew.proposed``; the
host's work, the rest: planning, batches, token choice, commits, collapses, records), the rows the steps ran against
the lanes' real rows (the rest is padding: a lane with fewer nodes than the widest, or none at that stage), tokens
committed a round; and the run's model tokens/s (its tokens over its rounds' and prefills' seconds), against one
request. Each count runs twice more with attention reading each lane's whole KV capacity instead of the entries its
rows can see (``explorer.seen_columns``), alternating, so that the two are compared under the same load; of
``--repeat`` runs of each, the least disturbed (the fewest seconds). Not a test: about 10 minutes here.
"""

from __future__ import annotations

import argparse
import collections
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from baseline import emit  # noqa: E402


class Parts:
    """Wall seconds of the shared rounds' parts, and their rows, while ``watch`` is on."""

    def __init__(self):
        self.seconds, self.count = collections.Counter(), collections.Counter()

    def timed(self, name: str, f):
        def call(*args, **kwargs):
            tic = time.perf_counter()
            try:
                return f(*args, **kwargs)
            finally:
                self.seconds[name] += time.perf_counter() - tic
                self.count[name] += 1

        return call

    def watch(self):
        from dex_core.model.explorer import Explorer
        from dex_core.runtime import crew

        crew.shared_round = self.timed("round", crew.shared_round)
        crew.prefill = self.timed("prefill", crew.prefill)
        Explorer.expand_seats = self.timed("layers", Explorer.expand_seats)
        proposed = self.timed("heads", crew.proposed)

        def heads(e, out, real, view):
            self.count["rows_run"] += out.shape[0] * out.shape[1]
            self.count["rows_real"] += sum(n for _, _, n in real)
            return proposed(e, out, real, view)

        crew.proposed = heads


def run(decoder, prompts: list[list[int]], tokens: int, parts: Parts) -> tuple[collections.Counter, int]:
    """``prompts`` streamed at once on ``decoder``: the seconds and counts of its shared rounds' parts, and its
    tokens."""
    parts.seconds.clear()
    parts.count.clear()
    streams = [decoder.stream(p, tokens) for p in prompts]
    made = 0
    while streams:
        for stream in list(streams):
            event = next(stream, None)
            if event is None:
                streams.remove(stream)
            else:
                made += len(getattr(event, "commits", ()) or ())
    return parts.seconds + collections.Counter({f"n_{k}": v for k, v in parts.count.items()}), made


def summary(sums: collections.Counter, made: int) -> dict:
    """A run's (or runs') parts a round, rows and tokens/s."""
    rounds = sums["n_round"]
    ms = {k: round(1000 * sums[k] / rounds, 1) for k in ("round", "layers", "heads")}
    return {
        "rounds": rounds,
        "tokens": made,
        "round_ms": ms["round"],
        "layers_ms": ms["layers"],
        "heads_ms": ms["heads"],
        "host_ms": round(ms["round"] - ms["layers"] - ms["heads"], 1),
        "prefill_seconds": round(sums["prefill"], 2),
        "real_rows_share": round(sums["n_rows_real"] / max(1, sums["n_rows_run"]), 2),
        "rows_run_per_round": round(sums["n_rows_run"] / rounds, 1),
        "tokens_per_round": round(made / rounds, 2),
        "model_tokens_per_second": round(made / (sums["round"] + sums["prefill"]), 2),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--requests", default="1,2,4,8", help="the counts of requests in flight, comma-separated"
    )
    parser.add_argument("--tokens", type=int, default=64, help="new tokens a request, at most")
    parser.add_argument("--repeat", type=int, default=2, help="runs of each; the least disturbed is reported")
    parser.add_argument("--out", type=Path, help="the report (JSON)")
    args = parser.parse_args()

    import dex_core.model.explorer as explorer
    from dex_core import DexDecoder, load_model
    from dex_core.data.sets import prompt_set
    from dex_core.runtime.request import chat_ids

    counts = [int(c) for c in args.requests.split(",")]
    parts = Parts()
    parts.watch()
    model, tokenizer = load_model("default", device="cpu")
    decoder = DexDecoder(model, tokenizer=tokenizer, explorers=4)
    items = prompt_set("chat", max(counts))
    prompts = [chat_ids(tokenizer, [{"role": "user", "content": i["prompt"]}], True) for i in items]
    decoder.share(max(counts))
    decoder.generate(prompts[0], 8)  # warm-up
    variants = {
        "seen_columns": explorer.seen_columns,
        "whole_capacity": lambda seats: seats[0].cache.lanes.capacity,
    }
    alone: dict = {}  # (variant, prompt) -> the least disturbed lone run's (sums, tokens)
    shared: dict = {}  # (variant, count) -> the least disturbed shared run's
    for _ in range(args.repeat):
        for name, columns in variants.items():
            explorer.seen_columns = columns
            for key, group in [((name, i), [p]) for i, p in enumerate(prompts)] + [
                ((name, c), prompts[:c]) for c in counts if c > 1
            ]:
                got = run(decoder, group, args.tokens, parts)
                book = alone if len(group) == 1 else shared
                seconds = got[0]["round"] + got[0]["prefill"]
                what = f"prompt {key[1]} alone" if book is alone else f"{key[1]} requests at once"
                print(f"{name}, {what}: {seconds:.1f} s, {got[1]} tokens", flush=True)
                if key not in book or seconds < book[key][0]["round"] + book[key][0]["prefill"]:
                    book[key] = got
    explorer.seen_columns = variants["seen_columns"]
    report = {
        "model": "default (SmolLM2-135M-Instruct, float32, CPU, K = 4, sequential, rounds shared)",
        "prompt_tokens": [len(p) for p in prompts],
        "new_tokens": args.tokens,
        "runs": {},
    }
    for name in variants:
        rows = {}
        for c in counts:
            lone = [alone[(name, i)] for i in range(c)]
            sums, made = sum((s for s, _ in lone), collections.Counter()), sum(m for _, m in lone)
            one_at_a_time = summary(sums, made)
            row = summary(*shared[(name, c)]) if c > 1 else one_at_a_time
            rate = one_at_a_time["model_tokens_per_second"]
            rows[str(c)] = {
                **row,
                "one_at_a_time_tokens_per_second": rate,
                "vs_one_at_a_time": round(row["model_tokens_per_second"] / rate, 2),
            }
        report["runs"][name] = rows
    emit(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
