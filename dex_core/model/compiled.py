"""A stage step through ``torch.compile``, in a shape a GPU captures (CUDA graphs), with its compilations bounded.

``CompiledStep`` wraps an explorer's stage step. It is compiled with ``fullgraph=True, dynamic=False``, once per
*bucket* (rows, the mask table's path width and lattice region, the cache's capacity: ``dex_core.shapes``); the
process's compilations are counted, and past ``config.COMPILE_BUDGET`` a step of a new bucket runs eagerly, with
one log line, rather than compile again (dynamo's own limit would make ``fullgraph`` raise mid-request). What a
CUDA graph needs is kept by the explorer and its cache: the step's one mutated input is the cache's buffer,
marked static (``StageCache.mark_static``); the cache's capacity is fixed at a run's start; and the step's output
is copied out of the graph's memory before anything reads it (``Explorer.expand``), so the next replay cannot
overwrite rows the next explorer has yet to read.

``compile_options(spec, device)`` maps the decoder option ``compile`` to ``torch.compile``'s arguments: True is
inductor, with ``mode="reduce-overhead"`` (CUDA graphs) on CUDA; a string names a registered backend
(``"aot_eager"``, what the suite uses) or a function as ``"module:function"`` (importable in an explorer process
too). ``static_check`` is such a backend: it runs the graph eagerly and refuses one that mutates an input not marked
static, the case inductor would run without a CUDA graph (``cudagraph_skips``).
"""

from __future__ import annotations

import importlib
import threading

import torch

from ..config import COMPILE_BUDGET, DexError
from ..log import stderr


class CompiledStep:
    """``step`` (a function of (hidden, table)) through ``torch.compile(**options)``; ``key`` tells a call's bucket.
    Compilations are counted for the process (every explorer's together): past ``COMPILE_BUDGET`` a new bucket runs
    ``step`` eagerly."""

    count = 0  # compilations of this process, every explorer's
    lock = threading.Lock()
    warned = False

    def __init__(self, step, key, options: dict, log=stderr):
        self.eager, self.key, self.log = step, key, log
        self.buckets: set = set()  # the buckets this step compiled
        self.graphs = options.get("mode") == "reduce-overhead"  # CUDA graphs: mark each replay's start
        config = torch._dynamo.config
        config.recompile_limit = max(config.recompile_limit, 2 * COMPILE_BUDGET)  # dynamo's: never first
        config.accumulated_recompile_limit = max(config.accumulated_recompile_limit, 2 * COMPILE_BUDGET)
        self.compiled = torch.compile(step, fullgraph=True, dynamic=False, **options)

    def __call__(self, hidden: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
        bucket = self.key(hidden)
        if bucket not in self.buckets:
            with CompiledStep.lock:
                if CompiledStep.count >= COMPILE_BUDGET:
                    self._eager_once()
                    return self.eager(hidden, table)
                CompiledStep.count += 1
                self.buckets.add(bucket)
        if self.graphs:
            torch.compiler.cudagraph_mark_step_begin()  # the previous replay's outputs were copied out already
        return self.compiled(hidden, table)

    def _eager_once(self) -> None:
        if not CompiledStep.warned:
            CompiledStep.warned = True
            self.log(  # under the lock: one line
                f"the stage steps have compiled {COMPILE_BUDGET} times in this process (config.COMPILE_BUDGET): "
                "a step of a new shape runs without compiling from now on"
            )

    @classmethod
    def compilations(cls) -> int:
        """Compilations made in this process, every explorer's."""
        return cls.count


def compile_options(spec, device) -> dict:
    """``torch.compile``'s keyword arguments for the decoder option ``compile`` (module docstring) on ``device``."""
    if spec is True:
        return {"mode": "reduce-overhead"} if torch.device(device).type == "cuda" else {}
    if not isinstance(spec, str) or not spec.strip():
        raise DexError(f"compile must be on, off or a torch.compile backend's name; got {spec!r:.80}")
    if ":" not in spec:
        return {"backend": spec}
    module, name = spec.split(":", 1)
    try:
        return {"backend": getattr(importlib.import_module(module), name)}
    except (ImportError, AttributeError) as err:
        raise DexError(f"compile backend {spec!r:.80} cannot be imported: {err}") from None


checked: list[tuple[int, int]] = []  # static_check's (mutated inputs, of them not static), one a compilation


def _check(graph, inputs):
    from torch._functorch.aot_autograd import make_boxed_func

    meta = torch._guards.TracingContext.try_get().fw_metadata
    mutated = [i for i, info in enumerate(meta.input_info) if info.mutates_data]
    loose = [i for i in mutated if i not in set(meta.static_input_indices)]
    checked.append((len(mutated), len(loose)))
    if loose:
        raise DexError(
            f"the compiled stage step mutates {len(loose)} input(s) not marked static: a CUDA graph would be "
            "skipped (StageCache.mark_static)"
        )
    return make_boxed_func(graph.forward)


def static_check(graph, inputs):
    """A ``torch.compile`` backend (``compile="dex_core.model.compiled:static_check"``): the graph through
    aot_autograd and run eagerly, each compilation's mutated inputs counted in ``checked``; a DexError when one of
    them is not marked static."""
    from torch._dynamo.backends.common import aot_autograd

    return aot_autograd(fw_compiler=_check)(graph, inputs)
