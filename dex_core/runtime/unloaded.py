"""A model this process does not load (``UnloadedModel``): what the parent of explorer processes holds of it —
the checkpoint's folder, its config and tokenizer, the adapters' identity (from 64 rows of the embedding) and the
stage view of its shapes on the meta device — and no weights; each explorer process reads its own part. A run's
settings resolve against it as against a loaded model (``settings``), once, before any explorer starts."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from ..config import DecoderOptions
from ..device import resolve_dtype
from ..log import stderr
from ..model.checkpoint import Checkpoint, locate
from ..model.load import load_tokenizer, resolve_device
from ..model.stage_load import checkpoint_identity, skeleton
from ..model.view import ModelView, model_view
from .settings import RunSettings, resolve_run


def device_type(devices, device: str = "auto") -> str:
    """Where the explorers of a distributed run live: the kind of ``devices`` (one per explorer), else the kind of
    ``device`` ('auto': CUDA when torch sees a GPU; 'cuda' without one is a DexError)."""
    if devices:
        return torch.device(devices[0]).type
    return resolve_device(device).type


@dataclass(frozen=True, eq=False)
class UnloadedModel:
    spec: str  # the model as it was named ('default', a directory, a .gguf file, a hub id)
    folder: Path  # its checkpoint (a named or .gguf model converted once into the cache)
    config: object  # transformers' config of the model
    tokenizer: object
    identity: dict  # the adapters' identity of the model (``adapters.identity_of``)
    view: ModelView  # the stage view of its shapes on the meta device, in the run's dtype
    device_type: str  # where its explorers run: 'cpu' or 'cuda'

    @classmethod
    def read(
        cls, spec: str, dtype="auto", device_type: str = "cpu", tokenizer=None, log=stderr
    ) -> UnloadedModel:
        """Model ``spec``'s config, tokenizer (unless given) and identity, for explorers on devices of
        ``device_type`` (``dtype`` 'auto': float32 on CPU, the checkpoint's half precision on CUDA)."""
        # deferred: transformers takes seconds to import (docs/ARCHITECTURE.md, Imports)
        from transformers import AutoConfig

        folder = locate(spec, log)
        tokenizer = tokenizer or load_tokenizer(folder, spec)
        config = AutoConfig.from_pretrained(folder)
        shape = skeleton(config, resolve_dtype(dtype, device_type, config), folder)  # no weights
        identity = checkpoint_identity(config, Checkpoint(folder))
        return cls(spec, folder, config, tokenizer, identity, model_view(shape), device_type)

    def settings(self, options: DecoderOptions, log=stderr) -> RunSettings:
        """What a run of ``options`` on this model runs (``resolve_run``)."""
        return resolve_run(self.identity, self.view, options, self.device_type, self.tokenizer, log)
