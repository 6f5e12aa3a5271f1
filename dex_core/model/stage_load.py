"""One explorer's part of a model, built from the checkpoint: the module skeleton on the meta device, then only
the part's own tensors, read by key straight onto its device in its dtype. No process holds the whole model.

Explorer k of exploration set X = (d_0 < ... < d_{K-1}) holds (``StagePart``):
- the decoder layers (d_{k-1}, d_k];
- the final norm (every explorer proposes through it);
- the LM head: whole on the final explorer; on a non-final one whole, or only the shortlist's rows when it
  proposes through a light head (``dex_core.model.proposal``); explorer 0 also the embeddings.
A tied head (the embedding matrix) is read once. Checkpoint keys are mapped to the model's own keys by
transformers' own loading rules (``get_model_conversion_mapping``: renamed keys, and converted ones such as
per-expert weights that the model fuses into one tensor), so a part holds exactly what ``from_pretrained``
would put there. The tensors come from a ``Checkpoint`` (files, memory-mapped) or a ``StateDict`` (a parent's
model built in memory, handed over without files).
"""

from __future__ import annotations

import copy
import json
import re
from collections import defaultdict
from dataclasses import dataclass
from types import SimpleNamespace

import torch
from safetensors.torch import load as load_bytes
from safetensors.torch import save as save_bytes

from ..config import DexError, stage_bounds
from .adapters import identity
from .attention import register_tree_attention
from .checkpoint import Checkpoint

CHUNK_BYTES = 64 * 2**20  # a tensor is moved to its device in pieces of at most this size, each one reported


def skeleton(config, dtype: torch.dtype, folder=None):
    """The model of ``config`` on the meta device (no memory for weights), its parameters in ``dtype`` except
    where the model keeps some in float32 itself; with a checkpoint ``folder``, its generation config too."""
    # deferred: transformers takes seconds to import (docs/ARCHITECTURE.md, Imports)
    from transformers import AutoModelForCausalLM, GenerationConfig

    register_tree_attention()  # a config that model_view switched names ``dex_sdpa``
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    if folder is not None:
        try:
            model.generation_config = GenerationConfig.from_pretrained(folder)
        except OSError:  # no generation_config.json: the config's defaults
            pass
    return model.eval()


@dataclass(frozen=True)
class StagePart:
    """The part of a model explorer ``rank`` of exploration set ``depths`` holds; ``rows``: the token ids of its
    light proposal head (only their rows of the LM head), or None for the whole head."""

    depths: tuple[int, ...]
    rank: int
    rows: tuple[int, ...] | None = None

    @property
    def layers(self) -> range:
        return range(*stage_bounds(self.depths, self.rank))

    @property
    def final(self) -> bool:
        return self.rank == len(self.depths) - 1


def _names(model) -> dict[str, str]:
    """Module names of the parts a stage is made of: embeddings, layers, norm and head."""
    base = getattr(model, model.base_model_prefix)
    modules = {
        "embed": model.get_input_embeddings(),
        "layers": base.layers,
        "norm": base.norm,
        "head": model.get_output_embeddings(),
    }
    found = {id(m): name for name, m in model.named_modules()}
    return {part: found[id(m)] for part, m in modules.items()}


def module_keys(model, part: StagePart) -> tuple[list[str], list[str]]:
    """The model's own keys (``state_dict``) that ``part`` holds whole, and those it holds only ``part.rows`` of
    (the LM head's, for a light proposal head)."""
    names = _names(model)
    layer = re.compile(re.escape(names["layers"]) + r"\.(\d+)\.")
    whole, rows = [], []
    for key in model.state_dict():
        found = layer.match(key)
        if found:
            if int(found.group(1)) in part.layers:
                whole.append(key)
        elif key.startswith(names["head"] + "."):
            (whole if part.final or part.rows is None else rows).append(key)
        elif key.startswith(names["embed"] + "."):
            if part.rank == 0:
                whole.append(key)
        else:  # the final norm, and any other small module outside the layers: every explorer holds it
            whole.append(key)
    return whole, rows


