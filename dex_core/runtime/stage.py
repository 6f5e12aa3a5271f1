"""One explorer's share of a round: its *batch* (``batch_of``: the mask table, to its device just before its step),
*expand* it through its stage (tree masks, layers, candidate logits) and *choose* the tokens (DECS masks, sampling),
packed on the device (``Choice``: token, probability, margin, top candidates) for the link, which reads every stage's
of the round in one transfer.

These functions take what they use: an explorer, its batch, its input rows, and for the choice ``Choosing`` (what a
run's token choice reads, made once at its start), never the whole run. The round loop (``runtime.engine``) times
them from outside, in its clock's spans (masks, the stage's expansion, decode). Device rules: every tensor is made on
the explorer's device.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch

from ..algorithm.lattice import NO_PROPOSAL, Node
from ..algorithm.sampling import Sampler
from ..device import to_device
from ..model.explorer import Explorer
from ..shapes import bucket, padded
from .clock import Clock
from .readback import Choice, pack


@dataclass(frozen=True)
class Batch:
    """One explorer's batch of a round on its way through its stage: the nodes' slots, where their input tokens
    sit, its mask table on the device (``Explorer.table``) and, at stage 0, the input tokens (rows,) there."""

    slots: list[int]
    inputs: list[int]
    rows: int  # the rows it runs as: a bucket of its nodes (``shapes.bucket``; the padding after them)
    table: torch.Tensor
    tokens: torch.Tensor | None


def batch_of(
    e: Explorer, nodes: list[Node], paths: list[tuple[int, ...]], device, rows: int | None = None
) -> Batch:
    """Explorer ``e``'s batch of ``nodes`` (``paths``: each node's slots from the anchor down, itself last) as a bucket
    of rows (``rows``: that many, a bucket at least theirs, when runs share the step): its host mask table and, at
    stage 0, the input tokens, to ``device`` in one transfer. Each explorer's goes just before its step, so on an
    accelerator the next explorer's is made while the device runs this one's."""
    rows, inputs, slots = rows or bucket(len(nodes)), [n.position - 1 for n in nodes], [n.slot for n in nodes]
    host = e.table(rows, slots, inputs, paths)
    end = len(host)
    if e.index == 0:
        host += padded([n.input_token for n in nodes], rows, 0)
    data = to_device(host, device)
    return Batch(slots, inputs, rows, data[:end], data[end:] if e.index == 0 else None)


def expand(
    e: Explorer,
    batch: Batch,
    hidden: torch.Tensor,
    post: Callable[[torch.Tensor], None] | None,
    proposes: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Explorer ``e``'s ``batch`` through its stage from its input rows ``hidden`` (rows, hidden): its output rows,
    handed to ``post`` (the link, for the next explorer) before its head runs, and the candidate logits (rows,
    vocab), or (rows, N) with a light head; None when it does not propose (a non-final stage of AR through the
    stages, ``Request.pipeline``)."""
    out = e.expand(hidden, batch.slots, batch.inputs, None, batch.table)  # (rows, hidden)
    if post is not None:
        post(out)  # the rows travel while the head runs
    return out, e.propose(out) if proposes else None


@dataclass(frozen=True)
class Choosing:
    """What a round's token choice reads of its run (made once, at its start)."""

    sampler: Sampler
    trace_top: int  # candidates a node's trace record keeps
    probs: bool  # each choice's probability wanted (a row budget ranks the rows by them)
    logprobs: int | None  # the request's: its final tokens' log-probabilities and that many alternatives
    clock: Clock  # the run's: each stage's expansion span

    def expand_seconds(self, k: int) -> Callable[[bool], float]:
        """Stage ``k``'s expansion seconds this round, read once the link has read the round (``wait``: on CUDA,
        wait for the device if it has not passed the span yet; else what the device has passed, the rest later)."""
        return partial(self.clock.seconds, ("expand", k))


