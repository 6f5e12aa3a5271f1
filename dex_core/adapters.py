"""Inducing adapters (paper §3.4, App. C.2): small residual modules at non-final explored depths.

    adapter(h) = h + alpha * W2 act(W1 RMSNorm(h))        (W1: m x h, W2: h x m, alpha init 1e-3)

The adapted hidden state goes through the model's own final norm and LM head to propose a candidate.
Adapters change only which branch survives a commit, never the committed token. A set of adapters is
saved as one safetensors file whose metadata records the model it belongs to (layer count, hidden and
vocabulary size, an embedding fingerprint), the depths, and how it was trained; loading it for
another model is a clear error. So is a file that is not a complete DEX adapter file (corrupt, truncated,
another program's safetensors, tensors missing or of the wrong shape): every check reads only the
file's header, before any tensor is loaded or any module built.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path

import torch
from torch import nn

from .config import DEPTH_CHOICES, DexError, adapter_file, resolve_depths

ASSETS = Path(__file__).resolve().parent.parent / "assets" / "adapters"
DEFAULT_ADAPTERS = ASSETS / "smollm2-135m-instruct.safetensors"
RANKING = "shortlist"  # the tensor holding the token ranking of the light proposal heads


class InducingAdapter(nn.Module):
    def __init__(self, hidden: int, bottleneck: int, activation: str = "silu", eps: float = 1e-5, *,
                 device=None, dtype=None):
        super().__init__()
        from transformers.activations import ACT2FN

        # built where it will run (every caller passes the model's device; None is torch's default, the CPU)
        self.norm_weight = nn.Parameter(torch.ones(hidden, device=device, dtype=dtype))
        self.eps = eps
        self.up = nn.Linear(hidden, bottleneck, device=device, dtype=dtype)
        self.down = nn.Linear(bottleneck, hidden, device=device, dtype=dtype)
        self.act = ACT2FN[activation]
        self.activation = activation
        self.alpha = nn.Parameter(torch.tensor(1e-3, device=device, dtype=dtype))

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
    """Fresh adapters for the given non-final depths, on the model's device in float32 (what training
    updates, whatever the model's dtype); m = 2h by default."""
    cfg = model.config
    m = bottleneck or 2 * cfg.hidden_size
    act = getattr(cfg, "hidden_act", "silu")
    eps = getattr(cfg, "rms_norm_eps", 1e-5)
    device = model.model.norm.weight.device
    return {int(d): InducingAdapter(cfg.hidden_size, m, act, eps, device=device, dtype=torch.float32) for d in depths}


def save_adapters(path, adapters: dict[int, InducingAdapter], model, training: dict, ranking=None) -> None:
    """One safetensors file (float16 weights) with the model identity and training facts as metadata, and
    the token ranking of light proposal heads (``dex_core.proposal``) as tensor 'shortlist'."""
    from safetensors.torch import save_file

    tensors = {f"{d}.{k}": v.detach().to(torch.float16).contiguous()
               for d, a in adapters.items() for k, v in a.state_dict().items()}
    if ranking is not None:
        tensors[RANKING] = torch.as_tensor(ranking, device="cpu").to(torch.int32).contiguous()
    first = next(iter(adapters.values()))
    meta = {"format": "dex-adapters", "version": "1", "identity": json.dumps(model_identity(model)),
            "depths": json.dumps(sorted(adapters)), "bottleneck": str(first.up.out_features),
            "activation": first.activation, "eps": str(first.eps), "training": json.dumps(training)}
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path), metadata=meta)


def adapter_shapes(hidden: int, bottleneck: int) -> dict[str, tuple[int, ...]]:
    """The tensors of one adapter and their shapes, as ``save_adapters`` writes them under '{depth}.'."""
    return {"norm_weight": (hidden,), "up.weight": (bottleneck, hidden), "up.bias": (bottleneck,),
            "down.weight": (hidden, bottleneck), "down.bias": (hidden,), "alpha": ()}