def part_bytes(model, part: StagePart) -> dict[str, int]:
    """Bytes of ``part`` of (meta) ``model`` by kind: layers, head, embeddings, other; tied tensors once."""
    names, whole, rows = _names(model), *module_keys(model, part)
    state = model.state_dict()
    seen, out = set(), {"layers": 0, "head": 0, "embeddings": 0, "other": 0}
    for key in whole + rows:
        tensor = state[key]
        if id(tensor) in seen:
            continue
        seen.add(id(tensor))
        size = tensor.numel() * tensor.element_size()
        if key in rows:
            size = size * len(part.rows) // tensor.shape[0]
        kind = (
            "layers"
            if key.startswith(names["layers"] + ".")
            else "head"
            if key.startswith(names["head"] + ".")
            else "embeddings"
            if key.startswith(names["embed"] + ".")
            else "other"
        )
        out[kind] += size
    return out


class StateDict:
    """Tensors handed over in memory and read like a checkpoint: a model built in memory (e.g. a test's tiny
    model) sends its explorers their parts this way, without files. ``rows[key]``: the stored tensor holds only
    these rows of the model's tensor."""

    def __init__(self, tensors: dict[str, torch.Tensor], rows: dict[str, tuple[int, ...]] | None = None):
        self.tensors, self.rows = tensors, dict(rows or {})

    @classmethod
    def of(cls, model, part: StagePart) -> StateDict:
        """What ``part`` of the loaded ``model`` holds (copies on the CPU; the head's rows cut)."""
        whole, rows = module_keys(model, part)
        state = model.state_dict()
        tensors = {k: state[k].detach().cpu() for k in whole}
        tensors |= {k: state[k].detach()[list(part.rows)].cpu() for k in rows}
        return cls(tensors, dict.fromkeys(rows, part.rows))

    def to_bytes(self) -> bytes:
        """The tensors as one safetensors blob (tensors that share memory stored once)."""
        unique, aliases = {}, {}
        for key, tensor in self.tensors.items():
            same = next(
                (
                    k
                    for k, t in unique.items()
                    if t.data_ptr() == tensor.data_ptr() and t.shape == tensor.shape
                ),
                None,
            )
            if same is None:
                unique[key] = tensor.contiguous()
            else:
                aliases[key] = same
        meta = {"aliases": json.dumps(aliases), "rows": json.dumps(self.rows)}
        return save_bytes(unique, metadata=meta)

    @classmethod
    def from_bytes(cls, blob: bytes) -> StateDict:
        size = int.from_bytes(blob[:8], "little")  # safetensors: header length, JSON header, data
        meta = json.loads(blob[8 : 8 + size])["__metadata__"]
        tensors = load_bytes(blob)
        tensors |= {k: tensors[v] for k, v in json.loads(meta["aliases"]).items()}
        return cls(tensors, {k: tuple(v) for k, v in json.loads(meta["rows"]).items()})

    def keys(self) -> list[str]:
        return list(self.tensors)

    def read(self, key: str, rows=None) -> torch.Tensor:
        tensor, have = self.tensors[key], self.rows.get(key)
        if rows is None:
            if have is not None:
                raise DexError(f"only some rows of {key!r} were handed over")
            return tensor
        index = list(rows) if have is None else [{r: i for i, r in enumerate(have)}[r] for r in rows]
        return tensor[index]


def _loading_rules():
    """transformers' loading rules (renamed and converted checkpoint keys) as one namespace, or None before
    transformers 5, whose checkpoint keys are the model's own. Deferred: they import torch.distributed.tensor,
    seconds that every ``import dex_core`` would pay (docs/ARCHITECTURE.md, Imports)."""
    try:
        from transformers import conversion_mapping, core_model_loading
    except ImportError:
        return None
    return SimpleNamespace(
        get_model_conversion_mapping=conversion_mapping.get_model_conversion_mapping,
        **{
            name: getattr(core_model_loading, name)
            for name in ("WeightConverter", "WeightRenaming", "dot_natural_key", "rename_source_key")
        },
    )