def choose_round(
    how: Choosing, explorers: list[Explorer], plan, expanded: dict, masked: dict[int, list[int]]
) -> dict[int, Choice]:
    """Every local explorer's choices of the round (``expanded``: stage index -> (hidden, logits) from ``expand``).
    Explorers that share a head (every non-final one on the sequential schedule, and the final one too with full
    heads unless top-k/top-p filter the final depth) choose together: one set of kernels for all their rows, not
    one per explorer; what each row gets is what it would get alone."""
    groups, local = {}, {e.index: e for e in explorers}
    for k, (hidden, logits) in expanded.items():
        e = local[k]
        if logits is not None:
            apart = e.final and how.sampler.filtered  # filtered final scores: a group of their own
            key = (apart, id(e.head), logits.shape[-1], logits.device)  # one device: they can be one batch
            groups.setdefault(key, []).append((e, hidden, logits))
    choices = {
        k: passed_on(how, k, hidden)
        for k, (hidden, logits) in expanded.items()
        if logits is None  # AR through the stages: only the last one chooses
    }
    for members in groups.values():
        choices.update(choose(how, plan, members, masked))
    return dict(sorted(choices.items()))


def choose(how: Choosing, plan, members: list, masked: dict[int, list[int]]) -> dict[int, Choice]:
    """The tokens of explorers ``members`` ((explorer, hidden, logits), one head between them) for their batches
    (final stage: the model's own choice; else DECS-masked by ``masked``) and what the trace and pruning need of
    them, packed on the device for the link's one read of the round; every row of the buckets chosen (the padding
    repeats its batch's first position and masks nothing)."""
    sampler, e = how.sampler, members[0][0]
    sizes, final = [m[2].shape[0] for m in members], any(m[0].final for m in members)
    total, positions, masks = bucket(sum(sizes)), [], []
    for (m, _, _), rows in zip(members, sizes):
        batch = plan.batches[m.index]
        if not sampler.greedy:  # the noise rows' positions
            positions += padded([n.position for n in batch], rows, batch[0].position)
        masks += padded([[] if m.final else masked[n.id] for n in batch], rows, [])
    logits = joined([m[2] for m in members], total)
    positions = padded(positions, total, positions[0]) if positions else None
    decs = None if all(m[0].final for m in members) else padded(masks, total, [])  # never the final depth
    rows, scored = packed(how, e.head, logits, sampler.decide(logits, positions, final, decs, e.head), final)
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    return {
        m[0].index: Choice(
            rows,
            at,
            n,
            None if m[0].final else m[1],
            how.expand_seconds(m[0].index),
            scored if m[0].final else None,
        )
        for m, at, n in zip(members, starts, sizes)
    }


def packed(how: Choosing, head, logits: torch.Tensor, decision, final: bool) -> tuple:
    """The rows ``decision`` (the sampler's, over ``logits``) packs for the link's read (``readback.pack``), and the
    final stage's log-probabilities when the request asks (else None). ``head``: the light head the logits are
    over, or None (the full one)."""
    sampler = how.sampler
    top = min(how.trace_top, logits.shape[-1])
    probs = top_probs = top_ids = None
    if how.probs or top:  # unfiltered, at the sampling temperature; with a light head within it
        scaled = logits if sampler.greedy else logits.float() / sampler.temperature
        p = torch.softmax(scaled, dim=-1, dtype=torch.float32)
    if how.probs:
        column = decision.tokens if head is None else head.index[decision.tokens]
        probs = p.gather(1, column[:, None])[:, 0]
    if top:
        top_probs, top_ids = p.topk(top, dim=-1)
        top_ids = top_ids if head is None else head.ids[top_ids]
    values, candidates = (probs, decision.margins, decision.gaps), (top_ids, top_probs) if top else None
    rows = pack(logits.shape[0], how.trace_top, logits.device, decision.tokens, values, candidates)
    asked = how.logprobs if final and head is None else None
    return rows, None if asked is None else logprobs(logits, decision.tokens, asked)


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


def passed_on(how: Choosing, k: int, hidden: torch.Tensor) -> Choice:
    """What stage ``k``, proposing nothing, produced: its rows for the next stage, no candidate (``NO_PROPOSAL``)."""
    rows = pack(hidden.shape[0], how.trace_top, hidden.device, NO_PROPOSAL)
    return Choice(rows, 0, len(rows), hidden, how.expand_seconds(k))
