"""The example trace the app shows on first page load (assets/traces/example.json).

    python scripts/example_trace.py [--model default] [--prompt TEXT] [--out assets/traces/example.json]

A real run of the default model with the page's defaults: the options the Live tab's Generate sends when no
control was touched (``app.ui.inputs.Inputs``: K = 4, the shipped adapters, DECS, draft chains at their default
bounds, lattice pruning "auto", greedy, the app's ``TRACE_TOP`` candidates per node), on the server's defaults
(``AppSettings``: float32 on the CPU), saved with ``save_trace``. So Generate on the example's prompt, on a CPU
host, makes the same run (tests/app/test_example_trace.py holds the trace to those defaults). The prompt asks for a
rewrite, whose answer repeats its input, so the example holds draft chains and rounds that commit several tokens.
The default model must be available (it is fetched once and cached; later loads are offline).
"""

from __future__ import annotations

import argparse
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
    parser.add_argument("--model", default=AppSettings.model)
    parser.add_argument("--prompt", default=PROMPT)
    parser.add_argument("--out", default="assets/traces/example.json")
    args = parser.parse_args(argv)
    runtime = Runtime(AppSettings(model=args.model))
    config = Inputs(prompt=args.prompt).config()  # the page's defaults, as Generate sends them
    ids = runtime.encode(args.prompt, config.chat)
    started = time.perf_counter()
    result = runtime.decoder(config).generate(ids, options=config.generation(), node_text=True)
    _, tokenizer = runtime.model()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    save_trace(
        out,
        result.trace,
        {
            "model": args.model,
            "prompt": args.prompt,
            "source": "scripts/example_trace.py (the page's defaults)",
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
