"""Requests sharing rounds in bfloat16 (issue 61): every request's tokens certified by ``dex verify``.

    python benchmarks/shared_rounds_bf16.py --out docs/results/shared-rounds-bf16.json

The default model in bfloat16 on this CPU (K = 4, every other option at its default): ``--requests`` chat prompts
(the chat set's eval split; half greedy, half seeded sampling) in flight together on one decoder
(``DexDecoder.share``), their streams advanced in turn, so every explorer step holds all their rows. Each request's
trace is saved (``save_trace``, as ``dex generate --trace`` saves one) and checked by ``dex verify`` in a process of its
own: every committed token the unmodified model's choice or a near-tie of it. Also reports how many of them equal the
same request run alone on the same decoder (in bfloat16 a batch's rows may differ in their last bits, so a near-tie
may go the other, certified, way).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from baseline import emit  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    from dex_core import DexDecoder, load_model
    from dex_core.data.sets import prompt_set
    from dex_core.runtime.request import chat_ids
    from dex_core.trace.events import EndEvent
    from dex_core.trace.files import save_trace

    model, tokenizer = load_model("default", dtype="bfloat16", device="cpu")
    decoder = DexDecoder(model, tokenizer=tokenizer, explorers=4)
    items = prompt_set("chat", args.requests)
    prompts = [chat_ids(tokenizer, [{"role": "user", "content": i["prompt"]}], True) for i in items]
    options = [
        {} if i % 2 == 0 else {"temperature": 0.8, "top_p": 0.9, "seed": 100 + i} for i in range(len(items))
    ]
    alone = [decoder.generate(p, args.tokens, **o).tokens for p, o in zip(prompts, options)]
    decoder.share(len(prompts))
    streams = [decoder.stream(p, args.tokens, **o) for p, o in zip(prompts, options)]
    events: list[list] = [[] for _ in streams]
    live = set(range(len(streams)))
    while live:
        for i in sorted(live):
            event = next(streams[i], None)
            if event is None:
                live.discard(i)
            else:
                events[i].append(event)
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for i, run in enumerate(events):
            path = Path(folder) / f"request-{i}.json"
            save_trace(path, run, {"model": "default", "prompt": items[i]["prompt"]})
            done = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "dex_core.cli",
                    "verify",
                    str(path),
                    "--dtype",
                    "bfloat16",
                    "--device",
                    "cpu",
                ],
                capture_output=True,
                text=True,
                cwd=ROOT,
            )
            tokens = next(e for e in run if isinstance(e, EndEvent)).tokens
            certified = re.search(r"(\d+) of (\d+)", done.stdout)
            rows.append(
                {
                    "request": i,
                    "sampling": options[i] or "greedy",
                    "tokens": len(tokens),
                    "dex_verify": done.stdout.strip().splitlines()[-1]
                    if done.stdout.strip()
                    else done.stderr[-300:],
                    "exit": done.returncode,
                    "certified": certified.group(0) if certified else None,
                    "same_as_alone": tokens == alone[i],
                }
            )
    report = {
        "model": "default (SmolLM2-135M-Instruct, bfloat16, CPU)",
        "explorers": 4,
        "requests_sharing_rounds": len(prompts),
        "tokens": args.tokens,
        "requests": rows,
        "all_certified": all(r["exit"] == 0 for r in rows),
    }
    emit(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
