"""Depth readiness of the default model with and without inducing adapters, and real DEX runs.

    python benchmarks/adapter_readiness.py --adapters assets/adapters/smollm2-135m-instruct.safetensors \
        --prompts 20 --max-new-tokens 128 --dex-prompts 4 --out readiness.json

For held-out ShareGPT prompts (chat template) and HumanEval prompts (raw), greedy AR answers are
generated once; then for each uniform K the shallowest explored stage whose candidate equals the
committed token is read off one forward pass (exactly the stage a DEX run without DECS matches: see
tests/test_ead.py), giving the depth-side speedup K / mean(k + 1), plain lens vs adapters. Real DEX runs
(K = 4, adapters, DECS on) on the first --dex-prompts prompts of each set give measured values.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

from dex_core import DexDecoder, load_model, resolve_depths
from dex_core.adapters import load_adapters
from dex_core.cli import encode_prompt
from dex_core.data import humaneval_prompts, sharegpt_split
from dex_core.ead import layer_matches


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--adapters", required=True)
    parser.add_argument("--prompts", type=int, default=20)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--dex-prompts", type=int, default=4)
    parser.add_argument("--explorers", default="2,3,4")
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    model, tokenizer = load_model("default")
    adapters = load_adapters(args.adapters, model)
    L = model.config.num_hidden_layers
    sets = {"chat": [encode_prompt(tokenizer, r["prompt"][:2000], True) for r in sharegpt_split("heldout")[: args.prompts]],
            "humaneval": [encode_prompt(tokenizer, r["prompt"], False) for r in humaneval_prompts(args.prompts)]}
    ks = [int(k) for k in args.explorers.split(",")]
    report = {"adapters": args.adapters, "adapter_depths": sorted(adapters), "max_new_tokens": args.max_new_tokens,
              "sets": {}}
    for name, prompts in sets.items():
        firsts = {(k, kind): [] for k in ks for kind in ("plain", "adapters")}
        measured = {"tokens": 0, "rounds": 0}
        for i, prompt in enumerate(prompts):
            ids = torch.tensor([prompt])
            out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                 max_new_tokens=args.max_new_tokens)[0, len(prompt):].tolist()
            omega = {"plain": layer_matches(model, prompt, out), "adapters": layer_matches(model, prompt, out, adapters)}
            for k in ks:
                cols = [d - 1 for d in resolve_depths(L, explorers=k)]
                for kind, om in omega.items():
                    firsts[(k, kind)] += om[:, cols].float().argmax(dim=1).tolist()
            if i < args.dex_prompts:
                result = DexDecoder(model, explorers=4, adapters=args.adapters, trace_top=0).generate(
                    prompt, args.max_new_tokens)
                assert result.tokens == out, "DEX differs from AR"
                measured["tokens"] += len(out)
                measured["rounds"] += sum(s + 1 for s in result.stats.matched_stages)
            print(f"{name} {i}: {len(out)} tokens", flush=True)
        row = {f"K={k} {kind}": k * len(f) / sum(s + 1 for s in f) for (k, kind), f in firsts.items()}
        row["tokens"] = len(firsts[(ks[0], "plain")])
        if measured["tokens"]:
            row["K=4 adapters+DECS, measured DEX"] = 4 * measured["tokens"] / measured["rounds"]
            row["measured tokens"] = measured["tokens"]
        report["sets"][name] = row
        print(name, json.dumps(row, indent=1), flush=True)
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(report, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
