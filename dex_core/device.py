"""The accelerator's two rules in one place: host data goes to the device without a blocking sync, and
time is read from the device, not from the host's clock.

- ``to_device``: a list built on the host (token ids, positions, slot ids, index sets) becomes a
  tensor on the device. On CUDA it is staged in pinned memory and copied with ``non_blocking=True``:
  the copy is queued on the stream before the kernels that read it, and the host runs on (a copy
  from pageable memory would wait for the whole stream first).
- ``Clock``: seconds of named spans. On CUDA a span is a pair of events on the device's current
  stream, read after the device has passed them, so queued kernels are counted in the span that
  queued them (a host clock would see only their launch). Spans that follow one another tile the
  stream's timeline, so they add up to the wall time. On CPU, ``time.perf_counter``.
- ``resolve_prune``: the lattice pruning bound that pays on these devices (``dex_core.lattice``).
- ``resolve_dtype``: the dtype a model runs in ('auto': float32 on CPU, the checkpoint's half precision on CUDA).
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Hashable
from contextlib import contextmanager

import torch

from .config import DTYPES, DexError


def dtype_name(dtype: torch.dtype) -> str:
    """torch.bfloat16 -> 'bfloat16' (the name traces and flags use)."""
    return str(dtype).removeprefix("torch.")


def check_dtype(spec) -> None:
    """DexError unless ``spec`` is 'auto', None (auto), one of ``DTYPES`` or one of those torch dtypes."""
    names = ("auto", *DTYPES)
    if not (spec is None or spec in names or (isinstance(spec, torch.dtype) and dtype_name(spec) in DTYPES)):
        raise DexError(f"dtype must be one of {', '.join(names)}; got {spec!r}")


def checkpoint_dtype(config) -> torch.dtype | None:
    """The dtype a Hugging Face config says its weights were saved in (None where it does not say)."""
    saved = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    if isinstance(saved, str):
        saved = getattr(torch, saved.removeprefix("torch."), None)
    return saved if isinstance(saved, torch.dtype) else None


def resolve_dtype(spec, device_type: str, config=None) -> torch.dtype:
    """The dtype a model runs in for option value ``spec`` on devices of ``device_type``.

    'auto' (or None): float32 on CPU (this CPU's half-precision matmuls are no faster for decoding, and float32
    keeps DEX token-identical to AR); on CUDA the checkpoint's own half precision (``config``), with float32
    checkpoints (and models converted from GGUF, which are saved in float32) taken as bfloat16, or float16 on
    a GPU without bfloat16. Any other value is that dtype."""
    check_dtype(spec)
    if isinstance(spec, torch.dtype):
        return spec
    if spec not in (None, "auto"):
        return getattr(torch, spec)
    if device_type != "cuda":
        return torch.float32
    saved = checkpoint_dtype(config)
    if saved in (torch.bfloat16, torch.float16):
        return saved
    old_gpu = torch.cuda.is_available() and not torch.cuda.is_bf16_supported()
    return torch.float16 if old_gpu else torch.bfloat16


def to_device(values, device, dtype: torch.dtype = torch.long) -> torch.Tensor:
    """``values`` (a list, possibly nested) as a ``dtype`` tensor on ``device``, without a host sync."""
    device = torch.device(device)
    if device.type == "cpu":
        return torch.tensor(values, dtype=dtype, device=device)
    staged = torch.tensor(values, dtype=dtype, device="cpu", pin_memory=True)
    return staged.to(device, non_blocking=True)


class Clock:
    """Seconds of named spans on ``device``: ``with clock.span("decode"): ...``, then ``read()``."""

    def __init__(self, device):
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self._spans: list[tuple[Hashable, object, object]] = []

    def stamp(self):
        """A point in time: a recorded CUDA event on the device's stream, or the host's clock."""
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(self.device))
        return event

    @contextmanager
    def span(self, name: Hashable):
        start = self.stamp()
        try:
            yield
        finally:
            self._spans.append((name, start, self.stamp()))

    def read(self, name: Hashable | None = None) -> dict:
        """Seconds per span name (only ``name`` when given) since the last read of those spans; on CUDA
        this waits until the device has passed the last of them."""
        taken = [s for s in self._spans if name is None or s[0] == name]
        self._spans = [s for s in self._spans if not (name is None or s[0] == name)]
        if self.cuda and taken:
            taken[-1][2].synchronize()
        seconds: dict = defaultdict(float)
        for key, start, stop in taken:
            seconds[key] += start.elapsed_time(stop) / 1000 if self.cuda else stop - start
        return dict(seconds)

    def since(self, start) -> float:
        """Seconds from ``start`` (a ``stamp()``) to now; on CUDA, once the device has caught up."""
        stop = self.stamp()
        if not self.cuda:
            return stop - start
        stop.synchronize()
        return start.elapsed_time(stop) / 1000

    def seconds(self, name: Hashable) -> float:
        """``read(name)`` as one number (0 when the span did not run)."""
        return self.read(name).get(name, 0.0)


def resolve_prune(prune, device_types) -> int | None:
    """The bound a decoder uses for option ``prune``: 'auto' is 1 when every explorer runs on CPU and off
    (None) on accelerators; a number or None is taken as given."""
    if prune != "auto":
        return prune
    return 1 if all(str(t).split(":")[0] == "cpu" for t in device_types) else None
