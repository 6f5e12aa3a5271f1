"""``dex plan``: whether a model fits its explorers' devices, from its configuration alone (no weights).

For each explorer (one per GPU, or the GPUs taken in turn when there are fewer) it counts what that process
will hold, with the loader's own rules (``dex_core.model.stage_load``: its layers, the final norm, the LM head or
only its light head's rows, rank 0 the embeddings; shapes from a skeleton on the meta device, so every family
counts right): weights; inducing adapters (m = 2h each, as ``dex train-adapters`` makes them) and the light
head's rows; the KV cache of its layers for the context plus the lattice's rows (a ``StageCache`` of
``shapes.capacity`` entries, as ``Explorer.reset`` sizes it); and the round's work buffers (float32 logits of the
largest batch, tree masks, activations: an estimate). On a GPU add the CUDA context (an estimate). A GPU fits when
its explorers' totals stay within ``--gpu-memory``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from ..config import (
    DEFAULT_PROPOSAL_VOCAB,
    DTYPES,
    DecoderOptions,
    DexError,
    DraftBounds,
    adapter_file,
    integer,
    option,
    rows_option,
)
from ..device import dtype_name, resolve_dtype
from ..log import quiet
from ..model.adapter_choice import choose_depths
from ..model.adapters import DEFAULT_ADAPTERS, adapter_shapes, read_metadata
from ..model.checkpoint import hub_config, is_hub_id, locate
from ..model.depth_grids import parse_adapter_depths
from ..model.explorer import REGION_LEAST
from ..model.named import shipped_adapters
from ..model.proposal import proposal_rows
from ..model.stage_load import StagePart, part_bytes, skeleton
from ..shapes import bucket
from ..shapes import capacity as cache_capacity

CUDA_CONTEXT = 0.5e9  # bytes a CUDA context and the caching allocator's first blocks take (an estimate)
EXAMPLE_CONFIGS = Path(__file__).resolve().parents[2] / "assets" / "configs"  # for --config, offline
UNITS = {
    "": 1,
    "b": 1,
    "kb": 1e3,
    "mb": 1e6,
    "gb": 1e9,
    "tb": 1e12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
    "k": 1e3,
    "m": 1e6,
    "g": 1e9,
    "t": 1e12,
}


def parse_size(text: str) -> float:
    """'80GB', '80 GiB', '81920MB', '8e10' -> bytes."""
    found = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([a-zA-Z]*)\s*", str(text))
    if not found or found.group(2).lower() not in UNITS:
        raise DexError(f"a memory size is a number with a unit, like 80GB or 24GiB; got {text!r:.40}")
    return float(found.group(1)) * UNITS[found.group(2).lower()]


def model_config(spec: str | None, config_file: str | None, log=quiet):
    """The Hugging Face config of model ``spec`` (as for dex generate; a hub id fetches config.json only), or of
    a ``config.json`` file."""
    # deferred: transformers takes seconds to import (docs/ARCHITECTURE.md, Imports)
    from transformers import AutoConfig

    try:
        if config_file is not None:
            data = json.loads(Path(config_file).read_text())
            return AutoConfig.for_model(**data)
        return AutoConfig.from_pretrained(_hub_folder(spec) if is_hub_id(spec) else locate(spec, log))
    except DexError:
        raise
    except Exception as err:  # config files are untrusted input
        reason = str(err).strip().splitlines()[0][:200] if str(err).strip() else type(err).__name__
        raise DexError(f"could not read the model's config ({reason})") from None


def example_config(spec: str) -> Path | None:
    """The shipped example config of hub model ``spec`` (its ``_name_or_path``), if one ships."""
    for path in sorted(EXAMPLE_CONFIGS.glob("*.json")):
        if json.loads(path.read_text()).get("_name_or_path", "").lower() == spec.lower():
            return path
    return None


def _hub_folder(spec: str) -> Path:
    """Hub model ``spec``'s config folder; offline or unreachable, one line that points at ``--config``."""
    try:
        return hub_config(spec)
    except DexError as err:
        shipped = example_config(spec)
        hint = (
            f"dex plan --config {shipped}"
            if shipped
            else f"dex plan --config FILE (examples: {EXAMPLE_CONFIGS})"
        )
        raise DexError(f"{err}; or plan from a config.json: {hint}") from None


