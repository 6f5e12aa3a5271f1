"""Where explorer processes run: one device per explorer (``resolve_devices``), and the torch threads each takes
on a CPU (``default_threads``)."""

from __future__ import annotations

import os
import warnings

import torch

from ..config import DexError


def resolve_devices(devices, count: int) -> list[str]:
    """One device per explorer of the distributed schedule.

    - ``None``: ``cuda:0..K-1`` when at least K GPUs are visible; with fewer, the explorers take the visible
      GPUs in turn (``cuda:k % G``); with none, every explorer on CPU.
    - a list: one device per explorer, all ``cpu`` or all ``cuda:N`` of visible GPUs.

    Explorers may share a GPU (shared mode, with a ``UserWarning``): NCCL refuses two ranks on one GPU, so the
    ranks then move hidden rows over gloo, staged through the host (``rank.data_backend`` decides it on every
    rank). The distributed schedule then runs for real on one GPU, but the explorers take turns on it.
    """
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if devices is None:
        devices = [f"cuda:{k % gpus}" for k in range(count)] if gpus else ["cpu"] * count
    devices = [str(d) for d in devices]
    if len(devices) != count:
        raise DexError(f"devices lists {len(devices)} devices for {count} explorers; give one per explorer")
    try:
        kinds = {torch.device(d).type for d in devices}
    except RuntimeError:
        raise DexError(f"devices must be cpu or cuda:N; got {devices}") from None
    if not kinds <= {"cpu", "cuda"} or len(kinds) > 1:
        raise DexError(f"devices must be all cpu or all cuda:N; got {devices}")
    for d in devices:
        index = torch.device(d).index
        if torch.device(d).type == "cuda" and (index is None or index >= gpus):
            raise DexError(
                f"{d} is not available: {gpus} GPU(s) visible for {count} explorers; give visible "
                f"GPUs (explorers may share one, e.g. cuda:0,cuda:0) or devices=cpu"
            )
    devices = [str(torch.device(d)) for d in devices]
    shared = sorted({d for d in devices if devices.count(d) > 1}) if kinds == {"cuda"} else []
    if shared:  # attributed to this line, so the decoder's and the group's calls warn once
        warnings.warn(
            f"explorers share {', '.join(shared)} ({', '.join(devices)}): hidden rows are staged through "
            "the host over gloo (NCCL refuses two ranks on one GPU), and explorers on one GPU take turns",
            stacklevel=1,
        )
    return devices


def default_threads(count: int) -> int:
    """Torch threads per explorer process when ``count`` of them share this machine's cores."""
    return max(1, (os.cpu_count() or 1) // max(1, count))
