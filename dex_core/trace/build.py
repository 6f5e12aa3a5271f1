"""How a run makes its trace events (``dex_core.trace.events``) from the runtime's records: the start from the
request and the run's settings, a round from the lattice's plan, nodes and commits, the end from the stats; token
text added where a tokenizer is (``with_text``)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

from .events import CommitRecord, EndEvent, Event, NodeRecord, RoundEvent, StartEvent, TokenEvent
from .schema import TRACE_VERSION


def start_event(
    request, view, settings=None, *, cost: dict | None = None, device: str | None = None, identity=None
) -> StartEvent:
    """The first event of a trace: ``request`` (a ``dex_core.runtime.request.Request``) on the model of ``view`` (a
    ``ModelView``: its layers, vocabulary and dtype), decoded by AR over the whole model, or by DEX as ``settings``
    (a ``RunSettings``) say. ``cost``: the weights of the model's parts (``ModelCost.weights()``); ``device``: where
    the token choices were made, recorded with the model's dtype (what ``dex verify`` reloads the model in and on);
    ``identity``: the model's (``adapters.identity``; default: ``view.identity()``, a skeleton's without its
    fingerprint).
    A request that is AR through the stages (``Request.pipeline``, recorded) proposes nothing before the last stage:
    no DECS, adapter, light head, pruning or draft chain, and their cost zero."""
    o, dex = request.options, settings is not None
    proposes = dex and not request.pipeline
    if cost is not None and not proposes:
        cost = {**cost, "adapter": 0.0, "proposal": 0.0}
    depths = list(settings.depths) if dex else [view.num_layers]
    return StartEvent(
        version=TRACE_VERSION,
        method="dex" if dex else "ar",
        explorers=len(depths),
        depths=depths,
        num_layers=view.num_layers,
        prompt=list(request.prompt),
        max_new_tokens=o.max_new_tokens,
        decs=proposes and settings.decs,
        sampling={"temperature": o.temperature, "top_k": o.top_k, "top_p": o.top_p, "seed": o.seed},
        adapter_depths=sorted(settings.adapters.depths) if proposes else [],
        proposal_vocab=(settings.proposal_vocab or view.vocab) if proposes else None,
        depth_choice=settings.depth_choice if dex else None,
        prune=settings.prune if proposes else None,
        draft=dataclasses.asdict(settings.draft) if proposes and settings.draft is not None else None,
        cost=cost,
        dtype=None if device is None else view.dtype_name,
        device=device,
        pipeline=request.pipeline,
        model=identity or view.identity(),
    )


def round_timings(expand: list[float], **seconds) -> dict:
    """A round's ``timings`` with its bookkeeping total and its projected K-device time: prefill + the slowest
    explorer's expansion + bookkeeping + decode (a projection from the sequential schedule's measurements; it leaves
    communication out)."""
    t = {"expand": list(expand), **seconds}
    t["bookkeeping"] = t["masks"] + t["plan"] + t["commit"] + t["collapse"]
    t["projected"] = t["prefill"] + max(t["expand"]) + t["bookkeeping"] + t["decode"]
    return t


def round_event(
    plan, state_after: int, alive: list[int], cut: list[int] | None, nodes, commits, collapse: dict | None
):
    """A round's event (its ``timings`` are added once the round's clock is read: ``dataclasses.replace``):
    ``alive`` the lattice's node ids after it, sorted; ``cut`` its cut chain nodes (None without draft chains)."""
    return RoundEvent(
        round=plan.round,
        state_before=plan.state_before,
        state_after=state_after,
        batches=[[n.id for n in b] for b in plan.batches],
        nodes=nodes,
        commits=commits,
        collapse=collapse,
        alive=alive,
        pruned=list(plan.pruned),
        chains=plan.chains if cut is not None else None,
        cut=cut,
    )


def token_event(index: int, position: int, token: int, seconds: float) -> TokenEvent:
    return TokenEvent(index=index, position=position, token=token, text=None, seconds=seconds)


def end_event(tokens: list[int], stats) -> EndEvent:
    return EndEvent(tokens=list(tokens), stop=stats.stop, stats=dataclasses.replace(stats))


def node_record(node, top: list, masked: list[int]) -> NodeRecord:
    """A lattice node once its stage chose: ``top`` its ``[token, probability]`` candidates, best first."""
    return NodeRecord(
        id=node.id,
        slot=node.slot,
        parent=node.parent,
        kind=node.kind,
        stage=node.stage,
        position=node.position,
        input_token=node.input_token,
        token=node.token,
        text=None,
        top=top,
        masked=list(masked),
    )


def commit_record(
    commit,
    index: int,
    margin: float | None = None,
    near_tie=None,
    tie_gap=None,
    logprob: float | None = None,
    top_logprobs: list | None = None,
) -> CommitRecord:
    """A round's commit (a lattice ``Commit``) with its final-depth top-2 margin when given, and its log-probability
    and likeliest alternatives when asked. An infinite margin (no second token left after top-k/top-p) is left out:
    JSON has no infinity; so is a log-probability of minus infinity (a token top-k/top-p could not pick)."""
    return CommitRecord(
        index=index,
        position=commit.position,
        token=commit.token,
        text=None,
        matched_stage=commit.matched_stage,
        anchor_nodes=commit.anchor_nodes,
        anchor_candidates=commit.anchor_candidates,
        drafted=commit.drafted,
        via=commit.via,
        margin=margin if margin is None or math.isfinite(margin) else None,
        near_tie=near_tie,
        tie_gap=tie_gap,
        logprob=logprob if logprob is None or math.isfinite(logprob) else None,
        top_logprobs=None if top_logprobs is None else [[t, v] for t, v in top_logprobs if math.isfinite(v)],
    )


def collapse_record(commits: list) -> dict | None:
    """The round's collapse after its commits (``(Commit, Collapse)`` pairs, in order): every committed anchor
    node, what each commit dropped, what survives the last one."""
    if not commits:
        return None
    last, kept = commits[-1]
    return {
        "committed": [n for c, _ in commits for n in c.anchor_nodes],
        "kept": kept.kept,
        "dropped": sorted(n for _, k in commits for n in k.dropped),
        "new_anchor": last.next_anchor,
    }


def with_text(event: Event, decode: Callable[[int], str | None], nodes: bool = True) -> Event:
    """``event`` with the text of its tokens (``decode(token)``; None for no proposal): the one place a trace gets
    text, whichever schedule made it (explorer processes hold no tokenizer). ``nodes``: every lattice node's and
    top candidate's too (what a drawing of the lattice shows), else the committed tokens' alone."""
    if isinstance(event, TokenEvent):
        return dataclasses.replace(event, text=decode(event.token))
    if not isinstance(event, RoundEvent):
        return event
    commits = [dataclasses.replace(c, text=decode(c.token)) for c in event.commits]
    if not nodes:
        return dataclasses.replace(event, commits=commits)
    texts = [
        dataclasses.replace(n, text=decode(n.token), top=[[t, p, decode(t)] for t, p, *_ in n.top])
        for n in event.nodes
    ]
    return dataclasses.replace(event, nodes=texts, commits=commits)
