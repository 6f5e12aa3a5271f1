"""``dex plan --train``: what each rank of distributed adapter training holds (``dex train-adapters --backend
distributed`` or ``torchrun``), from the model's configuration alone.

Rank k of K holds (``dex_core.tools.train_stage``):
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

from ..config import resolve_depths, stage_bounds
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
