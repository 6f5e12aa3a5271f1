"""The DEX round loop, shared by every schedule (the schedules differ only in the link between explorers).

Each round (paper Algorithm 1): the lattice plans the nodes to compute, every explorer expands its
batch (stage forward, candidate proposal, token choice), the lattice records the candidates, and once
the anchor has all K stages the final-stage token is committed and every explorer's cache collapses
onto the matched subtree. ``run_rounds`` yields one trace event per round, then the end event.

Device rules: every tensor is made on the explorer's device; what the host needs from a stage (its
tokens, probabilities, margins and top candidates) comes back in one transfer per explorer per round;
times come from a ``Clock`` (CUDA events on GPUs), not from the host's clock.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from .clock import Clock
from ..device import to_device
from ..model.explorer import Explorer
from ..algorithm.lattice import Lattice
from ..model.view import ModelView
from .request import Request
from .results import GenerationStats
from ..algorithm.sampling import Sampler
from ..trace.events import collapse_record, commit_record, end_event, node_record, round_event, round_timings
from .links import StageOutput


def _read_back(decision, probs, top_probs, top_ids) -> list[list[float]]:
    """Everything the host needs of a stage's choices, as rows of floats, in one device-to-host transfer:
    token, [probability], [margin, tie gap], [top ids..., top probabilities...]."""
    cols = [decision.tokens[:, None]]
    if probs is not None:
        cols.append(probs[:, None])
    if decision.margins is not None:
        cols += [decision.margins[:, None], decision.gaps[:, None]]
    cols += [top_ids, top_probs]
    return torch.cat([c.double() for c in cols], dim=1).tolist()


def _expand_stage(e: Explorer, plan, lattice: Lattice, link, view: ModelView, sampler: Sampler,
                  decs: bool, trace_top: int, clock: Clock, prune: int | None = None) -> StageOutput:
    """One explorer's work in one round: stage forward, candidate logits, token choice."""
    batch = plan.batches[e.index]
    positions = [n.position for n in batch]
    with clock.span("masks"):
        masks = e.masks([lattice.slots[n.slot].path for n in batch], [p - 1 for p in positions])
    with clock.span(("expand", e.index)):
        if e.index == 0:
            h_in = view.embed(to_device([n.input_token for n in batch], view.device))
        else:
            h_in = link.inputs([n.parent for n in batch])
        h_out = e.expand(h_in, [n.slot for n in batch], [p - 1 for p in positions], None, masks)  # (n, hidden)
        if not e.final:
            link.post(plan, e.index, h_out)  # the rows travel while the head runs
        logits = e.propose(h_out)  # (n, vocab), or (n, N) with a light head
    with clock.span("decode"):
        masked = [lattice.prior_tokens(n) if decs and not e.final else [] for n in batch]
        decision = sampler.decide(logits, positions, e.final, masked, e.head)
        probs = None
        top = min(trace_top, logits.shape[-1])
        top_probs = top_ids = torch.empty(len(batch), 0, device=logits.device)
        if prune is not None or top:  # unfiltered, at the sampling temperature; with a light head within it
            p = torch.softmax(logits.float() / (1.0 if sampler.greedy else sampler.temperature), dim=-1)
        if prune is not None:  # the chosen candidate's probability
            column = decision.tokens if e.head is None else e.head.index[decision.tokens]
            probs = p.gather(1, column[:, None])[:, 0]
        if top:
            top_probs, top_ids = p.topk(top, dim=-1)
            top_ids = top_ids if e.head is None else e.head.ids[top_ids]
        rows = _read_back(decision, probs, top_probs, top_ids)  # the one sync of this explorer's round
    at = 1 + (probs is not None)
    margins = [r[at] for r in rows] if decision.margins is not None else None
    skip = at + (2 if margins is not None else 0)
    return StageOutput([int(r[0]) for r in rows], [list(zip(map(int, r[skip:skip + top]), r[skip + top:]))
                                                   for r in rows],
                       None if e.final else h_out, clock.seconds(("expand", e.index)),
                       [r[1] for r in rows] if probs is not None else None,
                       margins, [r[at + 1] for r in rows] if margins is not None else None)


def _node_records(plan, outputs: dict, lattice: Lattice, decs: bool, K: int, text) -> list[dict]:
    records = []
    for k, out in outputs.items():
        for i, n in enumerate(plan.batches[k]):
            top = [[t, round(p, 4)] + ([text(t)] if text else []) for t, p in out.top[i]]
            masked = lattice.prior_tokens(n) if decs and k < K - 1 else []
            records.append(node_record(n, text(n.token) if text else None, top, masked))
    return records


