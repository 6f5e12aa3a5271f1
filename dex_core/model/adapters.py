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
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file
from torch import nn
from transformers.activations import ACT2FN

from ..config import DEPTH_CHOICES, DexError, adapter_file, resolve_depths

ASSETS = Path(__file__).resolve().parents[2] / "assets" / "adapters"
DEFAULT_ADAPTERS = ASSETS / "smollm2-135m-instruct.safetensors"
RANKING = "shortlist"  # the tensor holding the token ranking of the light proposal heads


class InducingAdapter(nn.Module):
    def __init__(
        self,
        hidden: int,
        bottleneck: int,
        activation: str = "silu",
        eps: float = 1e-5,
        *,
        device=None,
        dtype=None,
    ):
        super().__init__()

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


def identity(config, embedding_rows: torch.Tensor, vocab_size: int) -> dict:
    """What an adapter file must match: the model's shapes, and a fingerprint of its embedding matrix from its
    first 64 rows (``embedding_rows``, at least 64 x 64 or the whole matrix when smaller)."""
    return {
        "model_type": config.model_type,
        "num_layers": config.num_hidden_layers,
        "hidden_size": config.hidden_size,
        "vocab_size": vocab_size,
        "fingerprint": float(embedding_rows.detach()[:64, :64].double().abs().sum()),
    }


def model_identity(model) -> dict:
    """The identity (``identity``) of a loaded model."""
    emb = model.get_input_embeddings().weight
    return identity(model.config, emb, emb.shape[0])


def identity_of(model) -> dict:
    """``model``'s identity: a loaded model's (``model_identity``), or an identity dict as it is (a model known
    only by its checkpoint, ``stage_load.checkpoint_identity``)."""
    return model if isinstance(model, dict) else model_identity(model)


def new_adapters(model, depths, bottleneck: int | None = None) -> dict[int, InducingAdapter]:
    """Fresh adapters for the given non-final depths, on the model's device in float32 (what training
    updates, whatever the model's dtype); m = 2h by default."""
    cfg = model.config
    m = bottleneck or 2 * cfg.hidden_size
    act = getattr(cfg, "hidden_act", "silu")
    eps = getattr(cfg, "rms_norm_eps", 1e-5)
    device = model.model.norm.weight.device
    return {
        int(d): InducingAdapter(cfg.hidden_size, m, act, eps, device=device, dtype=torch.float32)
        for d in depths
    }


def save_adapters(path, adapters: dict[int, InducingAdapter], model, training: dict, ranking=None) -> None:
    """One safetensors file (float16 weights) with the model identity and training facts as metadata, and
    the token ranking of light proposal heads (``dex_core.model.proposal``) as tensor 'shortlist'."""
    tensors = {
        f"{d}.{k}": v.detach().to(torch.float16).contiguous()
        for d, a in adapters.items()
        for k, v in a.state_dict().items()
    }
    if ranking is not None:
        tensors[RANKING] = torch.as_tensor(ranking, device="cpu").to(torch.int32).contiguous()
    first = next(iter(adapters.values()))
    meta = {
        "format": "dex-adapters",
        "version": "1",
        "identity": json.dumps(model_identity(model)),
        "depths": json.dumps(sorted(adapters)),
        "bottleneck": str(first.up.out_features),
        "activation": first.activation,
        "eps": str(first.eps),
        "training": json.dumps(training),
    }
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path), metadata=meta)


def adapter_shapes(hidden: int, bottleneck: int) -> dict[str, tuple[int, ...]]:
    """The tensors of one adapter and their shapes, as ``save_adapters`` writes them under '{depth}.'."""
    return {
        "norm_weight": (hidden,),
        "up.weight": (bottleneck, hidden),
        "up.bias": (bottleneck,),
        "down.weight": (hidden, bottleneck),
        "down.bias": (hidden,),
        "alpha": (),
    }


