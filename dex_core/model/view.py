"""The stage view of a Hugging Face decoder-only model: what explorers take from it, without forking its modeling
code — the embeddings, the decoder layers ``model.model.layers[i]`` (called directly with explicit masks, positions
and a duck-typed cache), the rotary embedding, the final norm and LM head — and which families DEX runs.

What a family does outside its decoder layers lives here, in ``embed`` and ``finish`` (every path that reads
logits at a depth goes through them: proposals, the final stage, light heads, the lens, training, the cost
model's view of the head), so candidates, margins and tie gaps are the model's own:

- Granite multiplies the embeddings by ``embedding_multiplier`` and divides the logits by ``logits_scaling``;
- Gemma 2 and 3 soft-cap the final logits, ``tanh(x / c) · c`` with ``c = final_logit_softcapping`` (their
  embedding scale, √hidden, is inside their embedding module); Gemma 3 keeps a rotary embedding per layer
  type (sliding or full attention), so ``rotary`` returns one per type and each layer takes its own.

Everything else a family does (fused QKV and partial rotary in Phi-3, OLMo 2's norm placement, attention
soft-capping, residual and attention multipliers, mixture-of-experts routing) happens inside its layers,
which DEX calls as they are. A model on SDPA is switched to ``dex_sdpa`` (``model.attention``: the same attention for
every other caller; for the explorers' tree batches, grouped by KV head instead of ``repeat_kv``)."""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field

import torch

from ..config import DexError
from ..device import dtype_name
from ..families import REFUSED, SUPPORTED_TYPES
from .adapters import SHAPE_KEYS, model_identity
from .attention import TREE_KWARG, use_tree_attention


class UnsupportedModelError(DexError):
    pass


def check_supported(model) -> None:
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if model_type not in SUPPORTED_TYPES or not hasattr(getattr(model, "model", None), "layers"):
        why = REFUSED.get(model_type, "DEX drives only the decoder stacks of the families it tests")
        raise UnsupportedModelError(
            f"{type(model).__name__} (model_type {model_type!r}) is not supported: {why}; DEX runs "
            f"decoder-only models of types {', '.join(SUPPORTED_TYPES)}"
        )


def _layer_window(config, i: int) -> int | None:
    types = getattr(config, "layer_types", None)
    window = getattr(config, "sliding_window", None)
    if types:
        return window if types[i] == "sliding_attention" else None
    return window


def _rope_type(model, i: int) -> str | None:
    """The layer type whose rotary embedding layer ``i`` takes (Gemma 3), or None (one rotary for all)."""
    per_type = "layer_type" in inspect.signature(model.model.rotary_emb.forward).parameters
    return model.config.layer_types[i] if per_type else None


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
    rope_types: list[str | None]  # per layer, its rotary embedding's layer type (None: one for all layers)
    embed_multiplier: float | None = None  # Granite's embedding_multiplier
    logits_divisor: float | None = None  # Granite's logits_scaling
    softcap: float | None = None  # Gemma's final_logit_softcapping
    layer_kwargs: dict = field(
        default_factory=dict
    )  # what explorers pass their layers besides (attention.TREE_KWARG)

    @property
    def layers(self):
        return self.model.model.layers

    @property
    def dtype(self) -> torch.dtype:
        return self.model.model.norm.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.model.model.norm.weight.device

    @property
    def dtype_name(self) -> str:
        """The dtype's name as traces and flags spell it (``device.dtype_name``)."""
        return dtype_name(self.dtype)

    def identity(self) -> dict:
        """The model's identity for a trace's start event: its shapes, and its embedding fingerprint where the
        embeddings are loaded here whole (not on the meta device, not a tensor-parallel ``DTensor`` whose rows are
        spread over ranks)."""
        rows, c = self.model.get_input_embeddings().weight, self.model.config
        shard = hasattr(rows, "placements")  # a tensor-parallel rank's DTensor
        if rows.is_meta or shard:  # shapes only
            return dict(zip(SHAPE_KEYS, (c.model_type, c.num_hidden_layers, c.hidden_size, rows.shape[0])))
        return model_identity(self.model)

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.model.model.embed_tokens(tokens)
        return h if self.embed_multiplier is None else h * self.embed_multiplier

    def rotary(self, hidden: torch.Tensor, positions: torch.Tensor, types) -> dict:
        """{layer type: (cos, sin)} for the layer types in ``types`` (None: the model's single rotary)."""
        rotary = self.model.model.rotary_emb
        return {
            kind: rotary(hidden, positions) if kind is None else rotary(hidden, positions, kind)
            for kind in types
        }

    def finish(self, logits: torch.Tensor) -> torch.Tensor:
        """What the family's causal-LM head does after its matrix: scaling, then soft-capping."""
        if self.logits_divisor is not None:
            logits = logits / self.logits_divisor
        if self.softcap is not None:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        """Final norm + LM head: hidden (..., h) -> logits (..., vocab)."""
        return self.finish(self.model.lm_head(self.model.model.norm(hidden)))


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
        rope_types=[_rope_type(model, i) for i in range(num_layers)],
        embed_multiplier=getattr(cfg, "embedding_multiplier", None),
        logits_divisor=getattr(cfg, "logits_scaling", None),
        softcap=getattr(cfg, "final_logit_softcapping", None),
        layer_kwargs={TREE_KWARG: True} if use_tree_attention(model) else {},
    )
