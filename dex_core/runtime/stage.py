"""One explorer's share of a round: *expand* its batch of lattice nodes through its stage (tree masks, layers,
candidate logits) and *choose* their tokens (DECS masks, sampling), then read back what the host needs of its
choices in one device-to-host transfer (``ReadBack``: token, probability, margin, top candidates).

Device rules: every tensor is made on the explorer's device; the spans of the run's clock (masks, the stage's
expansion, decode) are what the trace's timings report.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..algorithm.lattice import NO_PROPOSAL
from ..device import to_device
from .links import StageOutput


@dataclass(frozen=True)
class ReadBack:
    """The columns of one stage's read-back, in order: token, [probability] (with pruning), [margin, tie gap]
    (final stage), ``top`` candidate ids, then their probabilities — every value as a float64."""

    prob: bool
    margin: bool
    top: int

    def pack(self, decision, probs, top_ids, top_probs) -> torch.Tensor:
        """(n, columns) float64 on the device (one transfer's worth)."""
        cols = [decision.tokens[:, None]]
        if self.prob:
            cols.append(probs[:, None])
        if self.margin:
            cols += [decision.margins[:, None], decision.gaps[:, None]]
        cols += [top_ids, top_probs]
        return torch.cat([c.double() for c in cols], dim=1)

    def unpack(self, rows: list[list[float]], hidden, seconds: float) -> StageOutput:
        at = 1 + self.prob  # the first column after token and probability
        end = at + 2 * self.margin
        return StageOutput(
            tokens=[int(r[0]) for r in rows],
            top=[list(zip(map(int, r[end : end + self.top]), r[end + self.top :])) for r in rows],
            hidden=hidden,
            seconds=seconds,
            probs=[r[1] for r in rows] if self.prob else None,
            margins=[r[at] for r in rows] if self.margin else None,
            tie_gaps=[r[at + 1] for r in rows] if self.margin else None,
        )


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


def choose(run, e, batch, logits: torch.Tensor, masked: list[list[int]], hidden: torch.Tensor) -> StageOutput:
    """The batch's tokens (final stage: the model's own choice; else DECS-masked by ``masked``) and what the trace
    and pruning need of them, read back in one transfer."""
    s, sampler = run.settings, run.sampler
    with run.clock.span("decode"):
        decision = sampler.decide(logits, [n.position for n in batch], e.final, masked, e.head)
        read = ReadBack(
            prob=s.prune is not None,
            margin=decision.margins is not None,
            top=min(s.trace_top, logits.shape[-1]),
        )
        probs = top_probs = top_ids = torch.empty(len(batch), 0, device=logits.device)
        if read.prob or read.top:  # unfiltered, at the sampling temperature; with a light head within it
            p = torch.softmax(logits.float() / (1.0 if sampler.greedy else sampler.temperature), dim=-1)
        if read.prob:
            column = decision.tokens if e.head is None else e.head.index[decision.tokens]
            probs = p.gather(1, column[:, None])[:, 0]
        if read.top:
            top_probs, top_ids = p.topk(read.top, dim=-1)
            top_ids = top_ids if e.head is None else e.head.ids[top_ids]
        rows = read.pack(
            decision, probs, top_ids, top_probs
        ).tolist()  # the one sync of this explorer's round
    return read.unpack(rows, None if e.final else hidden, run.clock.seconds(("expand", e.index)))


def passed_on(run, e, batch, hidden: torch.Tensor) -> StageOutput:
    """What a stage that proposes nothing produced: its rows for the next stage, no candidate (``NO_PROPOSAL``)."""
    n = len(batch)
    return StageOutput(
        [NO_PROPOSAL] * n, [[] for _ in range(n)], hidden, run.clock.seconds(("expand", e.index))
    )
