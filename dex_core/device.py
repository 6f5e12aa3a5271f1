"""Devices and dtypes, the rules every layer follows (time is read by ``runtime.clock``):

- ``to_device``: a list built on the host (token ids, positions, slot ids, index sets) becomes a
  tensor on the device. On CUDA it is staged in pinned memory and copied with ``non_blocking=True``:
  the copy is queued on the stream before the kernels that read it, and the host runs on (a copy
  from pageable memory would wait for the whole stream first).
- ``resolve_dtype``: the dtype a model runs in ('auto': float32 on CPU, the checkpoint's half precision on CUDA).
- ``exact_float32_matmuls`` / ``check_float32_matmuls``: float32 matmuls stay float32. TF32 (or oneDNN's bf16)
  for float32 matmuls is a process-global switch (``torch.set_float32_matmul_precision("high")`` also turns it on
  for oneDNN on the CPU); under it DEX would no longer equal AR in float32 and nothing would say so. Every DEX
  process sets full precision once at start, and a float32 run refuses if a caller has changed it since (the
  flags are global, so toggling them per call would race between the app's concurrent sessions).
"""

from __future__ import annotations

import array
import ctypes
import ctypes.util

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
    """``values`` (a list, possibly nested) as a ``dtype`` tensor on ``device``, without a host sync. A flat list of
    ints becomes a tensor through a C array (``torch.frombuffer``: a few times faster than ``torch.tensor`` on a
    list, which reads it item by item; DEX moves a few of these every round)."""
    device = torch.device(device)
    if dtype == torch.long and values and type(values) is list and type(values[0]) is int:
        # the tensor keeps the array alive
        host = torch.frombuffer(array.array("q", values), dtype=torch.long)
        return host if device.type == "cpu" else host.pin_memory().to(device, non_blocking=True)
    if device.type == "cpu":
        return torch.tensor(values, dtype=dtype, device=device)
    staged = torch.tensor(values, dtype=dtype, device="cpu", pin_memory=True)
    return staged.to(device, non_blocking=True)


def exact_float32_matmuls() -> None:
    """Full float32 precision for float32 matmuls on every backend: called once where a DEX process starts (the
    dex command, the app, an explorer rank, dex serve, the benchmark scripts)."""
    torch.set_float32_matmul_precision("highest")


MMAP_THRESHOLD = 2**20  # bytes: host allocations at least this large are mapped, and unmapped when freed


def return_freed_memory() -> bool:
    """Fix glibc's mmap threshold at ``MMAP_THRESHOLD`` (Linux; False where there is no glibc ``mallopt``). glibc
    raises the threshold each time a mapped block is freed, after which blocks of that size come from the heap and
    stay with the process when freed: a process that allocates a micro-batch's activations again and again then
    holds 10-20% more than it uses (measured: ``benchmarks/train_ranks.py``). Fixed, freed activations go back."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return bool(libc.mallopt(-3, MMAP_THRESHOLD))  # M_MMAP_THRESHOLD
    except (OSError, AttributeError):
        return False


def float32_matmul_shortcuts(device_type: str | None = None) -> list[str]:
    """The backends (of ``device_type``'s matmuls: cuda, or mkldnn on the CPU; None: both) whose float32
    matmuls currently run in a lower precision ('tf32', 'bf16'), as ``backend=precision``; empty when exact.
    Reads torch's per-backend settings (the legacy ``allow_tf32`` flags set them too), each inheriting from its
    parent where it says 'none'."""
    backends = torch.backends
    found = []
    names = {"cuda": ("cuda",), "cpu": ("mkldnn",)}.get(device_type, ("cuda", "mkldnn"))
    for name in names:
        chain = [getattr(backends, name).matmul, getattr(backends, name), backends]
        levels = [getattr(level, "fp32_precision", "none") for level in chain]
        precision = next((v for v in levels if v != "none"), "ieee")
        if precision != "ieee":
            found.append(f"{name}={precision}")
    return found


def check_float32_matmuls(dtype: torch.dtype, device) -> None:
    """DexError for a float32 run on ``device`` while its float32 matmuls run in a lower precision (see the
    module's docstring)."""
    shortcuts = float32_matmul_shortcuts(torch.device(device).type) if dtype == torch.float32 else []
    if shortcuts:
        raise DexError(
            "float32 matmuls are set to a lower precision in this process "
            f"({', '.join(shortcuts)}: torch.set_float32_matmul_precision or allow_tf32 was changed), so a float32 "
            "run would not be token-identical to AR; call torch.set_float32_matmul_precision('highest') "
            "or run in bfloat16/float16, which DEX certifies per token"
        )