class KeyMap:
    """Checkpoint keys -> the model's keys, as transformers renames and converts them while loading."""

    def __init__(self, model, checkpoint_keys):
        meta, rules = model.state_dict(), _loading_rules()
        transforms = [] if rules is None else rules.get_model_conversion_mapping(model)
        renamings = [t for t in transforms if isinstance(t, rules.WeightRenaming)]
        self.converters = {
            p: c for c in transforms if isinstance(c, rules.WeightConverter) for p in c.source_patterns
        }
        self.groups: dict[str, list[tuple[str, str | None]]] = defaultdict(list)  # first target -> sources
        self.targets: dict[str, str] = {}  # model key -> the first target of the group that makes it
        order = sorted(checkpoint_keys, key=rules.dot_natural_key) if transforms else list(checkpoint_keys)
        for key in order:  # in transformers' order: some renamings depend on the keys seen before
            target, pattern = (
                (key, None)
                if not transforms
                else rules.rename_source_key(
                    key, renamings, list(self.converters.values()), model.base_model_prefix, meta
                )
            )
            if target not in meta and key in meta:
                target, pattern = key, None
            made = (
                [target]
                if pattern is None
                else [
                    target.replace(self.converters[pattern].target_patterns[0], t)
                    for t in self.converters[pattern].target_patterns
                ]
            )
            if any(t in meta for t in made):
                self.groups[target].append((key, pattern))
                self.targets.update(dict.fromkeys(made, target))

    def read(self, source, first: str, model, rows=None) -> dict[str, torch.Tensor]:
        """The model's tensors that group ``first`` makes (``rows`` of a plain, renamed tensor only)."""
        members = self.groups[first]
        if members[0][1] is None:
            return {first: source.read(members[0][0], rows)}
        converter = copy.deepcopy(self.converters[members[0][1]])
        for key, pattern in members:
            converter.add_tensor(first, key, pattern, source.read(key))
        made = converter.convert(first, model=model, config=model.config)
        return {k: v[0] if isinstance(v, list) else v for k, v in made.items()}


