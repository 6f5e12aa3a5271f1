"""DEX vs the AR reference and HF greedy `generate` on the default model, token for token, each token
certified against the unmodified model (`dex verify`'s check), with a profile.

    python benchmarks/real_model_exactness.py --sets humaneval,chat --prompts 20 --max-new-tokens 128 \
        --explorers 4 --dtype bfloat16 --out docs/results/exactness-bf16-k4.json

For each prompt of ``--sets`` (``humaneval``: raw completion, no chat template; ``chat``: the ShareGPT
held-out split with the chat template; the first ``--prompts`` of each set's eval split) it runs the AR
reference (`ar_generate`: the model's own forward with a KV cache and DEX's sampler), HF greedy
`generate` (greedy only) and DEX (sequential schedule, `--adapters`, default 'auto': the shipped
adapters' best set for K, light proposal heads) in one dtype, and reports per prompt: DEX identical to
the AR reference, DEX identical to HF greedy (and the AR reference to HF greedy), the near-tie commits
DEX's trace marks, and how many of DEX's and the AR reference's tokens one teacher-forced forward of
the unmodified model certifies (`dex_core.evaluation.verify`: the model's choice or within the tie gap), with the
worst gap. In float32/float64 DEX must be identical to the AR reference; in bfloat16/float16 every
token must be certified. A divergence names its first index, both tokens and DEX's gap there. With
``--temperature T`` (and ``--top-k``/``--top-p``) prompt i is sampled with seed ``--seed`` + i (no HF
greedy then). It prints a markdown table, rounds/token, the depth-side speedup and the share of round
time per component (bookkeeping = plan + masks + commit + collapse), and writes JSON with --out. Exit
code 0 when the dtype's guarantee held on every prompt, else 1.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch

from dex_core import DecoderOptions, DexConfig, DexDecoder, ar_generate, hf_greedy, load_model
from dex_core.algorithm.sampling import TIE_ULPS
from dex_core.config import ADAPTER_HELP, DEVICE_HELP
from dex_core.data.sets import prompt_set
from dex_core.evaluation.verify import verify_trace
from dex_core.runtime.request import encode_item
from dex_core.runtime.settings import AUTO_ROWS
from dex_core.trace.events import RoundEvent

# round timings that are totals of other entries, not components of the round
DERIVED_TIMINGS = ("round", "bookkeeping", "projected")


def divergence(ref: list[int], got: list[int], cert) -> dict | None:
    """The first index where DEX's tokens leave the reference's, both tokens, and DEX's certified gap there."""
    index = next((i for i, (a, b) in enumerate(zip(ref, got)) if a != b), None)
    if index is None:
        return (
            None
            if len(ref) == len(got)
            else {"index": min(len(ref), len(got)), "lengths": [len(ref), len(got)]}
        )
    check = cert.checks[index]
    return {
        "index": index,
        "reference_token": ref[index],
        "dex_token": got[index],
        "dex_gap": check.gap,
        "tie_gap": check.tie_gap,
        "certified": check.certified,
    }


