"""Which inducing adapters a run uses, resolved once (``AdapterSet``): the choice 'auto' (the shipped set when it was
trained for this model), 'default', 'none', a file (checked against the model) or modules given in a mapping; the
exploration set stored with an adapter file for each K (``choose_depths``); and loading or rewriting a file for a
model. The adapters themselves and their file format: ``dex_core.model.adapters``."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file
from torch import nn

from ..config import DEPTH_CHOICES, DexError, adapter_file, resolve_depths
from .adapters import (
    ASSETS,
    DEFAULT_ADAPTERS,
    RANKING,
    SHAPE_KEYS,
    InducingAdapter,
    adapter_shapes,
    check_tensors,
    header,
    identity_of,
    read_metadata,
    same_weights,
    save_adapters,
)


def _mismatch(want: dict, have: dict, name: str) -> str | None:
    """Why adapters trained for model identity ``want`` do not fit a model of identity ``have`` (or None)."""
    for key in SHAPE_KEYS:
        if want[key] != have[key]:
            return (
                f"adapters in {name} were trained for a {want['model_type']} model with "
                f"{want['num_layers']} layers, hidden size {want['hidden_size']} and vocabulary "
                f"{want['vocab_size']}; this model has {have['num_layers']} layers, hidden size "
                f"{have['hidden_size']}, vocabulary {have['vocab_size']}"
            )
    if not same_weights(want["fingerprint"], have["fingerprint"]):
        return (
            f"adapters in {name} were trained for different weights (embedding fingerprint "
            f"{want['fingerprint']:.4f}, this model {have['fingerprint']:.4f})"
        )
    return None


def shipped_file(model) -> Path | None:
    """The shipped adapter file trained for ``model`` (a model or its identity), or None: the default model's
    file first, then the other files under ``assets/adapters`` (one per named model that ships adapters)."""
    have = identity_of(model)
    others = sorted(p for p in ASSETS.glob("*.safetensors") if p != DEFAULT_ADAPTERS)
    for path in (DEFAULT_ADAPTERS, *others):
        if path.is_file() and _mismatch(read_metadata(path)["identity"], have, path.name) is None:
            return path
    return None


def named_file(spec, model) -> Path | None:
    """The adapter file that choice ``spec`` names for ``model`` (a model or its identity): 'auto' the shipped
    file that fits it, else none; 'default' the shipped file that fits it (else the default model's, which
    then refuses it clearly); 'none' none; any other text that file. A mapping of modules names no file (None)."""
    if isinstance(spec, Mapping) or spec in (None, "none"):
        return None
    spec = str(spec).strip()
    if spec in ("auto", "default"):
        fits = shipped_file(model)
        return fits if fits is not None or spec == "auto" else DEFAULT_ADAPTERS
    return adapter_file(spec)


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
    hidden = meta["identity"]["hidden_size"]
    size = max(  # the largest adapter kept: the cost model charges each adapter as that one (an upper bound)
        (sum(math.prod(s) for s in adapter_shapes(hidden, meta["bottlenecks"][d]).values()) for d in kept),
        default=0,
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


def merge_adapters(out, files, model) -> dict[int, int]:
    """One adapter file at ``out`` holding every depth of ``files`` (checked for ``model``), each depth from the
    first file that has it, each with its own bottleneck; the token ranking and training facts of each part kept
    (the ranking of the first file that has one). Returns {depth: the index of the file it came from}."""
    taken, adapters, parts, ranking = {}, {}, [], None
    for i, path in enumerate(files):
        loaded = load_adapters(path, model)
        fresh = {d: a for d, a in loaded.items() if d not in adapters}
        adapters.update(fresh)
        taken.update(dict.fromkeys(fresh, i))
        parts.append({"file": Path(path).name, "depths": sorted(fresh), **read_metadata(path)["training"]})
        ranking = ranking if ranking is not None else adapter_ranking_of(path)
    save_adapters(out, dict(sorted(adapters.items())), model, {"merged": parts}, ranking)
    return taken


def adapter_ranking_of(path):
    """The token ranking tensor stored in adapter file ``path``, or None."""
    with safe_open(str(path), "pt") as fh:
        return fh.get_tensor(RANKING) if RANKING in fh.keys() else None


def store_best_sets(path, model, best: dict[int, list[int]]) -> None:
    """Record in adapter file ``path`` the exploration set to use for each K (``{K: depths}``)."""
    rewrite_adapters(
        path,
        model,
        metadata={"best_sets": json.dumps({str(k): [int(d) for d in v] for k, v in sorted(best.items())})},
    )


def stored_sets(spec, model) -> dict[int, tuple[int, ...]]:
    """``{K: depths}``: the best sets recorded with the adapter file that choice ``spec`` names (else none)."""
    path = named_file(spec, model)
    raw = header(path)[0].get("best_sets") if path is not None else None
    try:
        sets = json.loads(raw) if raw else {}
        return {int(k): tuple(int(d) for d in v) for k, v in sets.items()}
    except (ValueError, TypeError, AttributeError):
        return {}


def choose_depths(model, options) -> tuple[tuple[int, ...], str]:
    """The exploration set of decoder ``options`` and how it was chosen: explicit ``depths`` win; else
    the best set for K recorded with the adapter file ('auto'/'default'/a file), else the uniform split."""
    L = identity_of(model)["num_layers"]
    if options.depths is not None:
        return resolve_depths(L, options.depths), DEPTH_CHOICES[0]
    best = stored_sets(options.adapters, model).get(options.explorers)
    if best is not None:
        return resolve_depths(L, best), DEPTH_CHOICES[1]
    return resolve_depths(L, explorers=options.explorers), DEPTH_CHOICES[2]


def load_adapters(path, model) -> dict[int, InducingAdapter]:
    """Adapters from ``path`` ('default' = the shipped set for this model) for ``model``."""
    chosen = adapter_set(
        str(named_file(path, model) if str(path) == "default" else adapter_file(path)), model
    )
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
                    meta["bottlenecks"][d],
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
