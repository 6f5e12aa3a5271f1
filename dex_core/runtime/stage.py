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


def choose_round(run, plan, expanded: dict, masked: dict[int, list[int]]) -> dict[int, Choice]:
    """Every local explorer's choices of the round (``expanded``: stage index -> (hidden, logits) from ``expand``).
    Explorers that share a head (every non-final one on the sequential schedule) choose together: one set of
    kernels for all their rows, not one per explorer; what each row gets is what it would get alone."""
    groups, local = {}, {e.index: e for e in run.explorers}
    for k, (hidden, logits) in expanded.items():
        e = local[k]
        if logits is not None:
            key = (e.final, id(e.head), logits.shape[-1], logits.device)  # one device: they can be one batch
            groups.setdefault(key, []).append((e, hidden, logits))
    choices = {
        k: passed_on(run, k, plan.batches[k], hidden)
        for k, (hidden, logits) in expanded.items()
        if logits is None  # AR through the stages: only the last one chooses
    }
    for members in groups.values():
        choices.update(choose(run, plan, members, masked))
    return dict(sorted(choices.items()))


def choose(run, plan, members: list, masked: dict[int, list[int]]) -> dict[int, Choice]:
    """The tokens of explorers ``members`` ((explorer, hidden, logits), one head between them) for their batches
    (final stage: the model's own choice; else DECS-masked by ``masked``) and what the trace and pruning need of
    them, packed on the device for the link's one read of the round."""
    s, sampler, e = run.settings, run.sampler, members[0][0]
    batch = [n for m in members for n in plan.batches[m[0].index]]
    with run.clock.span("decode"):
        logits = members[0][2] if len(members) == 1 else torch.cat([m[2] for m in members])
        decision = sampler.decide(
            logits, [n.position for n in batch], e.final, [masked[n.id] for n in batch], e.head
        )
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
    parts = rows.split([len(plan.batches[m[0].index]) for m in members])
    return {
        m[0].index: Choice(part, None if m[0].final else m[1], _expand_seconds(run, m[0].index))
        for m, part in zip(members, parts)
    }


def passed_on(run, k: int, batch, hidden: torch.Tensor) -> Choice:
    """What stage ``k``, proposing nothing, produced: its rows for the next stage, no candidate (``NO_PROPOSAL``)."""
    rows = pack(len(batch), run.settings.trace_top, hidden.device, NO_PROPOSAL)
    return Choice(rows, hidden, _expand_seconds(run, k))


def _expand_seconds(run, k: int) -> Callable[[bool], float]:
    """Explorer ``k``'s expansion seconds this round, read once the link has read the round (``wait``: on CUDA,
    wait for the device if it has not passed the span yet; else what the device has passed, the rest later)."""
    return partial(run.clock.seconds, ("expand", k))
