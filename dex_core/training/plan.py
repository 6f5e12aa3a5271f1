"""``dex plan --train``: what each rank of distributed adapter training holds (``dex train-adapters --backend
distributed`` or ``torchrun``), from the model's configuration alone.

Rank k of K holds (``dex_core.training.stage``):
- its part of the model in the weights' dtype: the loader's own count (``stage_load.part_bytes``: its layers of the
  uniform split, the final norm, the LM head or, with a shortlist loss, only its rows on non-final ranks, rank 0
  the embeddings);
- the adapters of the depths inside its stage, in float32: the parameters, their gradients and AdamW's two moments
  (16 bytes a parameter);
- one micro-batch's activations (an estimate, float32 where training computes in float32, B = batch, T = seq-len,
  h = hidden, m = bottleneck, i = intermediate size, V = the loss's vocabulary, the shortlist or the whole one):
  the rows in and out of the stage, those sent and not yet taken (K micro-batches) and those kept at its a
  adapter depths for the K - k micro-batches in flight, B·T·h·(2 + K + (K - k)·a) in the weights' dtype; one
  layer's forward work, B·T·(3i + 4h) in that dtype plus B·heads·T² attention weights; the adapters' autograd
  graphs, a·B·T·(4h + 2m)·4 and a·3·B·T·V·4 (logits, log-probabilities and the KL's terms);
- the teacher's targets: 2·B·T·V·4 (log-probabilities and probabilities) on every rank; on the final rank
  (K + 1)·B·T·V·4 (its logits and the K micro-batches' targets sent and not yet taken by every rank).
On a GPU add the CUDA context (about 0.5 GB).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..analysis.plan import PlanConfig, gb, gpu_lines, model_config, parse_size
from ..config import resolve_depths, stage_bounds
from ..device import dtype_name, resolve_dtype
from ..log import quiet
from ..model.adapters import adapter_shapes
from ..model.depth_grids import adapter_depths
from ..model.stage_load import StagePart, part_bytes, skeleton

OPTIMIZER_COPIES = 3  # per adapter parameter beyond itself: its gradient and AdamW's two moments


@dataclass(frozen=True)
class TrainRankPlan:
    rank: int
    gpu: int | None
    layers: range
    depths: tuple[int, ...]  # adapter depths inside the stage
    weights: dict[str, int]  # layers, head (or its shortlist's rows), embeddings, other
    adapters: int  # their parameters, float32
    optimizer: int  # gradients and AdamW's moments
    activations: int  # one micro-batch's rows, layer work and autograd graphs
    teacher: int  # the teacher's targets (and the final rank's logits)

    @property
    def total(self) -> int:
        return sum(self.weights.values()) + self.adapters + self.optimizer + self.activations + self.teacher


def plan_training(
    config,
    K: int,
    dtype: torch.dtype,
    depths,
    batch: int = 1,
    seq_len: int = 192,
    shortlist: int = 0,
    bottleneck: int | None = None,
    gpus: int | None = None,
) -> list[TrainRankPlan]:
    """Every rank's bytes for training adapters at ``depths`` (a list or a named grid) on K ranks."""
    text = config.get_text_config()
    shape, L = skeleton(config, dtype), text.num_hidden_layers
    h, m = text.hidden_size, bottleneck or 2 * text.hidden_size
    bounds, depths = resolve_depths(L, explorers=K), adapter_depths(depths, L)
    itemsize = torch.empty((), dtype=dtype, device="meta").element_size()
    vocab = shape.get_output_embeddings().weight.shape[0]
    rows = shortlist if 0 < shortlist < vocab else vocab
    params = sum(int(torch.Size(s).numel()) for s in adapter_shapes(h, m).values())
    B, T = batch, seq_len
    plans = []
    for k in range(K):
        start, stop = stage_bounds(bounds, k)
        mine = tuple(d for d in depths if start < d <= stop)
        light = tuple(range(rows)) if rows < vocab and k < K - 1 else None
        a, final = len(mine), k == K - 1
        work = (
            B * T * (3 * text.intermediate_size + 4 * h) * itemsize
            + B * text.num_attention_heads * T * T * itemsize
        )
        graphs = a * B * T * (4 * h + 2 * m) * 4 + a * 3 * B * T * rows * 4
        plans.append(
            TrainRankPlan(
                rank=k,
                gpu=None if gpus is None else k % gpus,
                layers=range(start, stop),
                depths=mine,
                weights=part_bytes(shape, StagePart(bounds, k, light)),
                adapters=a * params * 4,
                optimizer=a * params * 4 * OPTIMIZER_COPIES,
                activations=B * T * h * (2 + K + (K - k) * a) * itemsize + work + graphs,
                teacher=(K + 1 if final else 2) * B * T * rows * 4,
            )
        )
    return plans


def training_lines(
    config, plans: list[TrainRankPlan], dtype, batch: int, seq_len: int, rows: str
) -> list[str]:
    """The table of a training plan (``plan_training``)."""
    text = config.get_text_config()
    lines = [
        f"{text.model_type}: {text.num_hidden_layers} layers, hidden {text.hidden_size}, vocabulary "
        f"{text.vocab_size}; adapter training on K={len(plans)} ranks, weights in {dtype_name(dtype)}"
        f", micro-batches of {batch} x {seq_len} tokens, loss over {rows}",
        f"{'rank':>4} {'stage':>9} {'adapters at':>14} {'weights':>10} {'adapters':>10} {'grad+AdamW':>10} "
        f"{'activ.*':>10} {'teacher':>10} {'total':>10}",
    ]
    for p in plans:
        span = f"{p.layers.start + 1}-{p.layers.stop}"
        at = ",".join(map(str, p.depths)) or "-"
        lines.append(
            f"{p.rank:>4} {span:>9} {at:>14} {gb(sum(p.weights.values())):>10} {gb(p.adapters):>10} "
            f"{gb(p.optimizer):>10} {gb(p.activations):>10} {gb(p.teacher):>10} {gb(p.total):>10}"
        )
    lines.append(
        "* activations: one micro-batch's rows, layer work and the adapters' autograd graphs (an estimate)"
    )
    return lines


def run_train_plan(cfg: PlanConfig, log=quiet) -> tuple[list[str], bool]:
    """``dex plan --train``: the training plan's lines, and whether every GPU fits."""
    config = model_config(cfg.model, cfg.config, log)
    text = config.get_text_config()
    K = len(cfg.depths) if cfg.depths else cfg.explorers
    gpus = cfg.gpus or (K if cfg.gpu_memory else None)
    dtype = resolve_dtype(cfg.dtype, "cpu" if gpus is None else "cuda", config)
    plans = plan_training(
        config, K, dtype, cfg.train_depths, cfg.batch, cfg.seq_len, cfg.shortlist, cfg.bottleneck, gpus
    )
    rows = f"{cfg.shortlist} tokens" if 0 < cfg.shortlist < text.vocab_size else "the whole vocabulary"
    lines = training_lines(config, plans, dtype, cfg.batch, cfg.seq_len, rows)
    extra, fits = gpu_lines(plans, None if cfg.gpu_memory is None else parse_size(cfg.gpu_memory))
    return lines + extra, fits
