"""Held-out KL of the shipped inducing adapters against the plain logit lens (issue 31, item 4).

    python benchmarks/adapter_kl.py --model gemma3-270m --out docs/results/adapter-kl-gemma3-270m.json

Adapters trained with the shortlist loss (``dex train-adapters --shortlist N``: KL over the light head's N tokens,
the teacher renormalised on them) are scored here on windows of ShareGPT's held-out split (2% by id hash, never
trained on) by ``training.train.distill_loss`` itself, per depth: KL(final layer || depth) over the **full
vocabulary** and over the shortlist, for the adapter and for the plain lens (no adapter: the depth's hidden state
through the final norm and the LM head). Float32, no autocast. Not a test: it loads a real model (minutes).
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
from pathlib import Path

import torch
from torch import nn

from dex_core.data.ranking import token_ranking
from dex_core.model.adapter_choice import load_adapters
from dex_core.model.load import load_model
from dex_core.model.proposal import ProposalHead
from dex_core.model.view import model_view
from dex_core.training.data import token_windows
from dex_core.training.train import distill_loss


def kl_table(model, tokenizer, adapters: dict, windows: int, seq_len: int, batch: int, rows: int) -> dict:
    """Per depth: mean KL per token, full vocabulary and shortlist, adapter and plain lens."""
    shortlist = ProposalHead(model_view(model), token_ranking(tokenizer, model.config.vocab_size)[:rows])
    stream = token_windows(tokenizer, seq_len, seed=0, split="heldout")
    sums = {d: dict.fromkeys(_KEYS, 0.0) for d in adapters}
    done = 0
    while done < windows:
        n = min(batch, windows - done)
        x = torch.stack(list(itertools.islice(stream, n))).to(model.device)
        for d, adapter in adapters.items():
            for lens, module in (("adapter", adapter), ("plain lens", nn.Identity())):
                for vocab, head in (("full", None), ("shortlist", shortlist)):
                    kl = distill_loss(model, {d: module}, x, bf16=False, shortlist=head).item()
                    sums[d][f"{vocab}, {lens}"] += kl * n
        done += n
        print(f"  {done}/{windows} windows", flush=True)
    return {d: {k: v / windows for k, v in row.items()} for d, row in sums.items()}


_KEYS = ("full, adapter", "full, plain lens", "shortlist, adapter", "shortlist, plain lens")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="gemma3-270m")
    ap.add_argument("--adapters", default="default", help="adapter file, or 'default': the shipped one")
    ap.add_argument("--windows", type=int, default=24, help="held-out windows")
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--shortlist", type=int, default=16384, help="the training shortlist's rows")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.set_grad_enabled(False)
    tic = time.perf_counter()
    model, tokenizer = load_model(args.model, dtype="float32", device="cpu")
    adapters = load_adapters(args.adapters, model)
    table = kl_table(model, tokenizer, adapters, args.windows, args.seq_len, args.batch, args.shortlist)
    report = {
        "model": args.model,
        "adapters": args.adapters,
        "data": "ShareGPT V3 held-out split (first exchange, chat template), packed",
        "tokens": args.windows * args.seq_len,
        "shortlist_rows": args.shortlist,
        "vocabulary": model.config.vocab_size,
        "kl_per_token": {str(d): row for d, row in table.items()},
        "seconds": time.perf_counter() - tic,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1))
    print("depth | " + " | ".join(_KEYS))
    for d, row in table.items():
        print(f"{d} | " + " | ".join(f"{row[k]:.3f}" for k in _KEYS))


if __name__ == "__main__":
    main()
