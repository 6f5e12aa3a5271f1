"""The stage view of a Hugging Face decoder-only model: what explorers take from it, without forking its modeling
code — the embeddings, the decoder layers ``model.model.layers[i]`` (called directly with explicit masks, positions
and a duck-typed cache), the rotary embedding, the final norm and LM head — and which families DEX runs."""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch

from ..config import DexError

SUPPORTED_TYPES = ("llama", "mistral", "qwen2", "qwen3")


class UnsupportedModelError(DexError):
    pass


def check_supported(model) -> None:
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if model_type not in SUPPORTED_TYPES or not hasattr(getattr(model, "model", None), "layers"):
        raise UnsupportedModelError(
            f"{type(model).__name__} (model_type {model_type!r}) is not supported; DEX runs "
            f"decoder-only models of types {', '.join(SUPPORTED_TYPES)}"
        )


def _layer_window(config, i: int) -> int | None:
    types = getattr(config, "layer_types", None)
    window = getattr(config, "sliding_window", None)
    if types:
        return window if types[i] == "sliding_attention" else None
    return window


@dataclass
class ModelView:
    """What explorers take from a model: its parts and the facts needed to drive its layers."""

    model: torch.nn.Module
    num_layers: int
    vocab: int
    kv_heads: int
    head_dim: int
    max_positions: int | None
    windows: list[int | None]  # sliding window per layer (None: full attention)
    cache_kwarg: str  # the name the decoder layers take their cache under

    @property
    def layers(self):
        return self.model.model.layers

    @property
    def dtype(self) -> torch.dtype:
        return self.model.model.norm.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.model.model.norm.weight.device

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.model.model.embed_tokens(tokens)

    def rotary(self, hidden: torch.Tensor, positions: torch.Tensor):
        return self.model.model.rotary_emb(hidden, position_ids=positions)

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        """Final norm + LM head: hidden (..., h) -> logits (..., vocab)."""
        return self.model.lm_head(self.model.model.norm(hidden))


def model_view(model) -> ModelView:
    check_supported(model)
    cfg = model.config
    num_layers = len(model.model.layers)
    params = inspect.signature(model.model.layers[0].forward).parameters
    cache_kwarg = next((n for n in ("cache", "past_key_values", "past_key_value") if n in params), None)
    if cache_kwarg is None:
        raise UnsupportedModelError(f"{type(model).__name__}: its decoder layers take no cache argument")
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    return ModelView(
        model=model,
        num_layers=num_layers,
        vocab=model.lm_head.out_features,
        kv_heads=getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads,
        head_dim=head_dim,
        max_positions=getattr(cfg, "max_position_embeddings", None),
        windows=[_layer_window(cfg, i) for i in range(num_layers)],
        cache_kwarg=cache_kwarg,
    )
