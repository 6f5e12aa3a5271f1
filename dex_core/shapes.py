"""The fixed shapes a round runs at, so that a GPU can capture it (CUDA graphs, ``torch.compile`` without
recompiling): every size a round's tensors take is a *bucket*, a power of two at least the size it holds.

A stage's batch of n lattice nodes runs as ``bucket(n)`` rows (the rest padding: rows that see only the committed
prefix, whose outputs nothing reads); the lattice region a tree mask covers and the path width of its table are
buckets that only grow, and the KV cache's capacity (``capacity``: finer steps, as attention reads all of it) is set
for a run's prompt and new tokens, so after the first rounds of a run no size changes. With a row budget B a stage
runs at most B rows, so its batches take the buckets 1, 2, 4, ..., ``bucket(B)``. ``OpShapes`` records the (op,
shapes) pairs a run's rounds take: what tests and the GPU check hold to the buckets.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterable, Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


def bucket(n: int, least: int = 1) -> int:
    """The least power of two that is at least ``n`` and ``least``."""
    n = max(n, least, 1)
    return 1 << (n - 1).bit_length()


CAPACITY_STEP, CAPACITY_STEPS = 256, 32  # a cache's capacity: steps of at least 256, and of n / 16 at most


def capacity(n: int) -> int:
    """A KV cache's capacity for ``n`` entries: the least multiple of ``max(CAPACITY_STEP, bucket(n) //
    CAPACITY_STEPS)`` that is at least ``n`` (16 sizes an octave). Attention reads every entry of the capacity, so
    it stays within 1/16 (or 256 entries) of what the run needs, where a power of two could double it; a run sets
    it once from its prompt and new tokens, so it takes one size for the run (a compiled step compiles once)."""
    step = max(CAPACITY_STEP, bucket(n) // CAPACITY_STEPS)
    return -(-max(n, 1) // step) * step


def padded(values: list, size: int, fill) -> list:
    """``values`` followed by ``fill`` up to ``size`` items."""
    return values + [fill] * (size - len(values))


class OpShapes(TorchDispatchMode):
    """While active, every (op, shapes of its tensor arguments) the dispatcher runs, in ``seen``: what a capture
    (a CUDA graph, a compiled step) must find the same every round. Tests and ``benchmarks/gpu_check.py`` use it."""

    def __init__(self):
        super().__init__()
        self.seen: set[tuple[str, tuple]] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        leaves = tree_leaves((args, kwargs))
        self.seen.add((str(func), tuple(tuple(t.shape) for t in leaves if isinstance(t, torch.Tensor))))
        return func(*args, **kwargs)


def after_first_round(events: Iterable, shapes: OpShapes) -> Iterator:
    """Each item of ``events`` (a DEX stream: start, one event a round, end), ``shapes`` recording while the rounds
    after the first are made (the prefill, whose shapes follow the prompt's length, runs before the first: the
    stream's first two items are the start and the first round)."""
    events = iter(events)
    for made in itertools.count():
        with shapes if made >= 2 else contextlib.nullcontext():
            event = next(events, None)
        if event is None:
            return
        yield event
