"""Devices and dtypes, the rules every layer follows (time is read by ``runtime.clock``):

- ``to_device``: a list built on the host (token ids, positions, slot ids, index sets) becomes a
  tensor on the device. On CUDA it is staged in pinned memory and copied with ``non_blocking=True``:
  the copy is queued on the stream before the kernels that read it, and the host runs on (a copy
  from pageable memory would wait for the whole stream first).
- ``resolve_dtype``: the dtype a model runs in ('auto': float32 on CPU, the checkpoint's half precision on CUDA).
"""

from __future__ import annotations

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
