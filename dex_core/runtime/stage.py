"""One explorer's share of a round: *expand* its batch of lattice nodes through its stage (tree masks, layers,
candidate logits) and *choose* their tokens (DECS masks, sampling), packed on the device (``Choice``: token,
probability, margin, top candidates) for the link, which reads every stage's of the round in one transfer.

Device rules: every tensor is made on the explorer's device; the spans of the run's clock (masks, the stage's
expansion, decode) are what the trace's timings report.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch

from ..algorithm.lattice import NO_PROPOSAL
from ..device import to_device
from ..shapes import bucket, padded
from .readback import Choice, pack


@dataclass(frozen=True)
class Batch:
    """One explorer's batch of a round on its way through its stage: the nodes' slots, where their input tokens
    sit, its mask table on the device (``Explorer.table``) and, at stage 0, the input tokens (rows,) there."""

    slots: list[int]
    inputs: list[int]
    table: torch.Tensor
    tokens: torch.Tensor | None


def prepare(run, plan) -> dict[int, Batch]:
    """Every local explorer's batch of the round (those with nodes), as a bucket of rows (``shapes.bucket``; the
    padding after the nodes): the host tables of them all, and stage 0's input tokens, in one transfer (of a bucket
    of values)."""
    host, parts = [], {}
    for e in run.explorers:
        batch = plan.batches[e.index]
        if not batch:
            continue
        rows, inputs, slots = bucket(len(batch)), [n.position - 1 for n in batch], [n.slot for n in batch]
        at = len(host)
        host += e.table(rows, slots, inputs, [run.lattice.slots[s].path for s in slots])
        end = len(host)
        if e.index == 0:
            host += padded([n.input_token for n in batch], rows, 0)
        parts[e.index] = (slots, inputs, at, end, rows)
    data = to_device(padded(host, bucket(len(host)), 0), run.view.device)  # a bucket: whichever stages ran
    return {
        k: Batch(slots, inputs, data[at:end], data[end : end + rows] if k == 0 else None)
        for k, (slots, inputs, at, end, rows) in parts.items()
    }


def expand(run, e, plan, batch: Batch) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Explorer ``e``'s ``batch`` through its stage: its output rows (rows, hidden), posted to the next explorer before
    its head runs, and the candidate logits (rows, vocab), or (rows, N) with a light head; None where the stage
    proposes nothing (a non-final stage of AR through the stages, ``Request.pipeline``)."""
    with run.clock.span(("expand", e.index)):
        if e.index == 0:
            h_in = run.view.embed(batch.tokens)
        else:
            h_in = run.link.inputs([n.parent for n in plan.batches[e.index]], bucket(len(batch.slots)))
        h_out = e.expand(h_in, batch.slots, batch.inputs, None, batch.table)  # (rows, hidden)
        if not e.final:
            run.link.post(plan, e.index, h_out)  # the rows travel while the head runs
        proposes = e.final or not run.request.pipeline
        return h_out, e.propose(h_out) if proposes else None