def header(path) -> tuple[dict, dict[str, tuple[int, ...]]]:
    """(metadata, {tensor name: shape}) of a safetensors file, from its header alone."""
    path = adapter_file(path)
    try:
        with safe_open(str(path), "pt") as fh:
            return fh.metadata() or {}, {k: tuple(fh.get_slice(k).get_shape()) for k in fh.keys()}
    except (SafetensorError, OSError) as err:
        raise DexError(
            f"{path} is not a readable safetensors file ({err}); it may be truncated or corrupt: "
            f"save it again with 'dex train-adapters', or use 'none'"
        ) from None


def _typed(value, kind, what: str = "the value"):
    if not isinstance(value, kind) or isinstance(value, bool):
        raise ValueError(f"{what} is {type(value).__name__}, not {getattr(kind, '__name__', 'a number')}")
    return value


def _identity(text: str) -> dict:
    identity = _typed(json.loads(text), dict)
    for key, kind in (
        ("model_type", str),
        ("num_layers", int),
        ("hidden_size", int),
        ("vocab_size", int),
        ("fingerprint", (int, float)),
    ):
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
    if name not in ACT2FN:
        raise ValueError(f"unknown activation {name!r}")
    return name


METADATA = {
    "identity": _identity,
    "depths": _depths,
    "bottleneck": _positive(int),
    "activation": _activation,
    "eps": _positive(float),
    "training": lambda text: _typed(json.loads(text), dict),
}


def read_metadata(path) -> dict:
    """The checked DEX metadata of an adapter file; DexError says what is wrong with the file."""
    meta, _ = header(path)
    if meta.get("format") != "dex-adapters":
        raise DexError(f"{path} is not a DEX adapter file (no 'format: dex-adapters' metadata)")
    out = {}
    for key, parse in METADATA.items():
        if key not in meta:
            raise DexError(
                f"{path} is not a complete DEX adapter file: its metadata lacks {key!r}; "
                f"save it again with 'dex train-adapters'"
            )
        try:
            out[key] = parse(meta[key])
        except (TypeError, ValueError, OverflowError) as err:  # json.JSONDecodeError is a ValueError
            raise DexError(
                f"{path} has invalid DEX adapter metadata {key!r} ({str(err)[:120]}); "
                f"save it again with 'dex train-adapters'"
            ) from None
    if out["depths"][-1] >= out["identity"]["num_layers"]:
        raise DexError(
            f"{path} has adapters at depths {out['depths']}, but its model has only "
            f"{out['identity']['num_layers']} layers (adapters go below the last one)"
        )
    return out


def check_tensors(path, meta: dict, shapes: dict[str, tuple[int, ...]]) -> None:
    """DexError unless ``path`` holds every tensor its metadata promises, with the right shape."""
    hidden = meta["identity"]["hidden_size"]
    want = {
        f"{d}.{k}": shape
        for d in meta["depths"]
        for k, shape in adapter_shapes(hidden, meta["bottleneck"]).items()
    }
    if RANKING in shapes:
        want[RANKING] = (meta["identity"]["vocab_size"],)
    problems = [
        f"tensor {k} is missing"
        if k not in shapes
        else f"tensor {k} has shape {list(shapes[k])}, not {list(shape)}"
        for k, shape in want.items()
        if shapes.get(k) != shape
    ]
    if problems:
        more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
        raise DexError(
            f"{path} does not hold the adapters its metadata describes: {'; '.join(problems[:3])}"
            f"{more}; save it again with 'dex train-adapters'"
        )


def _mismatch(want: dict, have: dict, name: str) -> str | None:
    """Why adapters trained for model identity ``want`` do not fit a model of identity ``have`` (or None)."""
    for key in ("model_type", "num_layers", "hidden_size", "vocab_size"):
        if want[key] != have[key]:
            return (
                f"adapters in {name} were trained for a {want['model_type']} model with "
                f"{want['num_layers']} layers, hidden size {want['hidden_size']} and vocabulary "
                f"{want['vocab_size']}; this model has {have['num_layers']} layers, hidden size "
                f"{have['hidden_size']}, vocabulary {have['vocab_size']}"
            )
    if abs(want["fingerprint"] - have["fingerprint"]) > 1e-2 * max(1.0, abs(want["fingerprint"])):
        return (
            f"adapters in {name} were trained for different weights (embedding fingerprint "
            f"{want['fingerprint']:.4f}, this model {have['fingerprint']:.4f})"
        )
    return None