@dataclass(frozen=True)
class RankPlan:
    rank: int
    gpu: int | None  # which GPU (None: CPU)
    layers: range
    weights: dict[str, int]  # layers, head (or its light rows), embeddings, other
    adapter: int
    kv: int
    work: int

    @property
    def total(self) -> int:
        return sum(self.weights.values()) + self.adapter + self.kv + self.work


def _adapter_bytes(spec: str, config, itemsize: int) -> int:
    """One adapter's bytes: 'none', 'trained' (m = 2h, as dex train-adapters makes them) or a file's (its
    header; ``run_plan`` turns 'auto' and 'default' into the shipped file)."""
    if spec == "none":
        return 0
    if spec == "trained":
        hidden, bottleneck = config.get_text_config().hidden_size, 2 * config.get_text_config().hidden_size
    else:
        meta = read_metadata(adapter_file(spec))  # a merged file's widest adapter: an upper bound per rank
        hidden, bottleneck = meta["identity"]["hidden_size"], max(meta["bottlenecks"].values())
    count = sum(int(torch.Size(s).numel()) for s in adapter_shapes(hidden, bottleneck).values())
    return count * itemsize


def plan_ranks(
    config,
    depths,
    dtype: torch.dtype,
    context: int,
    gpus: int | None,
    adapters: str = "none",
    proposal_rows: int | None = None,
    draft_rows: int = 0,
    requests: int = 1,
) -> list[RankPlan]:
    """Every explorer's memory for a run of exploration set ``depths`` in ``dtype`` with ``context`` tokens
    (prompt and answer), ``proposal_rows`` in the light heads (None: full heads), ``draft_rows`` chain rows;
    ``requests`` sharing rounds (``runtime.crew``): a KV lane and a batch of rows each."""
    shape = skeleton(config, dtype)
    itemsize = torch.empty((), dtype=dtype, device="meta").element_size()
    K, vocab = len(depths), shape.get_output_embeddings().weight.shape[0]
    light = proposal_rows is not None and proposal_rows < vocab
    text = config.get_text_config()
    heads = text.num_attention_heads
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    lattice = 2**K - 1 + draft_rows  # lattice nodes alive at most (unpruned), each one entry per stage
    batch = 2 ** (K - 1) + draft_rows  # the largest batch one explorer runs in a round
    region = bucket(lattice + batch, REGION_LEAST)  # a tree mask's lattice region; the cache keeps two spare
    capacity = cache_capacity(context + 2 * region)  # as Explorer.reset sizes it
    one = _adapter_bytes(adapters, config, itemsize)
    plans = []
    for k in range(K):
        part = StagePart(tuple(depths), k, tuple(range(proposal_rows)) if light and k < K - 1 else None)
        rows = proposal_rows if part.rows else vocab
        work = requests * (
            batch * rows * 4 * 2 + batch * capacity * itemsize + batch * 4 * text.intermediate_size * itemsize
        )
        plans.append(
            RankPlan(
                k,
                None if gpus is None else k % gpus,
                part.layers,
                part_bytes(shape, part),
                0 if k == K - 1 else one,
                requests * len(part.layers) * 2 * kv_heads * head_dim * capacity * itemsize,
                work,
            )
        )
    return plans


def gb(n: float) -> str:
    """Bytes as MB below 1 GB, else GB (decimal units, as GPU memory is sold)."""
    return f"{n / 1e6:.0f} MB" if n < 1e9 else f"{n / 1e9:.2f} GB" if n < 10e9 else f"{n / 1e9:.1f} GB"