def _header(path) -> tuple[dict, dict[str, tuple[int, ...]]]:
    """(metadata, {tensor name: shape}) of a safetensors file, from its header alone."""
    from safetensors import SafetensorError, safe_open

    path = adapter_file(path)
    try:
        with safe_open(str(path), "pt") as fh:
            return fh.metadata() or {}, {k: tuple(fh.get_slice(k).get_shape()) for k in fh.keys()}
    except (SafetensorError, OSError) as err:
        raise DexError(f"{path} is not a readable safetensors file ({err}); it may be truncated or corrupt: "
                       f"save it again with 'dex train-adapters', or use 'none'") from None


def _typed(value, kind, what: str = "the value"):
    if not isinstance(value, kind) or isinstance(value, bool):
        raise ValueError(f"{what} is {type(value).__name__}, not {getattr(kind, '__name__', 'a number')}")
    return value


def _identity(text: str) -> dict:
    identity = _typed(json.loads(text), dict)
    for key, kind in (("model_type", str), ("num_layers", int), ("hidden_size", int), ("vocab_size", int),
                      ("fingerprint", (int, float))):
        _typed(identity.get(key), kind, repr(key))
    if not math.isfinite(identity["fingerprint"]):
        raise ValueError("the fingerprint is not finite")
    return identity


def _depths(text: str) -> list[int]:
    depths = [_typed(d, int, "a depth") for d in _typed(json.loads(text), list)]
    if not depths or depths[0] < 1 or any(b <= a for a, b in zip(depths, depths[1:])):
        raise ValueError(f"expected increasing positive layer counts, got {depths}")
    return depths


def _positive(kind):
    def parse(text: str):
        value = kind(text)
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"expected a positive number, got {text!r}")
        return value
    return parse


def _activation(name: str) -> str:
    from transformers.activations import ACT2FN

    if name not in ACT2FN:
        raise ValueError(f"unknown activation {name!r}")
    return name


METADATA = {"identity": _identity, "depths": _depths, "bottleneck": _positive(int), "activation": _activation,
            "eps": _positive(float), "training": lambda text: _typed(json.loads(text), dict)}


def read_metadata(path) -> dict:
    """The checked DEX metadata of an adapter file; DexError says what is wrong with the file."""
    meta, _ = _header(path)
    if meta.get("format") != "dex-adapters":
        raise DexError(f"{path} is not a DEX adapter file (no 'format: dex-adapters' metadata)")
    out = {}
    for key, parse in METADATA.items():
        if key not in meta:
            raise DexError(f"{path} is not a complete DEX adapter file: its metadata lacks {key!r}; "
                           f"save it again with 'dex train-adapters'")
        try:
            out[key] = parse(meta[key])
        except (TypeError, ValueError, OverflowError) as err:  # json.JSONDecodeError is a ValueError
            raise DexError(f"{path} has invalid DEX adapter metadata {key!r} ({str(err)[:120]}); "
                           f"save it again with 'dex train-adapters'") from None
    if out["depths"][-1] >= out["identity"]["num_layers"]:
        raise DexError(f"{path} has adapters at depths {out['depths']}, but its model has only "
                       f"{out['identity']['num_layers']} layers (adapters go below the last one)")
    return out


