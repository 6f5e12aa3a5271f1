"""DEX vs Hugging Face greedy `generate` on the default model, token for token, with a profile.

    python benchmarks/real_model_exactness.py --prompts 10 --max-new-tokens 128 --explorers 4

For each prompt of ``--sets`` (default HumanEval: raw completion, no chat template; ``chat``: the
ShareGPT held-out split with the chat template; ``--prompts`` per set) it runs HF greedy `generate`
(`dex_core.hf_greedy`) and DEX (sequential schedule, `--adapters`, default 'auto') in the same dtype
and compares the tokens. A mismatch is explained: the AR logit gap between the two tokens at the
first differing position, and whether the float64 model agrees with DEX there. It reports rounds/token,
the depth-side speedup and the share of round time per component (bookkeeping = plan + masks + commit
+ collapse), and writes JSON with --out. With ``--temperature T`` (and ``--top-k``/``--top-p``) prompt i
is sampled with seed i and compared with the seeded AR sampler (``ar_generate``) instead of HF greedy;
``--prune`` bounds the lattice (default: the library's ``auto``). DEX uses the shipped adapters' best
set for K and light proposal heads.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch

from dex_core import DecoderOptions, DexConfig, DexDecoder, ar_generate, hf_greedy, load_model
from dex_core.config import ADAPTER_HELP
from dex_core.data import prompt_set
from dex_core.request import encode_item

# round timings that are totals of other entries, not components of the round
DERIVED_TIMINGS = ("round", "bookkeeping", "projected")


def explain_mismatch(model, depths, adapters, prompt, ref, got, index):
    """Logit gap of the AR model between its token and DEX's at the first differing position."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + ref[:index]])).logits[0, -1].double()
    gap = float(logits[ref[index]] - logits[got[index]])
    model64 = model.to(torch.float64)
    try:
        hf64 = hf_greedy(model64, prompt, len(ref))
        dex64 = DexDecoder(model64, depths=depths, adapters=adapters).generate(prompt, len(ref)).tokens
    finally:
        model.to(torch.float32)
    return {"index": index, "ar_token": ref[index], "dex_token": got[index], "logit_gap": gap,
            "float64_agrees": hf64 == dex64}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="default")
    parser.add_argument("--sets", default="humaneval", help="comma-separated prompt sets: humaneval, chat, builtin")
    parser.add_argument("--prompts", type=int, default=10, help="prompts per set")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--explorers", type=int, default=4)
    parser.add_argument("--adapters", default=DecoderOptions.adapters, help=ADAPTER_HELP)
    parser.add_argument("--dtype", default=DexConfig.dtype)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--top-k", type=int)
    parser.add_argument("--top-p", type=float)
    parser.add_argument("--prune", default=DecoderOptions.prune, help="lattice pruning: auto (the library's "
                        "default: 1 on CPU, off on GPUs), none, or a bound B")
    parser.add_argument("--out", help="write the results as JSON here")
    args = parser.parse_args(argv)

    model, tokenizer = load_model(args.model, dtype=args.dtype)
    decoder = DexDecoder(model, explorers=args.explorers, adapters=args.adapters, tokenizer=tokenizer, prune=args.prune)
    sampling = {"temperature": args.temperature, "top_k": args.top_k, "top_p": args.top_p}
    rows, totals = [], {}
    items = [item for name in args.sets.split(",") for item in prompt_set(name.strip(), args.prompts)]
    for i, item in enumerate(items):
        prompt = encode_item(tokenizer, item)
        tic = time.perf_counter()
        ref = hf_greedy(model, prompt, args.max_new_tokens) if not args.temperature else \
            ar_generate(model, prompt, args.max_new_tokens, seed=i, **sampling).tokens
        hf_seconds = time.perf_counter() - tic
        result = decoder.generate(prompt, args.max_new_tokens, **(dict(sampling, seed=i) if args.temperature else {}))
        row = {"id": item["id"], "prompt_tokens": len(prompt), "tokens": len(ref),
               "exact": result.tokens == ref, "rounds": result.stats.rounds,
               "rounds_per_token": result.stats.rounds_per_token, "hf_seconds": hf_seconds,
               "dex_seconds": result.stats.wall_seconds, "projected_seconds": result.stats.projected_seconds}
        if not row["exact"] and not args.temperature:
            first = next(i for i, (a, b) in enumerate(zip(ref, result.tokens)) if a != b)
            row["mismatch"] = explain_mismatch(model, decoder.depths, args.adapters, prompt, ref, result.tokens,
                                               first)
        for event in result.trace:
            if event["event"] == "round":
                for key, value in event["timings"].items():
                    totals[key] = totals.get(key, 0.0) + (sum(value) if isinstance(value, list) else value)
        rows.append(row)
        print(f"{row['id']:>14}  exact={row['exact']}  tokens={row['tokens']:>3}  rounds/token="
              f"{row['rounds_per_token']:.3f}" + (f"  mismatch={row['mismatch']}" if "mismatch" in row else ""),
              flush=True)

    tokens = sum(r["tokens"] for r in rows)
    rounds = sum(r["rounds"] for r in rows)
    shares = {k: v / totals["round"] for k, v in totals.items() if k not in DERIVED_TIMINGS}
    bookkeeping = totals["bookkeeping"] / totals["round"]
    summary = {"model": args.model, "dtype": args.dtype, "explorers": args.explorers, "sampling": sampling,
               "sets": args.sets, "prune": decoder.prune, "proposal_vocab": decoder.proposal_vocab,
               "depths": list(decoder.depths), "adapters": args.adapters,
               "adapter_depths": sorted(decoder.adapters), "prompts": len(rows), "tokens": tokens,
               "exact_prompts": sum(r["exact"] for r in rows), "rounds_per_token": rounds / tokens,
               "depth_speedup": args.explorers * tokens / rounds, "bookkeeping_share": bookkeeping,
               "round_time_shares": shares, "torch": torch.__version__, "threads": torch.get_num_threads()}
    print(f"\nexact: {summary['exact_prompts']}/{len(rows)} prompts, {tokens} tokens; rounds/token "
          f"{summary['rounds_per_token']:.3f}; depth-side speedup {summary['depth_speedup']:.3f}x")
    print("share of round time: " + ", ".join(f"{k} {100 * v:.2f}%" for k, v in shares.items())
          + f"; bookkeeping (plan+masks+commit+collapse) {100 * bookkeeping:.2f}%")
    if args.out:
        with open(args.out, "w") as fh:
            json.dump({"summary": summary, "rows": rows}, fh, indent=1)
    return 0 if summary["exact_prompts"] == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
