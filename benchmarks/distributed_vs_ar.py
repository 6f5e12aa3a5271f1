"""DEX on real explorer processes vs autoregressive decoding, side by side in one run.

    python benchmarks/distributed_vs_ar.py --explorers 2 --prompts 8 --max-new-tokens 128 --out dist.json

Methods, interleaved prompt by prompt after one warm-up each, same prompts, greedy:
- AR (2 threads): HF ``generate`` (``dex_core.hf_greedy``) with torch using 2 threads;
- AR (1 thread):  the same with 1 thread;
- DEX (K explorers): ``DexDecoder(backend="distributed")``, one process and ``--threads-per-explorer``
  threads per explorer (gloo on CPU; cuda:k per explorer when K GPUs are visible), with ``--adapters``
  (default 'auto': the shipped set on the default model, and its best set for K);
- DEX projected: the same decoder options on the sequential schedule in this process (torch using
  ``--threads-per-explorer`` threads), its projected K-device time (slowest explorer's measured
  expansion + bookkeeping + decode per round) plus communication from the machine's profile
  (``dex_core.analysis.profile``: the exchange timed between two real gloo processes) — the projection the
  benchmark validates, prompt by prompt, against the distributed measurement.
Tokens/s = new tokens / end-to-end time. Every DEX output is compared token by token with AR's.
The profile splits DEX's round time the paper's way (Table 1) from rank 0's view: expansion (its stage
forward + LM head + masks), communication (waiting on peers), collapse (commit + cache compaction),
decode/commit (token choice, lattice bookkeeping, trace records).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch

from dex_core import DecoderOptions, DexConfig, DexDecoder, encode_prompt, hf_greedy, load_model
from dex_core.analysis.profile import exchange_seconds, measure_profile
from dex_core.config import ADAPTER_HELP, DEVICE_HELP
from dex_core.data.sets import humaneval_prompts
from dex_core.trace.events import RoundEvent


def ar(model, prompt, new, threads):
    torch.set_num_threads(threads)
    tic = time.perf_counter()
    tokens = hf_greedy(model, prompt, new)
    return tokens, time.perf_counter() - tic


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="default")
    parser.add_argument(
        "--device",
        default=DexConfig.device,
        help=DEVICE_HELP + " (AR; the explorers use one device of this kind each)",
    )
    parser.add_argument("--explorers", type=int, default=2)
    parser.add_argument("--adapters", default=DecoderOptions.adapters, help=ADAPTER_HELP)
    parser.add_argument("--threads-per-explorer", type=int, default=1)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--chat", action="store_true", help="wrap prompts in the chat template")
    parser.add_argument("--out")
    args = parser.parse_args(argv)

    model, tokenizer = load_model(args.model, device=args.device)
    prompts = [encode_prompt(tokenizer, p["prompt"], args.chat) for p in humaneval_prompts(args.prompts)]
    devices = None if model.device.type == "cuda" else ("cpu",) * args.explorers  # AR's kind of device
    decoder = DexDecoder(
        model,
        explorers=args.explorers,
        adapters=args.adapters,
        backend="distributed",
        threads=args.threads_per_explorer,
        devices=devices,
        tokenizer=tokenizer,
    )
    sequential = DexDecoder(model, explorers=args.explorers, adapters=args.adapters, tokenizer=tokenizer)
    torch.set_num_threads(args.threads_per_explorer)
    machine = measure_profile(model, sequential.proposal_vocab)
    per_prompt = []
    try:
        ar(model, prompts[0], 8, 2), ar(model, prompts[0], 8, 1), decoder.generate(prompts[0], 8)  # warm-up
        sequential.generate(prompts[0], 8)
        totals = {"ar2": [0, 0.0], "ar1": [0, 0.0], "dex": [0, 0.0], "projected": [0, 0.0]}
        profile = {"expansion": 0.0, "communication": 0.0, "collapse": 0.0, "decode_commit": 0.0}
        rounds, exact = 0, 0
        for i, prompt in enumerate(prompts):
            ref, t2 = ar(model, prompt, args.max_new_tokens, 2)
            _, t1 = ar(model, prompt, args.max_new_tokens, 1)
            tic = time.perf_counter()
            result = decoder.generate(prompt, args.max_new_tokens)
            td = time.perf_counter() - tic
            torch.set_num_threads(args.threads_per_explorer)
            seq = sequential.generate(prompt, args.max_new_tokens).stats
            tp = seq.projected_seconds + sum(exchange_seconds(machine, b) for b in seq.batch_sizes)
            exact += result.tokens == ref
            rounds += result.stats.rounds
            per_prompt.append(
                {
                    "tokens": len(ref),
                    "measured_tokens_per_second": len(ref) / td,
                    "projected_tokens_per_second": len(ref) / tp,
                    "projected_over_measured": td / tp,
                    "ar2_tokens_per_second": len(ref) / t2,
                }
            )
            for key, seconds in (("ar2", t2), ("ar1", t1), ("dex", td), ("projected", tp)):
                totals[key][0] += len(ref)
                totals[key][1] += seconds
            for event in result.trace:
                if isinstance(event, RoundEvent):
                    t = event.timings
                    profile["expansion"] += t["expand"][0] + t["masks"]
                    profile["communication"] += t["communication"]
                    profile["collapse"] += t["commit"] + t["collapse"]
                    profile["decode_commit"] += t["decode"] + t["plan"] + t["trace"]
            print(
                f"prompt {i}: {len(ref)} tokens  AR2 {len(ref) / t2:.1f}  AR1 {len(ref) / t1:.1f}  "
                f"DEX {len(ref) / td:.1f} (projected {len(ref) / tp:.1f}) tok/s  exact={result.tokens == ref}  "
                f"rounds/token {result.stats.rounds_per_token:.3f}",
                flush=True,
            )
    finally:
        decoder.close()

    tps = {k: n / s for k, (n, s) in totals.items()}
    whole = sum(profile.values())
    tokens = totals["dex"][0]
    summary = {
        "model": args.model,
        "explorers": args.explorers,
        "depths": list(decoder.depths),
        "threads_per_explorer": args.threads_per_explorer,
        "devices": decoder.group.devices,
        "adapters": args.adapters,
        "adapter_depths": sorted(decoder.adapters),
        "prompts": len(prompts),
        "tokens": tokens,
        "exact_prompts": exact,
        "rounds_per_token": rounds / tokens,
        "depth_speedup": args.explorers * tokens / rounds,
        "depth_choice": decoder.depth_choice,
        "proposal_vocab": decoder.proposal_vocab,
        "tokens_per_second": tps,
        "dex_over_ar2": tps["dex"] / tps["ar2"],
        "dex_over_ar1": tps["dex"] / tps["ar1"],
        "projected_over_measured": tps["projected"] / tps["dex"],
        "per_prompt": per_prompt,
        "exchange_profile_seconds": machine["exchange"],
        "profile_shares": {k: v / whole for k, v in profile.items()},
        "torch": torch.__version__,
    }
    print(json.dumps(summary, indent=1))
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(summary, fh, indent=1)
    return 0 if exact == len(prompts) else 1


if __name__ == "__main__":
    sys.exit(main())
