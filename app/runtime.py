"""The app's server-side state: one shared, read-only model per process, loaded on first use.

Sessions keep only plain trace records (in ``gr.State``); the model, its tokenizer and distributed
explorer groups live here. Model work is serialized by the app's event concurrency settings.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field

from dex_core import DexConfig, DexDecoder, DexError, load_model
from dex_core.cli import encode_prompt


@dataclass
class AppSettings:
    """Server settings: command-line flags, else DEX_MODEL / DEX_EXPLORERS / DEX_BACKEND, else defaults."""

    model: str = field(default_factory=lambda: os.environ.get("DEX_MODEL", DexConfig.model))
    explorers: int = field(default_factory=lambda: int(os.environ.get("DEX_EXPLORERS", DexConfig.explorers)))
    backend: str = field(default_factory=lambda: os.environ.get("DEX_BACKEND", DexConfig.backend))
    dtype: str = DexConfig.dtype


class Runtime:
    def __init__(self, settings: AppSettings | None = None):
        self.settings = settings or AppSettings()
        DexConfig(model=self.settings.model, explorers=self.settings.explorers, backend=self.settings.backend)
        self._lock = threading.Lock()
        self._model = self._tokenizer = None
        self._groups: dict[tuple, DexDecoder] = {}

    @property
    def loaded(self) -> bool:
        return self._model is not None

    def model(self):
        """(model, tokenizer), loading them on first use (the default model is fetched and cached once)."""
        with self._lock:
            if self._model is None:
                self._model, self._tokenizer = load_model(self.settings.model, dtype=self.settings.dtype)
            return self._model, self._tokenizer

    @property
    def num_layers(self) -> int | None:
        return None if self._model is None else self._model.config.num_hidden_layers

    def encode(self, prompt: str, chat: bool) -> list[int]:
        _, tokenizer = self.model()
        return encode_prompt(tokenizer, prompt, chat)

    def device_notice(self, count: int) -> str | None:
        """Why a distributed run uses CPU explorers on a machine with too few GPUs (None when it does not)."""
        import torch

        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if self.settings.backend == "distributed" and 0 < gpus < count:
            return (f"{count} explorers need {count} GPUs (one per explorer) but {gpus} are visible: "
                    f"the explorers run on CPU. Choose K ≤ {gpus} to use the GPUs.")
        return None

    @property
    def shipped_adapters(self) -> bool:
        """Whether the default adapters apply: the default model and the shipped file."""
        from dex_core.adapters import DEFAULT_ADAPTERS

        return self.settings.model == "default" and DEFAULT_ADAPTERS.is_file()

    def decoder(self, depths, explorers: int | None, decs: bool, adapters: bool = False) -> DexDecoder:
        """A decoder for this exploration set; distributed groups are kept and reused across requests."""
        model, tokenizer = self.model()
        backend = self.settings.backend
        chosen = "default" if adapters and self.shipped_adapters else None
        if backend == "sequential":
            return DexDecoder(model, depths=depths, explorers=explorers, decs=decs, adapters=chosen,
                              tokenizer=tokenizer)
        key = (tuple(depths) if depths else None, explorers, decs, chosen)
        with self._lock:
            if key not in self._groups:
                self._groups[key] = DexDecoder(model, depths=depths, explorers=explorers, decs=decs,
                                               adapters=chosen, tokenizer=tokenizer, backend=backend)
            return self._groups[key]

    def close(self) -> None:
        for decoder in self._groups.values():
            decoder.close()
        self._groups.clear()


def options(explorers, depths_text: str, decs: bool, sample: bool, temperature, top_k, top_p, seed,
            max_new_tokens) -> DexConfig:
    """UI control values -> a validated DexConfig (DexError on bad input)."""
    return DexConfig(
        depths=depths_text.strip() or None if isinstance(depths_text, str) else None,
        explorers=int(explorers), decs=bool(decs), max_new_tokens=int(max_new_tokens),
        temperature=float(temperature) if sample else 0.0,
        top_k=int(top_k) if sample and top_k else None,
        top_p=float(top_p) if sample and top_p and float(top_p) < 1.0 else None,
        seed=int(seed))


__all__ = ["AppSettings", "DexError", "Runtime", "options"]
