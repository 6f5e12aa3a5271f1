"""Inducing adapters (paper §3.4, App. C.2): small residual modules at non-final explored depths.

    adapter(h) = h + alpha * W2 act(W1 RMSNorm(h))        (W1: m x h, W2: h x m, alpha init 1e-3)

The adapted hidden state goes through the model's own final norm and LM head to propose a candidate.
Adapters change only which branch survives a commit, never the committed token. A set of adapters is
saved as one safetensors file whose metadata records the model it belongs to (layer count, hidden and
vocabulary size, an embedding fingerprint), the depths (each with its bottleneck when a merged file mixes them), and
how it was trained; loading it for
another model is a clear error. So is a file that is not a complete DEX adapter file (corrupt, truncated,
another program's safetensors, tensors missing or of the wrong shape): every check reads only the
file's header, before any tensor is loaded or any module built. Which adapters a run uses, and loading a file for a
model: ``dex_core.model.adapter_choice``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from torch import nn

from ..config import DexError, adapter_file

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
        self.act = _activations()[activation]
        self.activation = activation
        self.alpha = nn.Parameter(torch.tensor(1e-3, device=device, dtype=dtype))

    def forward(self, h: torch.Tensor) -> torch.Tensor:  # (..., hidden) -> (..., hidden)
        x = h.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.norm_weight.float()
        delta = self.down(self.act(self.up(x.to(self.up.weight.dtype))))
        return h + (self.alpha * delta).to(h.dtype)


SHAPE_KEYS = (
    "model_type",
    "num_layers",
    "hidden_size",
    "vocab_size",
)  # an identity's shapes; and "fingerprint"


def same_weights(want: float, have: float) -> bool:
    """Whether two identities' embedding fingerprints are one model's: equal within 1% (a dtype cast rounds)."""
    return abs(want - have) <= 1e-2 * max(1.0, abs(want))


def identity(config, embedding_rows: torch.Tensor, vocab_size: int) -> dict:
    """What an adapter file must match: the model's shapes, and a fingerprint of its embedding matrix from its
    first 64 rows (``embedding_rows``, at least 64 x 64 or the whole matrix when smaller)."""
    return {
        "model_type": config.model_type,
        "num_layers": config.num_hidden_layers,
        "hidden_size": config.hidden_size,
        "vocab_size": vocab_size,
        "fingerprint": _fingerprint(embedding_rows),
    }


def _fingerprint(rows: torch.Tensor) -> float:
    """The absolute sum of the first 64 x 64 entries, in float64. Gathered (``index_select``), not sliced: a view
    of an inference tensor, like a tensor-parallel rank's weights, cannot be made outside inference mode."""
    n, h = min(64, rows.shape[0]), min(64, rows.shape[1])
    with torch.no_grad():  # a value read, not a step of training
        picked = rows.index_select(0, torch.arange(n, device=rows.device))
        return float(picked.index_select(1, torch.arange(h, device=rows.device)).double().abs().sum())


def model_identity(model) -> dict:
    """The identity (``identity``) of a loaded model."""
    emb = model.get_input_embeddings().weight
    return identity(model.config, emb, emb.shape[0])


def identity_of(model) -> dict:
    """``model``'s identity: a loaded model's (``model_identity``), or an identity dict as it is (a model known
    only by its checkpoint, ``stage_load.checkpoint_identity``)."""
    return model if isinstance(model, dict) else model_identity(model)


def new_adapters(
    model, depths, bottleneck: int | None = None, dtype: torch.dtype = torch.float32, device=None
) -> dict[int, InducingAdapter]:
    """Fresh adapters for the given non-final depths, on the model's device (or ``device``) in ``dtype`` (float32:
    what training updates, whatever the model's dtype, except float64 for a float64 model); m = 2h by default."""
    cfg = model.config
    m = bottleneck or 2 * cfg.hidden_size
    act = getattr(cfg, "hidden_act", "silu")
    eps = getattr(cfg, "rms_norm_eps", 1e-5)
    device = device or model.model.norm.weight.device
    return {int(d): InducingAdapter(cfg.hidden_size, m, act, eps, device=device, dtype=dtype) for d in depths}


def save_adapters(path, adapters: dict[int, InducingAdapter], model, training: dict, ranking=None) -> None:
    """One safetensors file (float16 weights) with the identity of ``model`` (a loaded model or its identity dict)
    and training facts as metadata, and
    the token ranking of light proposal heads (``dex_core.model.proposal``) as tensor 'shortlist'."""
    tensors = {
        f"{d}.{k}": v.detach().to(torch.float16).contiguous()
        for d, a in adapters.items()
        for k, v in a.state_dict().items()
    }
    if ranking is not None:
        tensors[RANKING] = torch.as_tensor(ranking, device="cpu").to(torch.int32).contiguous()
    first = next(iter(adapters.values()))
    widths = {int(d): a.up.out_features for d, a in sorted(adapters.items())}
    meta = {
        "format": "dex-adapters",
        "version": "1",
        "identity": json.dumps(identity_of(model)),
        "depths": json.dumps(sorted(adapters)),
        "bottleneck": str(first.up.out_features),
        "activation": first.activation,
        "eps": str(first.eps),
        "training": json.dumps(training),
    }
    if len(set(widths.values())) > 1:  # a merged file: each depth's own bottleneck
        meta["bottlenecks"] = json.dumps({str(d): m for d, m in widths.items()})
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


def _activations():
    """transformers' activations by name. Deferred: importing them loads its weight-conversion code and
    torch.distributed.tensor, seconds that every ``import dex_core`` would pay (docs/ARCHITECTURE.md, Imports)."""
    from transformers.activations import ACT2FN

    return ACT2FN


def _activation(name: str) -> str:
    if name not in _activations():
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
    out["bottlenecks"] = _widths(path, meta, out)
    if out["depths"][-1] >= out["identity"]["num_layers"]:
        raise DexError(
            f"{path} has adapters at depths {out['depths']}, but its model has only "
            f"{out['identity']['num_layers']} layers (adapters go below the last one)"
        )
    return out


def _widths(path, meta: dict, out: dict) -> dict[int, int]:
    """Each depth's bottleneck: the file's ``bottleneck``, or a merged file's own per depth (``bottlenecks``)."""
    try:
        given = _typed(json.loads(meta.get("bottlenecks", "{}")), dict)
        given = {int(d): _positive(int)(str(m)) for d, m in given.items()}
    except (TypeError, ValueError, OverflowError) as err:
        raise DexError(
            f"{path} has invalid DEX adapter metadata 'bottlenecks' ({str(err)[:120]}); "
            "save it again with 'dex train-adapters'"
        ) from None
    stray = sorted(set(given) - set(out["depths"]))
    if stray:
        raise DexError(f"{path} gives bottlenecks for depths {stray}, where it has no adapter")
    return {d: given.get(d, out["bottleneck"]) for d in out["depths"]}


def check_tensors(path, meta: dict, shapes: dict[str, tuple[int, ...]]) -> None:
    """DexError unless ``path`` holds every tensor its metadata promises, with the right shape."""
    hidden = meta["identity"]["hidden_size"]
    want = {
        f"{d}.{k}": shape
        for d in meta["depths"]
        for k, shape in adapter_shapes(hidden, meta["bottlenecks"][d]).items()
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
