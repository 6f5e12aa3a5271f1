"""Inducing adapters (paper §3.4, App. C.2): small residual modules at non-final explored depths.

    adapter(h) = h + alpha * W2 act(W1 RMSNorm(h))        (W1: m x h, W2: h x m, alpha init 1e-3)

The adapted hidden state goes through the model's own final norm and LM head to propose a candidate.
Adapters change only which branch survives a commit, never the committed token. A set of adapters is
saved as one safetensors file whose metadata records the model it belongs to (layer count, hidden and
vocabulary size, an embedding fingerprint), the depths, and how it was trained; loading it for
another model is a clear error.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import torch
from torch import nn

from .config import DexError

ASSETS = Path(__file__).resolve().parent.parent / "assets" / "adapters"
DEFAULT_ADAPTERS = ASSETS / "smollm2-135m-instruct.safetensors"


class InducingAdapter(nn.Module):
    def __init__(self, hidden: int, bottleneck: int, activation: str = "silu", eps: float = 1e-5):
        super().__init__()
        from transformers.activations import ACT2FN

        self.norm_weight = nn.Parameter(torch.ones(hidden))
        self.eps = eps
        self.up = nn.Linear(hidden, bottleneck)
        self.down = nn.Linear(bottleneck, hidden)
        self.act = ACT2FN[activation]
        self.activation = activation
        self.alpha = nn.Parameter(torch.tensor(1e-3))

    def forward(self, h: torch.Tensor) -> torch.Tensor:  # (..., hidden) -> (..., hidden)
        x = h.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.norm_weight.float()
        delta = self.down(self.act(self.up(x.to(self.up.weight.dtype))))
        return h + (self.alpha * delta).to(h.dtype)


def model_identity(model) -> dict:
    """What an adapter file must match: shapes and a fingerprint of the embedding matrix."""
    cfg = model.config
    emb = model.model.embed_tokens.weight
    return {"model_type": cfg.model_type, "num_layers": cfg.num_hidden_layers, "hidden_size": cfg.hidden_size,
            "vocab_size": emb.shape[0], "fingerprint": float(emb.detach()[:64, :64].double().abs().sum())}


def new_adapters(model, depths, bottleneck: int | None = None) -> dict[int, InducingAdapter]:
    """Fresh adapters (float32) for the given non-final depths; m = 2h by default."""
    cfg = model.config
    m = bottleneck or 2 * cfg.hidden_size
    act = getattr(cfg, "hidden_act", "silu")
    eps = getattr(cfg, "rms_norm_eps", 1e-5)
    return {int(d): InducingAdapter(cfg.hidden_size, m, act, eps) for d in depths}


def save_adapters(path, adapters: dict[int, InducingAdapter], model, training: dict) -> None:
    """One safetensors file (float16 weights) with the model identity and training facts as metadata."""
    from safetensors.torch import save_file

    tensors = {f"{d}.{k}": v.detach().to(torch.float16).contiguous()
               for d, a in adapters.items() for k, v in a.state_dict().items()}
    first = next(iter(adapters.values()))
    meta = {"format": "dex-adapters", "version": "1", "identity": json.dumps(model_identity(model)),
            "depths": json.dumps(sorted(adapters)), "bottleneck": str(first.up.out_features),
            "activation": first.activation, "eps": str(first.eps), "training": json.dumps(training)}
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path), metadata=meta)


def read_metadata(path) -> dict:
    from safetensors import safe_open

    with safe_open(str(path), "pt") as fh:
        meta = fh.metadata() or {}
    if meta.get("format") != "dex-adapters":
        raise DexError(f"{path} is not a DEX adapter file (no 'format: dex-adapters' metadata)")
    return {"identity": json.loads(meta["identity"]), "depths": json.loads(meta["depths"]),
            "bottleneck": int(meta["bottleneck"]), "activation": meta["activation"], "eps": float(meta["eps"]),
            "training": json.loads(meta["training"])}


def _mismatch(want: dict, have: dict, name: str) -> str | None:
    """Why adapters trained for model identity ``want`` do not fit a model of identity ``have`` (or None)."""
    for key in ("model_type", "num_layers", "hidden_size", "vocab_size"):
        if want[key] != have[key]:
            return (f"adapters in {name} were trained for a {want['model_type']} model with "
                    f"{want['num_layers']} layers, hidden size {want['hidden_size']} and vocabulary "
                    f"{want['vocab_size']}; this model has {have['num_layers']} layers, hidden size "
                    f"{have['hidden_size']}, vocabulary {have['vocab_size']}")
    if abs(want["fingerprint"] - have["fingerprint"]) > 1e-2 * max(1.0, abs(want["fingerprint"])):
        return (f"adapters in {name} were trained for different weights (embedding fingerprint "
                f"{want['fingerprint']:.4f}, this model {have['fingerprint']:.4f})")
    return None


def shipped_adapters_fit(model) -> bool:
    """Whether the shipped adapter file exists and was trained for ``model`` (the default model)."""
    return DEFAULT_ADAPTERS.is_file() and _mismatch(read_metadata(DEFAULT_ADAPTERS)["identity"],
                                                    model_identity(model), DEFAULT_ADAPTERS.name) is None


def resolve_adapters(spec, model, depths=None) -> dict:
    """The one resolver of an adapter choice: 'auto' (the shipped set when it fits ``model``, else none),
    'none', 'default' (the shipped set), a file, or a mapping {depth: module}. Only the non-final
    depths of exploration set ``depths`` are kept; a mapping with others is an error."""
    if isinstance(spec, Mapping):
        adapters = {int(d): a for d, a in spec.items()}
        if depths is not None:
            extra = sorted(set(adapters) - set(depths[:-1]))
            if extra:
                raise DexError(f"adapters given for depths {extra}; only the non-final explored depths "
                               f"{list(depths[:-1])} take adapters")
        return adapters
    spec = "none" if spec is None else str(spec).strip()
    if spec == "none" or (spec == "auto" and not shipped_adapters_fit(model)):
        return {}
    adapters = load_adapters("default" if spec == "auto" else spec, model)
    return {d: a for d, a in adapters.items() if depths is None or d in depths[:-1]}


def load_adapters(path, model) -> dict[int, InducingAdapter]:
    """Adapters from ``path`` ('default' = the shipped set for the default model) for ``model``."""
    from safetensors.torch import load_file

    if str(path) == "default":
        path = DEFAULT_ADAPTERS
    path = Path(path)
    if not path.is_file():
        raise DexError(f"no adapter file at {path}; train one with 'dex train-adapters', or use 'none'")
    meta = read_metadata(path)
    reason = _mismatch(meta["identity"], model_identity(model), path.name)
    if reason:
        raise DexError(reason)
    tensors = load_file(str(path))
    cfg = model.config
    dtype = model.model.norm.weight.dtype
    adapters = {}
    for d in meta["depths"]:
        adapter = InducingAdapter(cfg.hidden_size, meta["bottleneck"], meta["activation"], meta["eps"])
        adapter.load_state_dict({k.split(".", 1)[1]: v.float() for k, v in tensors.items()
                                 if k.split(".", 1)[0] == str(d)})
        adapters[int(d)] = adapter.to(dtype).eval().requires_grad_(False)
    return adapters
