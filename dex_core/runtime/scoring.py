"""Scoring a prompt (``score_prompt``): the unmodified model's log-probability of each of its tokens given those
before it, from one teacher-forced forward (as ``dex verify`` checks tokens), and the distribution after it.

This is what evaluation harnesses ask of a served model (multiple-choice log-likelihood: lm-evaluation-harness's
``loglikelihood``): there is nothing to explore, so DEX runs no lattice here; the numbers are the model's own.
The forward runs once over the whole prompt; its logits exist ``SCORE_CHUNK`` positions at a time, so the memory
beyond the model's own forward is at most ``SCORE_CHUNK`` × vocabulary × 8 bytes (16 MB for a 49K vocabulary).
Log-probabilities are taken in the model's dtype promoted to at least float32 (float64 stays float64).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..config import DexError
from ..model.view import model_view

SCORE_CHUNK = 64  # positions whose logits exist at once


@dataclass(frozen=True)
class Scored:
    """A prompt's scores: ``logprobs[i]`` of token ``i`` given those before it (None for the first), ``top[i]`` the
    ``top`` likeliest tokens there, best first, as (id, log-probability) (empty for the first); ``next`` the same
    ``top`` after the whole prompt (what the model would say next, best first)."""

    logprobs: list[float | None]
    top: list[list[tuple[int, float]]]
    next: list[tuple[int, float]]


@torch.no_grad()
def score_prompt(model, ids: list[int], top: int = 1) -> Scored:
    """``ids`` scored by ``model`` (a loaded causal LM); ``top`` >= 1 alternatives a position."""
    view = model_view(model)
    if not ids or any(isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < view.vocab for t in ids):
        raise DexError(f"a prompt to score is a non-empty list of token ids in [0, {view.vocab})")
    given = torch.tensor([ids], device=view.device)
    hidden = model.model(input_ids=given, use_cache=False).last_hidden_state[0]  # after the final norm
    kind = torch.promote_types(view.dtype, torch.float32)
    logprobs, tops = [None], [[]]
    for start in range(0, len(ids), SCORE_CHUNK):  # row i of a chunk predicts token start + i + 1
        logits = view.finish(model.lm_head(hidden[start : start + SCORE_CHUNK])).to(kind)
        scores = torch.log_softmax(logits, dim=-1)
        following = torch.tensor(ids[start + 1 : start + 1 + len(scores)], device=view.device)
        logprobs += scores[: len(following)].gather(1, following[:, None])[:, 0].tolist()
        values, index = scores.topk(min(top, scores.shape[-1]), dim=-1)
        tops += [list(zip(i, v)) for i, v in zip(index.tolist(), values.tolist())]
    return Scored(logprobs, tops[:-1], tops[-1])