def report(
    config,
    plans: list[RankPlan],
    dtype,
    context: int,
    gpu_memory: float | None,
    proposal_rows: int | None,
    requests: int = 1,
) -> tuple[list[str], bool]:
    """The plan's lines and whether every GPU fits (``requests``: sharing rounds, a KV cache each)."""
    text = config.get_text_config()
    lines = [
        f"{text.model_type}: {text.num_hidden_layers} layers, hidden {text.hidden_size}, vocabulary "
        f"{text.vocab_size}; K={len(plans)} explorers in {dtype_name(dtype)}; KV cache for "
        f"{f'{requests} requests of ' if requests > 1 else ''}{context} tokens "
        f"plus the lattice's rows; light heads: {proposal_rows or 'full'} rows",
        f"{'rank':>4} {'stage':>9} {'layers':>10} {'LM head':>10} {'embed':>10} {'adapter':>10} "
        f"{'KV cache':>10} {'work*':>10} {'total':>10}",
    ]
    for p in plans:
        w = p.weights
        span = f"{p.layers.start + 1}-{p.layers.stop}" if len(p.layers) else "-"
        lines.append(
            f"{p.rank:>4} {span:>9} {gb(w['layers']):>10} {gb(w['head']):>10} {gb(w['embeddings']):>10} "
            f"{gb(p.adapter):>10} {gb(p.kv):>10} {gb(p.work):>10} {gb(p.total):>10}"
        )
    lines.append("* work: float32 logits of the largest batch, tree masks and activations (an estimate)")
    gpus, fits = gpu_lines(plans, gpu_memory)
    return lines + gpus, fits


def gpu_lines(plans, gpu_memory: float | None) -> tuple[list[str], bool]:
    """Each GPU's total (its ranks' and the CUDA context) and whether it fits ``gpu_memory``; none on CPU."""
    lines, fits = [], True
    if plans[0].gpu is not None:
        for gpu in sorted({p.gpu for p in plans}):
            mine = [p for p in plans if p.gpu == gpu]
            need = sum(p.total for p in mine) + CUDA_CONTEXT
            ok = gpu_memory is None or need <= gpu_memory
            fits &= ok
            room = "" if gpu_memory is None else f" of {gb(gpu_memory)}: {'fits' if ok else 'does NOT fit'}"
            lines.append(
                f"GPU {gpu} (rank{'s' * (len(mine) > 1)} {', '.join(str(p.rank) for p in mine)}): "
                f"{gb(need)} with the CUDA context (about {gb(CUDA_CONTEXT)}){room}"
            )
    return lines, fits


