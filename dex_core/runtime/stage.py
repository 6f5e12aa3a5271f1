"""One explorer's share of a round: *expand* its batch of lattice nodes through its stage (tree masks, layers,
candidate logits) and *choose* their tokens (DECS masks, sampling), packed on the device (``Choice``: token,
probability, margin, top candidates) for the link, which reads every stage's of the round in one transfer.

Device rules: every tensor is made on the explorer's device; the spans of the run's clock (masks, the stage's
expansion, decode) are what the trace's timings report.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch

from ..algorithm.lattice import NO_PROPOSAL
from ..device import to_device
from .readback import Choice, pack


def expand(run, e, plan) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Explorer ``e``'s batch through its stage: its output rows (n, hidden), posted to the next explorer before its
    head runs, and the candidate logits (n, vocab), or (n, N) with a light head; None where the stage proposes
    nothing (a non-final stage of AR through the stages, ``Request.pipeline``)."""
    batch = plan.batches[e.index]
    inputs = [n.position - 1 for n in batch]  # where each node's input token sits
    with run.clock.span("masks"):
        masks = e.masks([run.lattice.slots[n.slot].path for n in batch], inputs)
    with run.clock.span(("expand", e.index)):
        if e.index == 0:
            h_in = run.view.embed(to_device([n.input_token for n in batch], run.view.device))
        else:
            h_in = run.link.inputs([n.parent for n in batch])
        h_out = e.expand(h_in, [n.slot for n in batch], inputs, None, masks)  # (n, hidden)
        if not e.final:
            run.link.post(plan, e.index, h_out)  # the rows travel while the head runs
        proposes = e.final or not run.request.pipeline
        return h_out, e.propose(h_out) if proposes else None


def choose(run, e, batch, logits: torch.Tensor, masked: list[list[int]], hidden: torch.Tensor) -> Choice:
    """The batch's tokens (final stage: the model's own choice; else DECS-masked by ``masked``) and what the trace
    and pruning need of them, packed on the device for the link's one read of the round."""
    s, sampler = run.settings, run.sampler
    with run.clock.span("decode"):
        decision = sampler.decide(logits, [n.position for n in batch], e.final, masked, e.head)
        top = min(s.trace_top, logits.shape[-1])
        probs = top_probs = top_ids = None
        if s.prune is not None or top:  # unfiltered, at the sampling temperature; with a light head within it
            p = torch.softmax(logits.float() / (1.0 if sampler.greedy else sampler.temperature), dim=-1)
        if s.prune is not None:
            column = decision.tokens if e.head is None else e.head.index[decision.tokens]
            probs = p.gather(1, column[:, None])[:, 0]
        if top:
            top_probs, top_ids = p.topk(top, dim=-1)
            top_ids = top_ids if e.head is None else e.head.ids[top_ids]
        values, candidates = (probs, decision.margins, decision.gaps), (top_ids, top_probs) if top else None
        rows = pack(len(batch), s.trace_top, logits.device, decision.tokens, values, candidates)
    return Choice(rows, None if e.final else hidden, _expand_seconds(run, e))


def passed_on(run, e, batch, hidden: torch.Tensor) -> Choice:
    """What a stage that proposes nothing produced: its rows for the next stage, no candidate (``NO_PROPOSAL``)."""
    rows = pack(len(batch), run.settings.trace_top, hidden.device, NO_PROPOSAL)
    return Choice(rows, hidden, _expand_seconds(run, e))


def _expand_seconds(run, e) -> Callable[[bool], float]:
    """Explorer ``e``'s expansion seconds this round, read once the link has read the round (``wait``: on CUDA,
    wait for the device if it has not passed the span yet; else what the device has passed, the rest later)."""
    return partial(run.clock.seconds, ("expand", e.index))
