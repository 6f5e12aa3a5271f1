"""Loading a whole causal LM in one process (the default, a directory, a .gguf file, a hub id), its tokenizer,
and the device option's meaning (``resolve_device``)."""

from __future__ import annotations

from pathlib import Path

import torch

from ..config import DexError, parse_device
from ..device import check_dtype, dtype_name, resolve_dtype
from ..log import stderr
from .checkpoint import check_hub, is_hub_id, locate, missing_locally
from .named import named_model
from .view import check_supported


def resolve_device(spec: str | torch.device = "auto") -> torch.device:
    """The device that option value ``spec`` names: 'auto' is CUDA (torch's current device) when torch sees a
    GPU, else the CPU; 'cuda' / 'cuda:N' must exist (DexError saying what to use instead); 'cpu' is the CPU."""
    name = parse_device(str(spec) if isinstance(spec, torch.device) else spec)
    if name == "cpu" or (name == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise DexError(
            f"--device {name}: no CUDA device is visible to torch (torch.cuda.is_available() is "
            f"False); use --device cpu or auto"
        )
    count = torch.cuda.device_count()
    index = torch.cuda.current_device() if ":" not in name else int(name.split(":")[1])
    if index >= count:
        raise DexError(
            f"--device {name}: torch sees {count} CUDA device(s), cuda:0..cuda:{count - 1}; use one "
            f"of them, or --device cpu"
        )
    return torch.device("cuda", index)


def load_model(
    spec: str = "default",
    dtype: str | torch.dtype | None = "auto",
    device: str | torch.device = "auto",
    log=stderr,
    local_files_only: bool = False,
):
    """Return ``(model, tokenizer)`` for a named model, a local directory, a .gguf file or a hub id, the whole model
    in one process, in ``dtype`` (``resolve_dtype``: 'auto' is float32 on CPU, the checkpoint's half precision on
    CUDA) on ``device`` (``resolve_device``: 'auto' is CUDA when available). ``log`` gets one line per stage
    that takes a while (fetching, converting, loading weights); stderr by default. The default model and
    .gguf files are converted once into the DEX cache (``checkpoint.locate``) and read from there.
    ``local_files_only``: download nothing and ask the hub nothing (Hugging Face's own switch); a model that is
    not present locally is a DexError."""

    # deferred: transformers takes seconds to import (docs/ARCHITECTURE.md, Imports)
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    device = resolve_device(device)  # before any work: a missing GPU is a bad option, not a late crash
    check_dtype(dtype)
    if local_files_only and (missing := missing_locally(spec)):
        raise DexError(
            f"model {spec!r} is not present locally, and local_files_only forbids a download: {missing}"
        )
    hub = {"local_files_only": True} if local_files_only else {}
    if is_hub_id(spec):
        source = spec  # from_pretrained fetches it (any weight format) into the HF cache
        if not local_files_only:
            check_hub(spec)
    else:
        source = locate(spec, log)
    try:
        config = AutoConfig.from_pretrained(source, **hub)
        dtype = resolve_dtype(dtype, device.type, config)
        log(f"loading {spec} ({dtype_name(dtype)}, {device})")
        tokenizer = AutoTokenizer.from_pretrained(source, **hub)
        model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, **hub)
    except Exception as err:  # model files are untrusted input: any failure to parse them is a bad model
        reason = str(err).strip().splitlines()[0][:200] if str(err).strip() else type(err).__name__
        where = (
            "its files are missing, corrupt or inconsistent"
            if isinstance(source, Path)  # local files
            else "not all of its files are in the local Hugging Face cache, and downloads are off"
            if local_files_only
            else "not a local model and the Hugging Face hub could not provide it"
        )
        again = f"; delete {source} to convert it again" if named_model(spec) else ""
        raise DexError(f"could not load model {spec!r}: {where} ({reason}){again}") from None
    check_supported(model)
    return model.eval().to(device), tokenizer


def load_tokenizer(folder, spec: str | None = None):
    """The tokenizer of the model in ``folder`` (``spec`` names the model in errors) and nothing else of it."""

    # deferred: transformers takes seconds to import (docs/ARCHITECTURE.md, Imports)
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(folder)
    except Exception as err:  # model files are untrusted input
        reason = str(err).strip().splitlines()[0][:200] if str(err).strip() else type(err).__name__
        raise DexError(
            f"could not load the tokenizer of model {spec or str(folder)!r}: its files are missing, "
            f"corrupt or inconsistent ({reason})"
        ) from None
