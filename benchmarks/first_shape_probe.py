"""Why the GPU check warms up before its real-size tables: the first shape a process times runs slow.

    python benchmarks/first_shape_probe.py                      # on a CUDA machine
    python benchmarks/first_shape_probe.py --shapes Llama-2-70B,Qwen3-32B --repeats 20

On the lent H200 (docs/results/gpu-check-h200-first-shape.txt) the first run of the GPU check timed
CodeLlama-34B's decoder layer at 43 ms a row where the same layer, timed again in the same process, took 1.4 ms:
the first shape a process times pays one-off work (kernel selection for the 2,048-token attention, allocator
growth) that a warm-up of ten calls does not absorb. This probe times the shapes in the order given (a shape may
repeat): HF's own forward of the one-layer model, its MLP alone, and the check's row blocks
(``analysis.profile.row_blocks``: the layer over the context, the LM head, the light head) with the GPU's clocks
and power beside each line (``nvidia-smi``), so that a slow first line is seen not to be a clock or power state.
``evaluation.bench.real_size.time_shapes`` therefore times its first shape once unrecorded before any table.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys


def gpu_state() -> str:
    """The GPU's SM and memory clocks, power and performance state, or why they cannot be read."""
    if shutil.which("nvidia-smi") is None:
        return "nvidia-smi not found"
    query = "--query-gpu=clocks.sm,clocks.mem,power.draw,pstate"
    return subprocess.run(
        ["nvidia-smi", query, "--format=csv,noheader"], capture_output=True, text=True
    ).stdout.strip()


def probe(name: str, repeats: int, clock) -> dict:
    """One shape's milliseconds: HF's forward of one row, the MLP alone and the check's row blocks."""
    import torch

    from dex_core.analysis.profile import row_blocks
    from dex_core.evaluation.bench.real_size import SHAPES, one_layer_model
    from dex_core.runtime.clock import decode_order_seconds

    model = one_layer_model(SHAPES[name], "cuda")
    h = torch.randn(1, 1, model.config.hidden_size, device="cuda", dtype=torch.bfloat16)
    blocks = {"hf forward": lambda: model.model(inputs_embeds=h), "mlp": lambda: model.model.layers[0].mlp(h)}
    seconds = decode_order_seconds(blocks, repeats, clock)
    seconds |= decode_order_seconds(row_blocks(model, 1, 8192, context=2048), repeats, clock)
    return {block: round(1000 * s, 3) for block, s in seconds.items()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shapes", default="CodeLlama-34B,Llama-2-70B,CodeLlama-34B,Llama-2-70B")
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args(argv)
    import torch

    from dex_core.runtime.clock import Clock

    if not torch.cuda.is_available():
        print("first_shape_probe: needs a CUDA device (the effect it probes is CUDA's)", file=sys.stderr)
        return 2
    clock = Clock("cuda")
    for name in args.shapes.split(","):
        print(name, "| gpu", gpu_state(), "| ms", probe(name, args.repeats, clock), flush=True)
        torch.cuda.empty_cache()  # the shape's model is gone with probe's frame
    return 0


if __name__ == "__main__":
    sys.exit(main())
