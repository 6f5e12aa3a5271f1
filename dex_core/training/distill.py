"""What adapter training computes with a model, or with one stage of it (paper App. C.2): a stage's layers over
whole token windows (causal, no cache), the teacher's targets from the final logits, and one adapter's
distillation loss against them. Single-process training (``dex_core.training.train``) runs every layer as one
stage; each rank of distributed training (``dex_core.training.stage``) runs its own, and the final rank's
teacher log-probabilities travel to the others. Both compute a depth's loss with the same functions on the
same inputs, so their adapters agree.

Precision: the losses are computed in float32 (float64 for a float64 model: ``train_dtype``), whatever the
autocast of the matrix work; so are the adapters that training updates.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..model.explorer import causal_mask


def train_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype of the adapters and losses of training a model in ``dtype``: float32, float64 for float64."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def stage_forward(
    view, layers, hidden: torch.Tensor, keep=()
) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
    """Layers ``layers`` (model indices, in order) of ``view`` over windows ``hidden`` (B, T, h) at positions
    0..T-1, causal, without a cache. Returns the output and, for each depth in ``keep`` that these layers reach,
    the hidden state after that depth (depth d: after layer index d - 1)."""
    count, device = hidden.shape[1], hidden.device
    windows = {view.windows[i] for i in layers}
    masks = {w: causal_mask(0, count, w, hidden.dtype, device, count) for w in windows}
    positions = torch.arange(count, device=device)[None]
    rope = view.rotary(hidden, positions, {view.rope_types[i] for i in layers})
    kept = {}
    for i in layers:
        out = view.layers[i](
            hidden,
            attention_mask=masks[view.windows[i]],
            position_ids=positions,
            position_embeddings=rope[view.rope_types[i]],
            use_cache=False,
            **{view.cache_kwarg: None},
        )
        hidden = out[0] if isinstance(out, tuple) else out
        if i + 1 in keep:
            kept[i + 1] = hidden
    return hidden, kept


def final_logits(view, hidden: torch.Tensor, shortlist=None) -> torch.Tensor:
    """The teacher's logits from the last layer's output: the full head, or only ``shortlist``'s columns (a
    ``ProposalHead``: its rows of the LM head; the full head is never computed)."""
    if shortlist is None:
        return view.head(hidden)
    return shortlist.finish(F.linear(view.model.model.norm(hidden), shortlist.weight, shortlist.bias))


@dataclass
class Teacher:
    """The teacher's log-probabilities (B, T, V or N) in the training dtype, their probabilities, and its top
    token (B, T, 1) where a top-1 term needs it."""

    logp: torch.Tensor
    p: torch.Tensor
    best: torch.Tensor | None

    @classmethod
    def of(cls, logp: torch.Tensor, top1: float) -> Teacher:
        return cls(logp, logp.exp(), logp.argmax(-1, keepdim=True) if top1 else None)

    @classmethod
    def from_logits(cls, logits: torch.Tensor, dtype: torch.dtype, top1: float) -> Teacher:
        return cls.of(torch.log_softmax(logits.to(dtype), dim=-1), top1)


def adapter_loss(
    head, adapter, hidden: torch.Tensor, teacher: Teacher, top1: float, bf16: bool
) -> torch.Tensor:
    """One adapter's loss at its depth: KL(teacher || student) per token, tau = 1, minus ``top1`` x the student's
    log-probability of the teacher's top token; ``head`` makes the student's logits (the model's final norm and
    head, or a light head's). The matrix work under bf16 autocast when ``bf16``; the softmax in the teacher's
    dtype."""
    dtype = teacher.logp.dtype
    with torch.autocast(hidden.device.type, dtype=torch.bfloat16, enabled=bf16):
        logits = head(adapter(hidden.to(dtype)))
    student = torch.log_softmax(logits.to(dtype), dim=-1)
    loss = (teacher.p * (teacher.logp - student)).sum(-1).mean()
    if top1:
        loss = loss - top1 * student.gather(-1, teacher.best).mean()
    return loss