def _check_tensors(path, meta: dict, shapes: dict[str, tuple[int, ...]]) -> None:
    """DexError unless ``path`` holds every tensor its metadata promises, with the right shape."""
    hidden = meta["identity"]["hidden_size"]
    want = {f"{d}.{k}": shape for d in meta["depths"]
            for k, shape in adapter_shapes(hidden, meta["bottleneck"]).items()}
    if RANKING in shapes:
        want[RANKING] = (meta["identity"]["vocab_size"],)
    problems = [f"tensor {k} is missing" if k not in shapes else f"tensor {k} has shape {list(shapes[k])}, "
                f"not {list(shape)}" for k, shape in want.items() if shapes.get(k) != shape]
    if problems:
        more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
        raise DexError(f"{path} does not hold the adapters its metadata describes: {'; '.join(problems[:3])}"
                       f"{more}; save it again with 'dex train-adapters'")


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
    'none', 'default' (the shipped set), a file, or a mapping {depth: module} (modules are moved to the
    model's device). Only the non-final depths of exploration set ``depths`` are kept; a mapping with others
    is an error."""
    if isinstance(spec, Mapping):
        bad = [d for d, a in spec.items() if isinstance(d, bool) or not isinstance(d, int) or not callable(a)]
        if bad:
            raise DexError(f"an adapter mapping takes layer depths (ints) to modules; got {bad[0]!r:.40}: "
                           f"{spec[bad[0]]!r:.40}")
        adapters = dict(spec)
        if depths is not None:
            extra = sorted(set(adapters) - set(depths[:-1]))
            if extra:
                raise DexError(f"adapters given for depths {extra}; only the non-final explored depths "
                               f"{list(depths[:-1])} take adapters")
        for a in adapters.values():
            if isinstance(a, nn.Module):
                a.to(model.model.norm.weight.device)  # adapters follow the layers they serve
        return adapters
    spec = "none" if spec is None else str(spec).strip()
    if spec == "none" or (spec == "auto" and not shipped_adapters_fit(model)):
        return {}
    adapters = load_adapters("default" if spec == "auto" else spec, model)
    return {d: a for d, a in adapters.items() if depths is None or d in depths[:-1]}


def rewrite_adapters(path, model, tensors=None, metadata=None) -> None:
    """Add or replace ``tensors`` and ``metadata`` entries of adapter file ``path`` (checked for ``model``)."""
    from safetensors.torch import load_file, save_file

    load_adapters(path, model)  # every check of the file and of its fit to ``model``
    raw, _ = _header(path)
    save_file({**load_file(str(path)), **(tensors or {})}, str(path), metadata={**raw, **(metadata or {})})


def store_best_sets(path, model, best: dict[int, list[int]]) -> None:
    """Record in adapter file ``path`` the exploration set to use for each K (``{K: depths}``)."""
    rewrite_adapters(path, model, metadata={"best_sets": json.dumps({str(k): [int(d) for d in v]
                                                                     for k, v in sorted(best.items())})})


def choose_depths(model, options) -> tuple[tuple[int, ...], str]:
    """The exploration set of decoder ``options`` and how it was chosen: explicit ``depths`` win; else
    the best set for K recorded with the adapter file ('auto'/'default'/a file), else the uniform split."""
    L = model.config.num_hidden_layers
    if options.depths is not None:
        return resolve_depths(L, options.depths), DEPTH_CHOICES[0]
    spec = options.adapters
    if isinstance(spec, str) and spec != "none" and not (spec == "auto" and not shipped_adapters_fit(model)):
        path = adapter_file(DEFAULT_ADAPTERS if spec in ("auto", "default") else spec)
        raw = _header(path)[0].get("best_sets")
        try:
            best = json.loads(raw)[str(options.explorers)] if raw else None
        except (ValueError, KeyError, TypeError):
            best = None
        if best is not None:
            return resolve_depths(L, best), DEPTH_CHOICES[1]
    return resolve_depths(L, explorers=options.explorers), DEPTH_CHOICES[2]


def load_adapters(path, model) -> dict[int, InducingAdapter]:
    """Adapters from ``path`` ('default' = the shipped set for the default model) for ``model``."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = adapter_file(DEFAULT_ADAPTERS if str(path) == "default" else path)
    meta = read_metadata(path)
    reason = _mismatch(meta["identity"], model_identity(model), path.name)
    if reason:
        raise DexError(reason)
    _check_tensors(path, meta, _header(path)[1])
    try:
        tensors = load_file(str(path))
    except (SafetensorError, OSError) as err:
        raise DexError(f"{path} could not be read ({err}); save it again with 'dex train-adapters'") from None
    where = {"device": model.model.norm.weight.device, "dtype": model.model.norm.weight.dtype}  # the model's
    adapters = {}
    for d in meta["depths"]:
        adapter = InducingAdapter(meta["identity"]["hidden_size"], meta["bottleneck"], meta["activation"],
                                  meta["eps"], **where)
        adapter.load_state_dict({k: tensors[f"{d}.{k}"].float() for k in adapter.state_dict()})  # copied over
        adapters[d] = adapter.eval().requires_grad_(False)
    return adapters