@dataclass
class PlanConfig:
    model: str | None = option(
        None, "model spec, as for dex generate (a hub id fetches its config.json only); or give --config"
    )
    config: str | None = option(None, "a model's config.json instead of a model spec")
    explorers: int = option(DecoderOptions.explorers, "number of depth explorers K (uniform split)")
    depths: tuple[int, ...] | None = option(None, "exploration set, e.g. 20,40,60,80 (overrides --explorers)")
    dtype: str = option(
        "auto",
        "dtype: auto (what a run picks on the devices planned for: the checkpoint's "
        "half precision on GPUs, float32 on CPU), " + ", ".join(DTYPES),
    )
    context: int = option(4096, "tokens of context (prompt and answer) the KV cache holds")
    max_batch: int = option(
        1,
        "requests sharing rounds (dex serve --http --max-batch): a KV cache of --context tokens and rows each",
    )
    gpu_memory: str | None = option(
        None, "memory of one GPU, e.g. 80GB or 24GiB: says whether each GPU fits (exit 1 when one does not)"
    )
    gpus: int | None = option(
        None,
        "GPUs (default: one per explorer when --gpu-memory is given; fewer: the explorers take them in turn)",
    )
    adapters: str = option(
        "auto",
        "inducing adapters: auto (the shipped set for the default model, else none), "
        "none, default, trained (m = 2h, as dex train-adapters makes them) or a file",
    )
    proposal_vocab: int | str = option(
        "auto", f"rows of the non-final light heads: N, full, or auto ({DEFAULT_PROPOSAL_VOCAB})", kind=str
    )
    draft: str = option(
        "auto", "draft chains (their rows join the lattice's): auto, none, or bounds", kind=str
    )
    train: bool = option(
        False,
        "plan distributed adapter training instead (dex train-adapters --backend distributed/torchrun): per rank "
        "its stage, its adapters, their gradients and AdamW state, one micro-batch's activations and the teacher's "
        "targets",
    )
    train_depths: str = option(
        "uniform", "--train: adapter depths, as dex train-adapters --depths takes them", kind=str
    )
    batch: int = option(1, "--train: windows per micro-batch")
    seq_len: int = option(192, "--train: tokens per window")
    shortlist: int = option(0, "--train: tokens the loss scores (0: the whole vocabulary)")
    bottleneck: int | None = option(None, "--train: adapter bottleneck m (default 2 x hidden size)")

    def __post_init__(self):
        if (self.model is None) == (self.config is None):
            raise DexError("give a model (SPEC) or --config config.json, not both")
        self.explorers = integer(self.explorers, "explorers", 1)
        self.context = integer(self.context, "context", 1)
        self.max_batch = integer(self.max_batch, "max_batch", 1)
        self.gpus = None if self.gpus is None else integer(self.gpus, "gpus", 1)
        self.proposal_vocab = rows_option(self.proposal_vocab)
        self.draft = DraftBounds.parse(self.draft)
        if self.dtype not in ("auto", *DTYPES):
            raise DexError(f"dtype must be one of auto, {', '.join(DTYPES)}; got {self.dtype!r}")
        if self.gpu_memory is not None:
            parse_size(self.gpu_memory)
        self.batch, self.seq_len = integer(self.batch, "batch", 1), integer(self.seq_len, "seq_len", 1)
        self.shortlist = integer(self.shortlist, "shortlist", 0)
        self.bottleneck = None if self.bottleneck is None else integer(self.bottleneck, "bottleneck", 1)
        parse_adapter_depths(self.train_depths)


def run_plan(cfg: PlanConfig, log=quiet) -> tuple[list[str], bool]:
    """``dex plan`` (without ``--train``: ``training.plan.run_train_plan``): the plan's lines, and whether
    every GPU fits."""
    config = model_config(cfg.model, cfg.config, log)
    text = config.get_text_config()
    adapters = cfg.adapters
    if adapters in ("auto", "default"):  # the named model's shipped file (a plan reads its header only)
        shipped = shipped_adapters(cfg.model)
        adapters = str(shipped) if shipped else ("none" if adapters == "auto" else str(DEFAULT_ADAPTERS))
    if cfg.train:
        raise DexError("PlanConfig(train=True) is a training plan: dex_core.training.plan.run_train_plan")
    chosen = DecoderOptions(
        depths=cfg.depths, explorers=cfg.explorers, adapters="none" if adapters == "trained" else adapters
    )
    depths, _ = choose_depths(
        {"num_layers": text.num_hidden_layers}, chosen
    )  # a file's best set for K, if any
    gpus = cfg.gpus or (len(depths) if cfg.gpu_memory else None)
    dtype = resolve_dtype(cfg.dtype, "cpu" if gpus is None else "cuda", config)
    rows = proposal_rows(cfg.proposal_vocab, text.vocab_size)
    rows = None if rows >= text.vocab_size or len(depths) < 2 else rows
    draft = cfg.draft.rows if cfg.draft else 0
    plans = plan_ranks(config, depths, dtype, cfg.context, gpus, adapters, rows, draft, cfg.max_batch)
    return report(
        config,
        plans,
        dtype,
        cfg.context,
        None if cfg.gpu_memory is None else parse_size(cfg.gpu_memory),
        rows,
        cfg.max_batch,
    )
