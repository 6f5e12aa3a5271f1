"""The stage step of a real-size layer timed alone — eager, compiled and captured — and its host work timed apart.

``Explorer.step(hidden, table)`` is what a round runs on the device for one stage: the tree masks built from the
batch's table, the stage's layers, its cache written (``dex_core.model.explorer``). ``stages`` makes, for each mode, an
explorer over layer 0 of a one-layer model (``real_size.one_layer_model``) with a ``context``-token committed prefix.
A batch of n rows is n fresh lattice nodes after it (slots 0..n-1, each its own path, all at position ``context``: the
siblings of one round); its table is made on the host and sent to the device once, then:

- ``step_blocks``: ``step(hidden, table)`` alone, the table already on the device, for ``decode_order_seconds`` (CUDA
  events on a GPU). A step writes the same n cache entries every call (nothing extends the cache), so every repeat
  runs the same work;
- ``host_seconds``: making that table on the host (``Explorer.table``) and sending it (``device.to_device``: pinned
  memory, no wait), on the host's clock — what a round does on the host before it calls the step.

Modes (``step_modes``): ``eager``; ``compiled`` and ``captured`` through ``Explorer.compile_step(**options)``. On
CUDA ``compiled`` is inductor's ``mode="default"`` and ``captured`` ``mode="reduce-overhead"`` (CUDA graphs: what
``compile=True`` runs on a GPU); on a CPU ``compiled`` runs through ``backend="aot_eager"`` (dynamo's graph, no code
generation: inductor on a CPU takes a C++ toolchain and far longer) and ``captured`` does not run (no CUDA graphs).
A compiled step is called ``WARM_CALLS`` times before it is timed: the compilation, a CUDA graph's warm-up run and
its recording. ``SKIPS`` counts the CUDA graphs inductor declined (a captured step that is then only compiled).
"""

from __future__ import annotations

import statistics
import time

import torch

from ...device import to_device
from ...model.explorer import Explorer
from ...model.view import model_view

WARM_CALLS = 3


def step_modes(device) -> dict:
    """{mode: ``compile_step`` options} of the compiled modes that run on ``device`` (module docstring)."""
    if torch.device(device).type == "cuda":
        return {"compiled": {"mode": "default"}, "captured": {"mode": "reduce-overhead"}}
    return {"compiled": {"backend": "aot_eager"}}


def skips() -> int:
    """CUDA graphs inductor has declined in this process so far (torch._dynamo's counters)."""
    return torch._dynamo.utils.counters["inductor"]["cudagraph_skips"]


@torch.inference_mode()
def stages(model, context: int, rows: int, modes: dict) -> dict:
    """{mode: Explorer} over layer 0 of ``model``, each after a ``context``-token prefix with room for ``rows`` more
    entries: ``eager``, and each of ``modes`` ({mode: compile options}) compiled."""
    view, out = model_view(model), {}
    hidden = model.config.hidden_size
    prefix = torch.randn(context, hidden, dtype=view.dtype, device=view.device)  # (context, hidden)
    for mode in ("eager", *modes):
        e = Explorer(view, 0, 2, 0, 1)
        e.reset(context + rows)
        e.prefill(prefix)
        if mode != "eager":
            e.compile_step(**modes[mode])
        out[mode] = e
    return out


def host_table(explorer: Explorer, n: int, context: int) -> list[int]:
    """The host table of n fresh sibling nodes at position ``context`` (module docstring)."""
    return explorer.table(n, list(range(n)), [context] * n, [(i,) for i in range(n)])


@torch.inference_mode()
def step_blocks(explorers: dict, hidden: torch.Tensor, context: int) -> dict:
    """{mode: fn} that runs each explorer's stage step on the rows ``hidden`` (n, h), its table on the device
    already; a compiled step called ``WARM_CALLS`` times first (under inference mode, as ``decode_order_seconds``
    runs it)."""
    blocks, n = {}, hidden.shape[0]
    for mode, e in explorers.items():
        table = to_device(host_table(e, n, context), e.view.device)  # (table size,)
        blocks[mode] = lambda e=e, t=table: e.step(hidden, t)
        for _ in range(WARM_CALLS if mode != "eager" else 0):
            blocks[mode]()
    return blocks


def host_seconds(explorer: Explorer, n: int, context: int, repeats: int) -> float:
    """Median seconds of making a batch's table on the host and sending it to the device (module docstring)."""
    times = []
    for _ in range(max(1, repeats)):
        tic = time.perf_counter()
        to_device(host_table(explorer, n, context), explorer.view.device)
        times.append(time.perf_counter() - tic)
    return statistics.median(times)