def _margin(plan, outputs: dict, node_id: int) -> dict:
    """The committed final-depth node's top-1 minus top-2 score, its tie gap and whether it is a near-tie."""
    final = outputs.get(len(plan.batches) - 1) or StageOutput([], [], None, 0.0)
    for n, margin, gap in zip(plan.batches[-1], final.margins or [], final.tie_gaps or []):
        if n.id == node_id:
            return {"margin": margin, "near_tie": margin <= gap, "tie_gap": gap}
    return {}


def run_rounds(view: ModelView, depths, explorers: list[Explorer], link, request: Request, decs: bool,
               trace_top: int, text=None, prune: int | None = None, draft=None) -> Iterator[dict]:
    """The round loop, shared by every schedule: yields one event per round, then the end event.

    ``explorers`` are the ones this process runs (all of them in the sequential schedule, one per
    process in the distributed one); ``link`` moves hidden states and candidates between them. With
    ``draft`` (``DraftBounds``) the lattice runs draft chains and a round may commit several tokens.
    """
    K, prompt, o = len(depths), list(request.prompt), request.options
    sampler = Sampler(view.vocab, o.temperature, o.top_k, o.top_p, o.seed)
    stats = GenerationStats(K, list(depths), compute_seconds=[0.0] * K)
    clock = Clock(view.device)
    start = clock.stamp()
    for e in explorers:
        e.reset()
    link.reset()
    with clock.span("prefill"):
        if len(prompt) > 1:
            link.prefill(explorers, view, prompt[:-1])
    lattice = Lattice(K, prompt[-1], len(prompt), draft, prompt, len(prompt) + o.max_new_tokens - 1)
    tokens: list[int] = []
    while True:
        with clock.span("round"):
            with clock.span("plan"):
                plan = lattice.plan_round(prune)
            outputs = {e.index: _expand_stage(e, plan, lattice, link, view, sampler, decs, trace_top, clock, prune)
                       for e in explorers if plan.batches[e.index]}
            comm_before = link.comm_seconds
            outputs = link.exchange(plan, outputs)
            communication = link.comm_seconds - comm_before
            with clock.span("plan"):
                lattice.record({n.id: tok for k, out in outputs.items() for n, tok in zip(plan.batches[k], out.tokens)},
                               {n.id: p for k, out in outputs.items() for n, p in zip(plan.batches[k], out.probs or [])})
                if lattice.cut:  # chain slots their predecessor's candidates contradicted
                    link.keep(lattice.nodes)
            with clock.span("trace"):
                records = _node_records(plan, outputs, lattice, decs, K, text)
            commits, cplans = [], []
            while lattice.ready() and stats.stop == "length" and len(tokens) < o.max_new_tokens:  # along a chain
                with clock.span("commit"):
                    cplan = lattice.commit()
                with clock.span("collapse"):
                    for e in explorers:
                        e.cache.commit(cplan.committed_slot, cplan.kept_slots)
                    link.keep(lattice.nodes)
                    sampler.forget_before(cplan.position + 1)
                tokens.append(cplan.token)
                stats.matched_stages.append(cplan.matched_stage)
                stats.drafted += cplan.drafted
                cplans.append(cplan)
                commits.append(commit_record(cplan, len(tokens) - 1, text(cplan.token) if text else None,
                                             **_margin(plan, outputs, cplan.anchor_nodes[-1])))
                if cplan.token in request.eos:
                    stats.stop = "eos"
            if link.cancelled:
                stats.stop = "cancelled"
        t = {"prefill": 0.0, "plan": 0.0, "masks": 0.0, "decode": 0.0, "trace": 0.0, "commit": 0.0,
             "collapse": 0.0, **clock.read()}
        expand = [outputs[k].seconds if k in outputs else 0.0 for k in range(K)]
        timings = round_timings(expand, communication=communication,
                                **{k: v for k, v in t.items() if not isinstance(k, tuple)})
        stats.prefill_seconds += timings["prefill"]
        stats.add_round(timings, [len(b) for b in plan.batches])
        yield round_event(plan, lattice, records, commits, collapse_record(cplans), timings)
        if stats.stop != "length" or len(tokens) >= o.max_new_tokens:
            break
    stats.finish(len(tokens), clock.since(start))
    yield end_event(tokens, stats)