def shipped_adapters_fit(model) -> bool:
    """Whether the shipped adapter file exists and was trained for ``model`` (a model or its identity: the
    default model)."""
    return (
        DEFAULT_ADAPTERS.is_file()
        and _mismatch(read_metadata(DEFAULT_ADAPTERS)["identity"], identity_of(model), DEFAULT_ADAPTERS.name)
        is None
    )


def named_file(spec, model) -> Path | None:
    """The adapter file that choice ``spec`` names for ``model`` (a model or its identity): 'auto' the shipped
    file when it fits, else none; 'default' the shipped file; 'none' none; any other text that file. A mapping
    of modules names no file (None)."""
    if (
        isinstance(spec, Mapping)
        or spec in (None, "none")
        or (spec == "auto" and not shipped_adapters_fit(model))
    ):
        return None
    return adapter_file(DEFAULT_ADAPTERS if str(spec).strip() in ("auto", "default") else str(spec).strip())


@dataclass(frozen=True)
class AdapterSet:
    """A run's inducing adapters, resolved once: the depths they serve, and where they come from — a file
    (every explorer builds only its own depth's, on its own device) or modules built in memory by the caller
    (explorer processes receive theirs pickled from their parent). ``size``: one adapter's parameters."""

    depths: tuple[int, ...] = ()
    file: str | None = None
    modules: Mapping[int, nn.Module] | None = None
    size: int = 0

    def only(self, depth: int) -> AdapterSet:
        """This set restricted to ``depth`` (what one explorer needs; a mapping's other modules left out)."""
        kept = tuple(d for d in self.depths if d == depth)
        modules = None if self.modules is None else {d: self.modules[d] for d in kept}
        return AdapterSet(kept, self.file, modules, self.size)

    def build(self, depths, device, dtype) -> dict:
        """The adapters of ``depths`` (those this set has) as modules on ``device``: a file's in ``dtype``, a
        mapping's moved there as they are."""
        wanted = [d for d in self.depths if d in depths]
        if self.modules is not None:
            for d in wanted:
                if isinstance(self.modules[d], nn.Module):
                    self.modules[d].to(device)  # adapters follow the layers they serve
            return {d: self.modules[d] for d in wanted}
        if self.file is None or not wanted:
            return {}
        return _build(Path(self.file), wanted, device, dtype)


def adapter_set(spec, model, depths=None) -> AdapterSet:
    """The one resolver of an adapter choice for ``model`` (a loaded model or its identity): 'auto' (the shipped
    set when it fits, else none), 'none', 'default' (the shipped set), a file (checked against the model), or a
    mapping {depth: module}. Only the non-final depths of exploration set ``depths`` are kept; a mapping with
    others is an error."""
    if isinstance(spec, Mapping):
        bad = [d for d, a in spec.items() if isinstance(d, bool) or not isinstance(d, int) or not callable(a)]
        if bad:
            raise DexError(
                f"an adapter mapping takes layer depths (ints) to modules; got {bad[0]!r:.40}: "
                f"{spec[bad[0]]!r:.40}"
            )
        if depths is not None:
            extra = sorted(set(spec) - set(depths[:-1]))
            if extra:
                raise DexError(
                    f"adapters given for depths {extra}; only the non-final explored depths "
                    f"{list(depths[:-1])} take adapters"
                )
        first = next(iter(spec.values()), None)
        size = sum(p.numel() for p in first.parameters()) if isinstance(first, nn.Module) else 0
        return AdapterSet(tuple(sorted(spec)), None, dict(spec), size)
    path = named_file(spec, model)
    if path is None:
        return AdapterSet()
    meta = read_metadata(path)
    reason = _mismatch(meta["identity"], identity_of(model), path.name)
    if reason:
        raise DexError(reason)
    check_tensors(path, meta, header(path)[1])
    kept = tuple(d for d in meta["depths"] if depths is None or d in depths[:-1])
    size = sum(
        math.prod(shape)
        for shape in adapter_shapes(meta["identity"]["hidden_size"], meta["bottleneck"]).values()
    )
    return AdapterSet(kept, str(path), None, size)