def choose_round(run, plan, expanded: dict, masked: dict[int, list[int]]) -> dict[int, Choice]:
    """Every local explorer's choices of the round (``expanded``: stage index -> (hidden, logits) from ``expand``).
    Explorers that share a head (every non-final one on the sequential schedule, and the final one too with full
    heads unless top-k/top-p filter the final depth) choose together: one set of kernels for all their rows, not
    one per explorer; what each row gets is what it would get alone."""
    groups, local = {}, {e.index: e for e in run.explorers}
    for k, (hidden, logits) in expanded.items():
        e = local[k]
        if logits is not None:
            apart = e.final and run.sampler.filtered  # filtered final scores: a group of their own
            key = (apart, id(e.head), logits.shape[-1], logits.device)  # one device: they can be one batch
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
    them, packed on the device for the link's one read of the round; every row of the buckets chosen (the padding
    repeats its batch's first position and masks nothing)."""
    s, sampler, e = run.settings, run.sampler, members[0][0]
    sizes, final = [m[2].shape[0] for m in members], any(m[0].final for m in members)
    total, positions, masks = bucket(sum(sizes)), [], []
    for (m, _, _), rows in zip(members, sizes):
        batch = plan.batches[m.index]
        if not sampler.greedy:  # the noise rows' positions
            positions += padded([n.position for n in batch], rows, batch[0].position)
        masks += padded([[] if m.final else masked[n.id] for n in batch], rows, [])
    with run.clock.span("decode"):
        logits = joined([m[2] for m in members], total)
        positions = padded(positions, total, positions[0]) if positions else None
        decs = None if all(m[0].final for m in members) else padded(masks, total, [])  # never the final depth
        decision = sampler.decide(logits, positions, final, decs, e.head)
        top = min(s.trace_top, logits.shape[-1])
        probs = top_probs = top_ids = None
        if s.prune is not None or top:  # unfiltered, at the sampling temperature; with a light head within it
            scaled = logits if sampler.greedy else logits.float() / sampler.temperature
            p = torch.softmax(scaled, dim=-1, dtype=torch.float32)
        if s.prune is not None:
            column = decision.tokens if e.head is None else e.head.index[decision.tokens]
            probs = p.gather(1, column[:, None])[:, 0]
        if top:
            top_probs, top_ids = p.topk(top, dim=-1)
            top_ids = top_ids if e.head is None else e.head.ids[top_ids]
        values, candidates = (probs, decision.margins, decision.gaps), (top_ids, top_probs) if top else None
        rows = pack(total, s.trace_top, logits.device, decision.tokens, values, candidates)
        asked = run.request.logprobs if final and e.head is None else None
        scored = None if asked is None else logprobs(logits, decision.tokens, asked)
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    return {
        m[0].index: Choice(
            rows,
            at,
            n,
            None if m[0].final else m[1],
            _expand_seconds(run, m[0].index),
            scored if m[0].final else None,
        )
        for m, at, n in zip(members, starts, sizes)
    }


def logprobs(logits: torch.Tensor, tokens: torch.Tensor, top: int) -> torch.Tensor:
    """(n, 1 + 2 ``top``) float64: each row's ``tokens`` log-probability under the unmodified logits (the model's
    own distribution, whatever the sampling), then the ``top`` likeliest ids and their log-probabilities, in the
    logits' dtype promoted to at least float32."""
    scores = torch.log_softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), dim=-1)
    values, ids = scores.topk(top, dim=-1)
    return torch.cat([scores.gather(1, tokens[:, None]), ids.to(scores.dtype), values], dim=1).double()


def joined(parts: list[torch.Tensor], total: int) -> torch.Tensor:
    """``parts`` (each (rows, columns)) one after the other in a (``total``, columns) tensor, zeros after them: the
    rows of every explorer that chooses with one head, in a bucket whatever the explorers that ran this round."""
    if len(parts) == 1 and parts[0].shape[0] == total:
        return parts[0]
    out, at = parts[0].new_zeros(total, parts[0].shape[1]), 0
    for part in parts:
        out[at : at + part.shape[0]].copy_(part)
        at += part.shape[0]
    return out


def passed_on(run, k: int, batch, hidden: torch.Tensor) -> Choice:
    """What stage ``k``, proposing nothing, produced: its rows for the next stage, no candidate (``NO_PROPOSAL``)."""
    rows = pack(hidden.shape[0], run.settings.trace_top, hidden.device, NO_PROPOSAL)
    return Choice(rows, 0, len(rows), hidden, _expand_seconds(run, k))


def _expand_seconds(run, k: int) -> Callable[[bool], float]:
    """Explorer ``k``'s expansion seconds this round, read once the link has read the round (``wait``: on CUDA,
    wait for the device if it has not passed the span yet; else what the device has passed, the rest later)."""
    return partial(run.clock.seconds, ("expand", k))