def markdown(rows: list[dict], summary: dict) -> str:
    """Per prompt: identity with the references, near-tie commits, certified tokens (worst gap)."""

    def cert(n, total, gap):
        return f"{n}/{total} ({gap:.3g})"

    yes = {True: "yes", False: "**no**", None: "—"}
    lines = [
        "| prompt | tokens | DEX = AR reference | DEX = HF greedy | AR reference = HF greedy | near-tie commits "
        "| DEX certified (worst gap) | AR reference certified (worst gap) | rounds/token |",
        "|---" * 9 + "|",
    ]
    for r in rows:
        lines.append(
            f"| {r['id']} | {r['tokens']} | {yes[r['identical_ar']]} | {yes[r['identical_hf']]} | "
            f"{yes[r['ar_identical_hf']]} | {r['near_ties']} | "
            f"{cert(r['dex_certified'], r['tokens'], r['dex_worst_gap'])} | "
            f"{cert(r['ar_certified'], r['ar_tokens'], r['ar_worst_gap'])} | {r['rounds_per_token']:.3f} |"
        )
    s = summary
    hf = "—" if s["identical_hf"] is None else f"{s['identical_hf']}/{s['prompts']}"
    ar_hf = "—" if s["ar_identical_hf"] is None else f"{s['ar_identical_hf']}/{s['prompts']}"
    lines.append(
        f"| **all** | {s['tokens']} | {s['identical_ar']}/{s['prompts']} | {hf} | {ar_hf} | {s['near_ties']} | "
        f"{cert(s['dex_certified'], s['tokens'], s['dex_worst_gap'])} | "
        f"{cert(s['ar_certified'], s['ar_tokens'], s['ar_worst_gap'])} | {s['rounds_per_token']:.3f} |"
    )
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="default")
    parser.add_argument(
        "--sets", default="humaneval,chat", help="comma-separated prompt sets: humaneval, chat, builtin"
    )
    parser.add_argument(
        "--prompts", type=int, default=20, help="prompts per set (the first of its eval split)"
    )
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--explorers", type=int, default=4)
    parser.add_argument("--adapters", default=DecoderOptions.adapters, help=ADAPTER_HELP)
    parser.add_argument("--dtype", default=DexConfig.dtype)
    parser.add_argument("--device", default=DexConfig.device, help=DEVICE_HELP)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--top-k", type=int)
    parser.add_argument("--top-p", type=float)
    parser.add_argument(
        "--seed", type=int, default=0, help="sampling: prompt i is sampled with seed SEED + i"
    )
    parser.add_argument(
        "--prune",
        default=DecoderOptions.prune,
        help=f"the lattice's row budget: auto (the library's default: {AUTO_ROWS['cpu']} on CPU, "
        f"{AUTO_ROWS['accelerator']} on GPUs), none, or B",
    )
    parser.add_argument("--out", help="write the results as JSON here")
    args = parser.parse_args(argv)

    model, tokenizer = load_model(args.model, dtype=args.dtype, device=args.device)
    decoder = DexDecoder(
        model, explorers=args.explorers, adapters=args.adapters, tokenizer=tokenizer, prune=args.prune
    )
    sampling = {"temperature": args.temperature, "top_k": args.top_k, "top_p": args.top_p}
    rows, totals = [], {}
    sampled = args.temperature > 0
    items = [item for name in args.sets.split(",") for item in prompt_set(name.strip(), args.prompts)]
    for i, item in enumerate(items):
        prompt = encode_item(tokenizer, item)
        options = dict(sampling, seed=args.seed + i) if sampled else {}
        tic = time.perf_counter()
        ar = ar_generate(model, prompt, args.max_new_tokens, **options)
        ar_seconds = time.perf_counter() - tic
        hf = None if sampled else hf_greedy(model, prompt, args.max_new_tokens)
        result = decoder.generate(prompt, args.max_new_tokens, **options)
        dex_cert, ar_cert = verify_trace(result.trace, model=model), verify_trace(ar.trace, model=model)
        commits = [c for e in result.trace if isinstance(e, RoundEvent) for c in e.commits]
        row = {
            "id": item["id"],
            "prompt_tokens": len(prompt),
            "seed": options.get("seed"),
            "tokens": len(result.tokens),
            "ar_tokens": len(ar.tokens),
            "identical_ar": result.tokens == ar.tokens,
            "identical_hf": None if hf is None else result.tokens == hf,
            "ar_identical_hf": None if hf is None else ar.tokens == hf,
            "near_ties": sum(bool(c.near_tie) for c in commits),
            "dex_certified": dex_cert.certified,
            "dex_worst_gap": dex_cert.worst_gap,
            "ar_certified": ar_cert.certified,
            "ar_worst_gap": ar_cert.worst_gap,
            "uncertified": [vars(c) for c in dex_cert.uncertified + ar_cert.uncertified],
            "rounds": result.stats.rounds,
            "rounds_per_token": result.stats.rounds_per_token,
            "ar_seconds": ar_seconds,
            "dex_seconds": result.stats.wall_seconds,
            "projected_seconds": result.stats.projected_seconds,
        }
        if (split := divergence(ar.tokens, result.tokens, dex_cert)) is not None:
            row["divergence_from_ar"] = split
        for event in result.trace:
            if isinstance(event, RoundEvent):
                for key, value in event.timings.items():
                    totals[key] = totals.get(key, 0.0) + (sum(value) if isinstance(value, list) else value)
        rows.append(row)
        print(
            f"{row['id']:>14}  DEX=AR {row['identical_ar']}  DEX=HF {row['identical_hf']}  tokens={row['tokens']:>3}  "
            f"certified {row['dex_certified']}/{row['tokens']} (worst gap {row['dex_worst_gap']:.3g})  near-ties "
            f"{row['near_ties']}  rounds/token {row['rounds_per_token']:.3f}"
            + (f"  divergence={split}" if split else ""),
            flush=True,
        )

    tokens = sum(r["tokens"] for r in rows)
    rounds = sum(r["rounds"] for r in rows)
    shares = {k: v / totals["round"] for k, v in totals.items() if k not in DERIVED_TIMINGS}
    bookkeeping = totals["bookkeeping"] / totals["round"]

    def count(key):
        return None if sampled else sum(r[key] for r in rows)

    summary = {
        "model": args.model,
        "dtype": args.dtype,
        "device": str(model.device),
        "explorers": args.explorers,
        "sampling": sampling,
        "seed": args.seed if sampled else None,
        "sets": args.sets,
        "max_new_tokens": args.max_new_tokens,
        "prune": decoder.prune,
        "proposal_vocab": decoder.proposal_vocab,
        "depths": list(decoder.depths),
        "adapters": args.adapters,
        "adapter_depths": sorted(decoder.adapters),
        "prompts": len(rows),
        "tokens": tokens,
        "ar_tokens": sum(r["ar_tokens"] for r in rows),
        "identical_ar": sum(r["identical_ar"] for r in rows),
        "identical_hf": count("identical_hf"),
        "ar_identical_hf": count("ar_identical_hf"),
        "near_ties": sum(r["near_ties"] for r in rows),
        "dex_certified": sum(r["dex_certified"] for r in rows),
        "dex_worst_gap": max(r["dex_worst_gap"] for r in rows),
        "ar_certified": sum(r["ar_certified"] for r in rows),
        "ar_worst_gap": max(r["ar_worst_gap"] for r in rows),
        "tie_ulps": TIE_ULPS,
        "rounds_per_token": rounds / tokens,
        "depth_speedup": args.explorers * tokens / rounds,
        "bookkeeping_share": bookkeeping,
        "round_time_shares": shares,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
    }
    print("\n" + markdown(rows, summary) + "\n")
    print(
        f"rounds/token {summary['rounds_per_token']:.3f}; depth-side speedup {summary['depth_speedup']:.3f}x; "
        f"tie gap {TIE_ULPS} units in the last place of the logit's magnitude in {args.dtype}"
    )
    print(
        "share of round time: "
        + ", ".join(f"{k} {100 * v:.2f}%" for k, v in shares.items())
        + f"; bookkeeping (plan+masks+commit+collapse) {100 * bookkeeping:.2f}%"
    )
    if args.out:
        with open(args.out, "w") as fh:
            json.dump({"summary": summary, "rows": rows}, fh, indent=1)
    exact_dtype = args.dtype in ("float32", "float64")
    held = (
        summary["dex_certified"] == tokens
        and summary["ar_certified"] == summary["ar_tokens"]
        and (not exact_dtype or summary["identical_ar"] == len(rows))
    )
    return 0 if held else 1


if __name__ == "__main__":
    sys.exit(main())
