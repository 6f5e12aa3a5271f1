"""A few rows through a stage's weights on this CPU: ``F.linear`` against the transposed product ``W @ x.T``.

    python benchmarks/cpu_small_rows.py --out docs/results/cpu-small-rows.json

REFERENCE.md measured that MKL's small-M GEMM roughly doubles a step's time from 1 row to 2 (the head: 20 -> 47 ms)
and then stays nearly flat. This asks whether that is the matrix product or its layout: the default model's weights
(float32, CPU), a K = 4 stage's first 8 decoder layers (every ``nn.Linear`` of them, in the order a step runs them) and
the tied LM head, times M rows through ``F.linear(x, W)`` (``x @ W.T``: what ``nn.Linear`` and the heads run) and
through ``(W @ x.T).T`` (the same products, with the weight as the left operand). Per row count: the median
milliseconds of ``--repeat`` passes, the two forms alternating pass by pass so that both see the same load, and the
largest difference between their outputs relative to the output's scale. A lead, not a change: nothing in
``dex_core`` runs the second form. Not a test: about 15 seconds here.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from baseline import emit  # noqa: E402

FORMS = {"linear": lambda x, w: F.linear(x, w), "transposed": lambda x, w: (w @ x.T).T}


def stage_weights(model, layers: int) -> list[torch.Tensor]:
    """Every ``nn.Linear`` weight of the model's first ``layers`` decoder layers, in module order."""
    weights = []
    for layer in model.model.layers[:layers]:
        weights += [m.weight.detach() for m in layer.modules() if isinstance(m, torch.nn.Linear)]
    return weights


def timed(form, rows: int, weights: list[torch.Tensor], inputs: dict) -> float:
    """Milliseconds of one pass of ``rows`` rows through ``weights`` in ``form``."""
    tic = time.perf_counter()
    for w in weights:
        form(inputs[w.shape[1]][:rows], w)
    return 1000 * (time.perf_counter() - tic)


def disagreement(rows: int, weights: list[torch.Tensor], inputs: dict) -> float:
    """The largest |linear - transposed| over the outputs, relative to the largest |output|."""
    worst = 0.0
    for w in weights:
        x = inputs[w.shape[1]][:rows]
        a, b = FORMS["linear"](x, w), FORMS["transposed"](x, w)
        worst = max(worst, ((a - b).abs().max() / a.abs().max()).item())
    return worst


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default="1,2,3,4,5,6,8,12,16", help="row counts, comma-separated")
    parser.add_argument("--layers", type=int, default=8, help="decoder layers in the stage (K = 4: 7 or 8)")
    parser.add_argument("--repeat", type=int, default=7, help="passes of each form a row count; the median")
    parser.add_argument("--out", type=Path, help="the report (JSON)")
    args = parser.parse_args()
    from dex_core import load_model

    counts = [int(r) for r in args.rows.split(",")]
    model, _ = load_model("default", device="cpu")
    parts = {"stage": stage_weights(model, args.layers), "head": [model.lm_head.weight.detach()]}
    widths = {w.shape[1] for ws in parts.values() for w in ws}
    inputs = {n: torch.randn(max(counts), n) for n in widths}
    report = {
        "model": "default (SmolLM2-135M-Instruct, float32, CPU)",
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "stage": f"the first {args.layers} decoder layers' nn.Linear weights ({len(parts['stage'])} matrices)",
        "head": "the tied LM head (%d x %d)" % tuple(parts["head"][0].shape),
        "ms_median": {},
    }
    with torch.inference_mode():
        for rows in counts:
            samples = {(p, f): [] for p in parts for f in FORMS}
            for _ in range(args.repeat):
                for part, weights in parts.items():
                    for name, form in FORMS.items():
                        samples[(part, name)].append(timed(form, rows, weights, inputs))
            entry = {f"{p} {f}": round(statistics.median(v), 2) for (p, f), v in samples.items()}
            entry["largest relative difference"] = max(disagreement(rows, w, inputs) for w in parts.values())
            report["ms_median"][str(rows)] = entry
            print(rows, entry, file=sys.stderr, flush=True)
    emit(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