def resolve_adapters(spec, model, depths=None) -> dict:
    """The adapters of choice ``spec`` (``adapter_set``) as modules on the loaded ``model``'s device and in its
    dtype (a mapping's modules are moved there)."""
    return adapter_set(spec, model, depths).build(
        depths or range(model.config.num_hidden_layers),
        model.model.norm.weight.device,
        model.model.norm.weight.dtype,
    )


def rewrite_adapters(path, model, tensors=None, metadata=None) -> None:
    """Add or replace ``tensors`` and ``metadata`` entries of adapter file ``path`` (checked for ``model``)."""
    load_adapters(path, model)  # every check of the file and of its fit to ``model``
    raw, _ = header(path)
    save_file({**load_file(str(path)), **(tensors or {})}, str(path), metadata={**raw, **(metadata or {})})


def store_best_sets(path, model, best: dict[int, list[int]]) -> None:
    """Record in adapter file ``path`` the exploration set to use for each K (``{K: depths}``)."""
    rewrite_adapters(
        path,
        model,
        metadata={"best_sets": json.dumps({str(k): [int(d) for d in v] for k, v in sorted(best.items())})},
    )


def choose_depths(model, options) -> tuple[tuple[int, ...], str]:
    """The exploration set of decoder ``options`` and how it was chosen: explicit ``depths`` win; else
    the best set for K recorded with the adapter file ('auto'/'default'/a file), else the uniform split."""
    L = identity_of(model)["num_layers"]
    if options.depths is not None:
        return resolve_depths(L, options.depths), DEPTH_CHOICES[0]
    path = named_file(options.adapters, model)
    if path is not None:
        raw = header(path)[0].get("best_sets")
        try:
            best = json.loads(raw)[str(options.explorers)] if raw else None
        except (ValueError, KeyError, TypeError):
            best = None
        if best is not None:
            return resolve_depths(L, best), DEPTH_CHOICES[1]
    return resolve_depths(L, explorers=options.explorers), DEPTH_CHOICES[2]


def load_adapters(path, model) -> dict[int, InducingAdapter]:
    """Adapters from ``path`` ('default' = the shipped set for the default model) for ``model``."""
    path = adapter_file(DEFAULT_ADAPTERS if str(path) == "default" else path)
    chosen = adapter_set(str(path), model)
    return chosen.build(chosen.depths, model.model.norm.weight.device, model.model.norm.weight.dtype)


def _build(path: Path, depths, device, dtype) -> dict[int, InducingAdapter]:
    """The adapters of ``depths`` from file ``path`` (checked already) as modules on ``device`` in ``dtype``."""
    meta = read_metadata(path)
    adapters = {}
    try:
        with safe_open(str(path), "pt") as fh:
            for d in depths:
                adapter = InducingAdapter(
                    meta["identity"]["hidden_size"],
                    meta["bottleneck"],
                    meta["activation"],
                    meta["eps"],
                    device=device,
                    dtype=dtype,
                )
                adapter.load_state_dict({k: fh.get_tensor(f"{d}.{k}").float() for k in adapter.state_dict()})
                adapters[d] = adapter.eval().requires_grad_(False)
    except (SafetensorError, OSError) as err:
        raise DexError(f"{path} could not be read ({err}); save it again with 'dex train-adapters'") from None
    return adapters
