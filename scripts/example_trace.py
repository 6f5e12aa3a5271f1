"""The example trace the app shows on first page load (assets/traces/example.json).

    python scripts/example_trace.py [--explorers 4] [--tokens 48] [--draft auto] [--out assets/traces/example.json]

A real run of the default model through the app's own settings (the shipped adapters, DECS, greedy,
the app's ``TRACE_TOP`` candidates per node), saved with ``save_trace``; unpruned by default
(``--prune none``), so the example shows the whole lattice, as a GPU host runs it, with draft chains at
their default bounds (``--draft auto``). The prompt asks for a rewrite, whose answer repeats its input,
so the example holds draft chains and rounds that commit several tokens (cut chain nodes need ``gate=1``).
The default model must be available (it is fetched once and cached; later loads are offline).
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path

from app.host.settings import AppSettings
from app.host.state import Runtime
from app.ui.inputs import Inputs
from dex_core import save_trace
from dex_core.trace.events import RoundEvent

PROMPT = (
    "Rewrite this sentence in the past tense: The committee meets every Tuesday in the old library and "
    "votes on new projects."
)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="default")
    parser.add_argument("--explorers", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--prompt", default=PROMPT)
    parser.add_argument("--prune", default="none", help="lattice pruning: none, auto or a bound")
    parser.add_argument(
        "--draft", default="auto", help="draft chains: auto, none or bounds like 'length=8,chains=1'"
    )
    parser.add_argument("--out", default="assets/traces/example.json")
    args = parser.parse_args(argv)
    runtime = Runtime(AppSettings(model=args.model, explorers=args.explorers))
    config = dataclasses.replace(
        Inputs(explorers=args.explorers, max_new_tokens=args.tokens, prune=args.prune).config(),
        draft=args.draft,
    )
    ids = runtime.encode(args.prompt, config.chat)
    started = time.perf_counter()
    result = runtime.decoder(config).generate(ids, options=config.generation())
    _, tokenizer = runtime.model()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    save_trace(
        out,
        result.trace,
        {
            "model": args.model,
            "prompt": args.prompt,
            "explorers": args.explorers,
            "adapters": config.adapters,
            "source": "scripts/example_trace.py",
        },
    )
    rounds = [e for e in result.trace if isinstance(e, RoundEvent)]
    chains, several = sum(len(e.chains or []) for e in rounds), sum(len(e.commits) > 1 for e in rounds)
    print(
        f"{len(result.tokens)} tokens in {result.stats.rounds} rounds ({time.perf_counter() - started:.1f} s), "
        f"{chains} draft chains, {several} rounds of several commits: "
        f"{tokenizer.decode(result.tokens, skip_special_tokens=True)!r}"
    )
    print(f"trace written to {out} ({out.stat().st_size // 1024} KB)")


if __name__ == "__main__":
    main()
