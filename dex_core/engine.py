"""The DEX round loop, shared by every schedule (the schedules differ only in the link between explorers).

Each round: the lattice plans the nodes to compute, every explorer expands its batch (stage forward,
candidate proposal, token choice), the lattice records the candidates, and once the anchor has all K
stages the final-stage token is committed and every explorer's cache collapses onto the matched
subtree. ``run_rounds`` yields one trace event per round, then the end event.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import torch

from .explorer import Explorer
from .lattice import Lattice
from .models import ModelView
from .request import Request
from .results import GenerationStats
from .sampling import Sampler
from .trace import collapse_record, commit_record, end_event, node_record, round_event, round_timings
from .transport import StageOutput


def _expand_stage(e: Explorer, plan, lattice: Lattice, link, view: ModelView, sampler: Sampler,
                  decs: bool, trace_top: int, timings: dict, prune: int | None = None) -> StageOutput:
    """One explorer's work in one round: stage forward, candidate logits, token choice."""
    tic, batch = time.perf_counter(), plan.batches[e.index]
    if e.index == 0:
        h_in = view.embed(torch.tensor([n.input_token for n in batch], device=view.device))
    else:
        h_in = link.inputs([n.parent for n in batch])
    mask_before = e.mask_seconds
    h_out = e.expand(h_in, [n.slot for n in batch], [n.position - 1 for n in batch],
                     [lattice.slots[n.slot].path for n in batch])  # (n, hidden)
    if not e.final:
        link.post(plan, e.index, h_out)  # the rows travel while the head runs
    logits = e.propose(h_out)  # (n, vocab)
    masks = e.mask_seconds - mask_before
    timings["masks"] += masks
    seconds = time.perf_counter() - tic - masks
    tic = time.perf_counter()
    masked = [lattice.prior_tokens(n) if decs and not e.final else [] for n in batch]
    chosen = sampler.choose(logits, [n.position for n in batch], e.final, masked, e.head)
    picked, probs = chosen.tolist(), None
    if prune is not None or trace_top:  # unfiltered, at the sampling temperature; with a light head within it
        p = torch.softmax((logits if sampler.greedy else logits / sampler.temperature).float(), dim=-1)
    if prune is not None:  # the chosen candidate's probability
        column = chosen if e.head is None else e.head.index[chosen]
        probs = p.gather(1, column[:, None].to(p.device))[:, 0].tolist()
    if trace_top:
        top_probs, ids = p.topk(min(trace_top, logits.shape[-1]), dim=-1)
        ids = ids if e.head is None else e.head.ids[ids]
    else:
        top_probs, ids = torch.empty(len(batch), 0), torch.empty(len(batch), 0, dtype=torch.long)
    timings["decode"] += time.perf_counter() - tic
    return StageOutput(picked, ids, top_probs, None if e.final else h_out, seconds, probs)


def _node_records(plan, outputs: dict, lattice: Lattice, decs: bool, K: int, text) -> list[dict]:
    records = []
    for k, out in outputs.items():
        for i, n in enumerate(plan.batches[k]):
            top = [[int(t), round(float(p), 4)] + ([text(int(t))] if text else [])
                   for t, p in zip(out.top_ids[i], out.top_probs[i])]
            masked = lattice.prior_tokens(n) if decs and k < K - 1 else []
            records.append(node_record(n, text(n.token) if text else None, top, masked))
    return records


def run_rounds(view: ModelView, depths, explorers: list[Explorer], link, request: Request, decs: bool,
               trace_top: int, text=None, prune: int | None = None) -> Iterator[dict]:
    """The round loop, shared by every schedule: yields one event per round, then the end event.

    ``explorers`` are the ones this process runs (all of them in the sequential schedule, one per
    process in the distributed one); ``link`` moves hidden states and candidates between them.
    """
    K, prompt, o = len(depths), list(request.prompt), request.options
    sampler = Sampler(view.vocab, o.temperature, o.top_k, o.top_p, o.seed)
    stats = GenerationStats(K, list(depths), compute_seconds=[0.0] * K)
    start = time.perf_counter()
    for e in explorers:
        e.reset()
    link.reset()
    if len(prompt) > 1:
        link.prefill(explorers, view, prompt[:-1])
    stats.prefill_seconds = prefill = time.perf_counter() - start
    lattice = Lattice(K, prompt[-1], len(prompt))
    tokens: list[int] = []
    while True:
        t_round = time.perf_counter()
        t = {"communication": 0.0, "decode": 0.0, "masks": 0.0, "plan": 0.0, "commit": 0.0, "collapse": 0.0}
        plan = lattice.plan_round(prune)
        t["plan"] += time.perf_counter() - t_round
        outputs = {e.index: _expand_stage(e, plan, lattice, link, view, sampler, decs, trace_top, t, prune)
                   for e in explorers if plan.batches[e.index]}
        comm_before = link.comm_seconds
        outputs = link.exchange(plan, outputs)
        t["communication"] = link.comm_seconds - comm_before
        tic = time.perf_counter()
        lattice.record({n.id: tok for k, out in outputs.items() for n, tok in zip(plan.batches[k], out.tokens)},
                       {n.id: p for k, out in outputs.items() for n, p in zip(plan.batches[k], out.probs or [])})
        t["plan"] += time.perf_counter() - tic

        tic = time.perf_counter()
        records = _node_records(plan, outputs, lattice, decs, K, text)
        t["trace"] = time.perf_counter() - tic

        commit = collapse = None
        if lattice.ready():
            tic = time.perf_counter()
            cplan = lattice.commit()
            t["commit"] = time.perf_counter() - tic
            tic = time.perf_counter()
            for e in explorers:
                e.cache.commit(cplan.committed_slot, cplan.kept_slots)
            link.keep(lattice.nodes)
            sampler.forget_before(cplan.position + 1)
            t["collapse"] = time.perf_counter() - tic
            tokens.append(cplan.token)
            stats.matched_stages.append(cplan.matched_stage)
            commit = commit_record(cplan, len(tokens) - 1, text(cplan.token) if text else None)
            collapse = collapse_record(cplan)
            if cplan.token in request.eos:
                stats.stop = "eos"
        if link.cancelled:
            stats.stop = "cancelled"

        expand = [outputs[k].seconds if k in outputs else 0.0 for k in range(K)]
        timings = round_timings(expand, **t, prefill=prefill, round=time.perf_counter() - t_round)
        prefill = 0.0
        stats.add_round(timings, [len(b) for b in plan.batches])
        yield round_event(plan, lattice, records, commit, collapse, timings)
        if stats.stop != "length" or len(tokens) >= o.max_new_tokens:
            break
    stats.finish(len(tokens), time.perf_counter() - start)
    yield end_event(tokens, stats)