def _place(tensor: torch.Tensor, dtype: torch.dtype, device, report) -> torch.Tensor:
    """``tensor`` on ``device`` in ``dtype``: as it is where it already is (a memory-mapped CPU tensor stays
    mapped), else copied in pieces of at most ``CHUNK_BYTES``, each one reported (``report(bytes)``)."""
    device = torch.device(device)
    size = tensor.numel() * torch.empty((), dtype=dtype, device="cpu").element_size()
    if tensor.device == device and tensor.dtype == dtype:
        report(size)
        return tensor
    if tensor.dim() == 0 or size <= CHUNK_BYTES:
        out = tensor.to(device=device, dtype=dtype)
        report(size)
        return out
    out = torch.empty(tensor.shape, dtype=dtype, device=device)
    step = max(1, len(tensor) * CHUNK_BYTES // size)
    for start in range(0, len(tensor), step):
        out[start : start + step].copy_(tensor[start : start + step])
        report(size * len(out[start : start + step]) // len(tensor))
    return out


@dataclass(frozen=True)
class PartSource:
    """Where an explorer process gets its part of the model: a checkpoint ``folder`` to read, or the part's
    tensors handed over by its parent (``blob``: ``StateDict.to_bytes``)."""

    config: object
    folder: str | None = None
    blob: bytes | None = None

    def open(self):
        return Checkpoint(self.folder) if self.folder is not None else StateDict.from_bytes(self.blob)


def checkpoint_identity(config, source) -> dict:
    """The adapter identity (``adapters.identity``) of the model in ``source``, from its embedding's first 64
    rows alone."""
    model = skeleton(config, torch.float32)
    key = _names(model)["embed"] + ".weight"
    keymap, vocab = KeyMap(model, source.keys()), model.state_dict()[key].shape[0]
    if key not in keymap.targets:
        raise DexError(f"the checkpoint has no embedding matrix ({key!r}); it does not match its config")
    first = keymap.targets[key]
    plain = keymap.groups[first][0][1] is None
    rows = keymap.read(source, first, model, range(min(64, vocab)) if plain else None)[key]
    return identity(config, rows, vocab)


@dataclass
class Stage:
    """A loaded part: the model (skeleton with the part's tensors), the light head's rows (weight, bias) or None,
    the checkpoint keys read (with the number of rows where only some were), and the bytes placed."""

    model: torch.nn.Module
    head_rows: tuple[torch.Tensor, torch.Tensor | None] | None
    read: dict[str, int | None]
    bytes: int


def load_stage(config, part: StagePart, source, device, dtype: torch.dtype, progress=None) -> Stage:
    """Build ``part`` of the model of ``config`` from ``source`` (a ``Checkpoint`` or ``StateDict``) on
    ``device`` in ``dtype``. ``progress(done, total, key)`` is called as the bytes arrive."""
    model = skeleton(config, dtype)
    whole, row_keys = module_keys(model, part)
    meta, keymap = model.state_dict(), KeyMap(model, source.keys())
    tied = dict(getattr(model, "all_tied_weights_keys", None) or {})
    total, done = sum(part_bytes(model, part).values()), [0]
    if progress is not None:
        progress(0, total, "")  # from here on, reports while the bytes arrive
    fetched: dict[str, torch.Tensor] = {}  # converted tensors not placed yet (a group makes several)
    placed: dict[str, torch.Tensor] = {}  # model key -> its tensor on the device (whole)
    read: dict[str, int | None] = {}  # checkpoint key -> None (whole) or the number of rows read
    for key in whole + row_keys:  # whole first: a tied head's rows may come from the embeddings held whole
        rows = part.rows if key in row_keys else None
        origin = key if key in keymap.targets else tied.get(key)
        if origin not in keymap.targets:
            raise DexError(
                f"the checkpoint has no tensor for {key!r} (explorer {part.rank}'s part); it does not "
                "match its config"
            )

        def report(n: int, key=key) -> None:
            done[0] += n
            if progress is not None:
                progress(done[0], total, key)

        if origin in placed:  # tied to a tensor this part already holds whole
            tensor = (
                placed[origin]
                if rows is None
                else _place(
                    placed[origin][torch.tensor(rows, device=placed[origin].device)],
                    meta[key].dtype,
                    device,
                    report,
                )
            )
        else:
            if origin not in fetched:
                first = keymap.targets[origin]
                plain = keymap.groups[first][0][1] is None
                fetched |= keymap.read(source, first, model, rows if plain else None)
                read |= {k: None if rows is None or not plain else len(rows) for k, _ in keymap.groups[first]}
            tensor = fetched.pop(origin)
            if rows is not None and tensor.shape[0] != len(rows):  # a converted tensor: cut after converting
                tensor = tensor[list(rows)]
            tensor = _place(tensor, meta[key].dtype, device, report)
            if rows is None:
                placed[origin] = tensor
        placed[key] = tensor
    head_rows = _head_rows(model, row_keys, placed)
    model.load_state_dict({k: placed[k] for k in whole}, strict=False, assign=True)
    _finish(model, part, config, device)
    return Stage(model, head_rows, read, done[0])


def _head_rows(model, row_keys, placed) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    if not row_keys:
        return None
    head = _names(model)["head"]
    return placed[f"{head}.weight"], placed.get(f"{head}.bias")


def _finish(model, part: StagePart, config, device) -> None:
    """Computed buffers (the rotary embedding's) on the device; DexError for any tensor left on the meta device
    in a module this part runs."""
    base = getattr(model, model.base_model_prefix)
    with torch.device(device):  # the rotary buffers are computed, not loaded
        base.rotary_emb = type(base.rotary_emb)(config=config)
    for module in model.modules():  # computed scalars held beside a float scalar_<name> (Gemma's embed_scale)
        for name, buffer in list(module.named_buffers(recurse=False)):
            if buffer is not None and buffer.is_meta and hasattr(module, f"scalar_{name}"):
                value = torch.tensor(getattr(module, f"scalar_{name}"), dtype=buffer.dtype, device=device)
                module.register_buffer(name, value, persistent=False)
    names = _names(model)
    runs = [f"{names['layers']}.{i}." for i in part.layers] + [names["norm"] + "."]
    runs += [names["embed"] + "."] * (part.rank == 0) + [names["head"] + "."] * (
        part.rows is None or part.final
    )
    left = [
        name
        for name, t in [*model.named_parameters(), *model.named_buffers()]
        if t.is_meta and name.startswith(tuple(runs))
    ]
    if left:
        raise DexError(
            f"explorer {part.rank} could not build {left[0]} (computed while the model is built, not "
            f"stored in the checkpoint); {type(model).__name__} is not supported by stage loading yet"
        )
