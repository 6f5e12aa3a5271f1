"""DEX's tokens/s on a real model, sequential schedule, side by side with another checkout's.

    python benchmarks/dex_speed.py --baseline /tmp/dex-head --out runs/dex-speed.json

The default model (SmolLM2-135M-Instruct, float32, its shipped adapters and every other option at its default),
K explorers, greedy, three chat prompts of ``--new`` tokens each after one warm-up run; of ``--repeat`` passes
over the prompts the fastest (the least disturbed). Wall-clock on this machine's CPU threads (``--threads``): what
a user of the library waits for, layers and bookkeeping together. ``--baseline DIR`` measures the ``dex_core`` of
another checkout in a child process first (``benchmarks/baseline.py``), then this tree's, and prints the ratio.
"""

from __future__ import annotations

import argparse
import json
import time

from baseline import measured_in

PROMPTS = [
    "Write a Python function that reverses a string.",
    "Explain what a hash map is.",
    "List three prime numbers and say why they are prime.",
]


def run(explorers: int, new: int, repeat: int, threads: int) -> dict:
    import torch

    import dex_core
    from dex_core import DexDecoder
    from dex_core.model.load import load_model
    from dex_core.runtime.request import encode_prompt

    torch.set_num_threads(threads)
    model, tokenizer = load_model("default", dtype="float32", device="cpu")
    prompts = [encode_prompt(tokenizer, p, True) for p in PROMPTS]
    decoder = DexDecoder(model, explorers=explorers)
    decoder.generate(prompts[0], new)  # warm-up
    best, tokens = 0.0, None
    for _ in range(repeat):
        tic = time.perf_counter()
        results = [decoder.generate(p, new) for p in prompts]
        best = max(best, sum(len(r.tokens) for r in results) / (time.perf_counter() - tic))
        tokens = [r.tokens for r in results]
    return {"source": dex_core.__file__, "tokens_per_second": best, "tokens": tokens}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--explorers", type=int, default=4)
    parser.add_argument("--new", type=int, default=48)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--baseline", help="also measure the dex_core of this checkout (before/after)")
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    argv = ["--explorers", str(args.explorers), "--new", str(args.new), "--repeat", str(args.repeat)]
    results = {}
    if args.baseline:
        results["before"] = measured_in(args.baseline, __file__, [*argv, "--threads", str(args.threads)])
        print(f"before ({args.baseline}): {results['before']['tokens_per_second']:.2f} tokens/s", flush=True)
    results["after"] = run(args.explorers, args.new, args.repeat, args.threads)
    print(f"after: {results['after']['tokens_per_second']:.2f} tokens/s")
    if args.baseline:
        before, after = results["before"], results["after"]
        print(
            f"after / before: {after['tokens_per_second'] / before['tokens_per_second']:.3f}; "
            f"same tokens: {before['tokens'] == after['tokens']}"
        )
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
