"""Trace records: the only interface between ``dex_core`` and the viewers (``visualize``, ``app``).

A trace is a list of plain JSON-serializable events, in order. Schema version 1:

``{"event": "start", "version", "method", "explorers", "depths", "num_layers", "prompt",
   "max_new_tokens", "sampling": {"temperature", "top_k", "top_p", "seed"}, "decs", "adapter_depths"}``
    ``method`` is "dex" or "ar"; ``prompt`` the prompt token ids; ``adapter_depths`` the depths whose
    candidates went through an inducing adapter (absent in traces made before it was recorded);
    ``proposal_vocab`` (DEX only; absent in older traces) the rows of the non-final stages' proposal
    heads, the vocabulary size when they are full; ``depth_choice`` (DEX only) how the depths were
    chosen: "given", "uniform split", or the best set stored with the adapters; ``prune`` (DEX, only
    when the run had one) its row budget B: rows per stage a round at most; ``draft`` (DEX, only with draft chains)
    their bounds ``{"ngram", "min_ngram", "length", "chains", "rows", "gate"}`` (``DraftBounds``); ``cost`` (DEX)
    the weights of the model's parts in layer-equivalents (``dex_core.model.cost.ModelCost``): ``{"head",
    "adapter", "proposal"}`` (``proposal`` null when the non-final heads are full), so a viewer can count all the work;
    ``dtype`` (absent in older traces) the model's dtype ("float32", "bfloat16", ...) and ``device``
    where it ran ("cpu", "cuda:0"), which ``dex verify`` reloads it in and on; ``model`` (absent in older
    traces) the model's identity ``{"model_type", "num_layers", "hidden_size", "vocab_size", "fingerprint"}``
    (``dex_core.model.adapters.identity``; no fingerprint where the embeddings were not loaded), which
    ``dex verify`` compares with the model it is given.

``{"event": "round", "round", "state_before", "state_after", "batches", "nodes", "commit",
   "collapse", "alive", "timings"}`` — one per explorer round (DEX only).
    ``batches[k]``: ids of the nodes explorer k computed. ``nodes``: the new exploration tokens,
    each ``{"id", "slot", "parent", "kind" ("root" | "depth" | "position" | "chain"), "stage", "position"
    (absolute position of the predicted token), "input_token", "token", "text" (null without a
    tokenizer), "top" ([[token, probability, text], ...] at this depth, best first, text only with a
    tokenizer; empty when ``trace_top`` is 0), "masked" (DECS-masked ids)}``. Node ids are unique within a trace.
    ``commit`` (or null): ``{"index", "position", "token", "text", "matched_stage",
    "anchor_nodes", "anchor_candidates"}``, and (absent in older traces) ``margin``: the committed
    final-depth node's top-1 minus top-2 score in float32 (noise included when sampling; absent when no
    second token was left), ``near_tie``: whether that margin is within ``sampling.tie_gap`` of the
    dtype, and ``tie_gap``: that gap. ``collapse`` (or null): ``{"committed", "kept",
    "dropped", "new_anchor"}`` (node ids). ``alive``: node ids in the lattice after the round.
    ``pruned`` (absent in older traces): nodes whose position child lattice pruning did not start.
    Draft chains (absent in older traces): ``commits`` lists every commit of the round in order
    (``commit`` is its first; a chain commits several), each with ``drafted`` (its slot's input was a
    looked-up token) and ``via`` ("chain" | "position" | "root": how the next anchor was found), and
    ``collapse`` is the round's whole collapse (every committed anchor node, all dropped, what survives
    the last commit). Node kind "chain" marks a chain slot's stage-0 node; ``chains`` (with drafts on)
    lists each chain started this round as its stage-0 node ids, ``cut`` the nodes dropped because the
    slot before them proposed another token. Read commits with ``round_commits(event)``.
    ``state_before``/``state_after``: the FSM state q (anchor stages computed) around the round.
    ``timings`` (seconds): ``{"expand": [per explorer], "communication", "decode", "masks", "plan",
    "commit", "collapse", "trace", "prefill" (the prompt's pass, on the first round only), "round",
    "bookkeeping" (masks + plan + commit + collapse), "projected"}``. ``projected`` is the round's time
    on K devices: prefill + the slowest explorer's expansion + bookkeeping + decode (a projection from
    the sequential schedule's measurements; it leaves communication out).

``{"event": "token", "index", "position", "token", "text", "seconds"}`` — one per token (AR only).

``{"event": "end", "tokens", "stop" ("eos" | "length" | "cancelled"), "stats"}`` — ``stats`` as in
    ``GenerationStats.to_dict()``; "cancelled" when the caller stopped a distributed stream early.

A saved trace is ``{"format": "dex-trace", "version", "meta" (strings and numbers, such as the model),
"events"}``; a trace stopped early has no end event. ``load_trace`` validates what it reads against this schema
(``dex_core.trace.validate``: the JSON Schemas and size limits of ``dex_core.trace.schema``, the cross-references).
Code that reads a trace rather than draws it parses it once into typed events (``dex_core.trace.typed``).
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

from ..config import DexError
from .schema import TRACE_FORMAT, TRACE_LIMITS, TRACE_VERSION, TraceLimits
from .validate import parse_trace


def save_trace(path: str | Path, events: list[dict], meta: dict | None = None) -> None:
    """Write events (and optional metadata such as the model name) as one JSON document."""
    doc = {"format": TRACE_FORMAT, "version": TRACE_VERSION, "meta": meta or {}, "events": list(events)}
    Path(path).write_text(json.dumps(doc, separators=(",", ":")))


def load_trace(path: str | Path, limits: TraceLimits = TRACE_LIMITS) -> tuple[list[dict], dict]:
    """Read and validate a saved trace (``dex_core.trace.schema``); returns ``(events, meta)``.

    A missing, oversized, foreign, newer or malformed file raises ``DexError``; the size is checked
    before the file is read, and messages name the file only by its base name.
    """
    path = Path(path)
    try:
        if path.stat().st_size > limits.max_file_bytes:
            raise DexError(
                f"the trace is larger than {limits.max_file_bytes} bytes (TraceLimits.max_file_bytes)"
            )
        with path.open("rb") as f:
            data = f.read(limits.max_file_bytes + 1)
    except OSError:
        raise DexError(
            f"cannot read the trace file {path.name!r}; give the path of a JSON file saved by DEX"
        ) from None
    return parse_trace(data, limits)


def start_event(
    request, view, settings=None, *, cost: dict | None = None, device: str | None = None, identity=None
) -> dict:
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
    extra = {
        k: v
        for k, v in (
            ("proposal_vocab", (settings.proposal_vocab or view.vocab) if proposes else None),
            ("depth_choice", settings.depth_choice if dex else None),
            ("prune", settings.prune if proposes else None),
            (
                "draft",
                dataclasses.asdict(settings.draft) if proposes and settings.draft is not None else None,
            ),
            ("cost", cost),
            ("dtype", None if device is None else view.dtype_name),
            ("device", device),
            ("pipeline", request.pipeline or None),
            ("model", identity or view.identity()),
        )
        if v is not None
    }
    depths = list(settings.depths) if dex else [view.num_layers]
    return {
        "event": "start",
        "version": TRACE_VERSION,
        "method": "dex" if dex else "ar",
        "explorers": len(depths),
        "depths": depths,
        "num_layers": view.num_layers,
        "prompt": list(request.prompt),
        **extra,
        "max_new_tokens": o.max_new_tokens,
        "decs": proposes and settings.decs,
        "adapter_depths": sorted(settings.adapters.depths) if proposes else [],
        "sampling": {"temperature": o.temperature, "top_k": o.top_k, "top_p": o.top_p, "seed": o.seed},
    }


def round_timings(expand: list[float], **seconds) -> dict:
    """A round's ``timings`` with its bookkeeping total and its projected K-device time."""
    t = {"expand": list(expand), **seconds}
    t["bookkeeping"] = t["masks"] + t["plan"] + t["commit"] + t["collapse"]
    t["projected"] = t["prefill"] + max(t["expand"]) + t["bookkeeping"] + t["decode"]
    return t


def round_event(
    plan,
    lattice,
    records: list[dict],
    commits: list[dict],
    collapse: dict | None,
    timings: dict | None = None,
) -> dict:
    """A round's event (``timings`` may be added once the round's clock is read)."""
    extra = {"chains": plan.chains, "cut": list(lattice.cut)} if lattice.chains is not None else {}
    return {
        "event": "round",
        "round": plan.round,
        "state_before": plan.state_before,
        "state_after": lattice.state,
        "batches": [[n.id for n in b] for b in plan.batches],
        "nodes": records,
        "commit": commits[0] if commits else None,
        "commits": commits,
        "collapse": collapse,
        "alive": sorted(lattice.nodes),
        "pruned": list(plan.pruned),
        **extra,
        "timings": timings,
    }


def round_commits(event: dict) -> list[dict]:
    """A round event's commits in order (several when a draft chain committed; traces made before draft
    chains have only ``commit``)."""
    return event.get("commits") or ([event["commit"]] if event.get("commit") else [])


def token_event(index: int, position: int, token: int, text: str | None, seconds: float) -> dict:
    return {
        "event": "token",
        "index": index,
        "position": position,
        "token": token,
        "text": text,
        "seconds": seconds,
    }


def end_event(tokens: list[int], stats) -> dict:
    return {"event": "end", "tokens": list(tokens), "stop": stats.stop, "stats": stats.to_dict()}


def node_record(node, text: str | None, top: list, masked: list[int]) -> dict:
    return {
        "id": node.id,
        "slot": node.slot,
        "parent": node.parent,
        "kind": node.kind,
        "stage": node.stage,
        "position": node.position,
        "input_token": node.input_token,
        "token": node.token,
        "text": text,
        "top": top,
        "masked": list(masked),
    }


def commit_record(
    commit,
    index: int,
    text: str | None,
    margin: float | None = None,
    near_tie: bool | None = None,
    tie_gap: float | None = None,
) -> dict:
    """A round's commit (a lattice ``Commit``); ``margin``/``near_tie``/``tie_gap`` (the final-depth top-2 margin)
    when given. An infinite margin (no second token left after top-k/top-p) is left out: JSON has no infinity."""
    margin = margin if margin is None or math.isfinite(margin) else None
    extra = {
        k: v for k, v in (("margin", margin), ("near_tie", near_tie), ("tie_gap", tie_gap)) if v is not None
    }
    return {
        "index": index,
        "position": commit.position,
        "token": commit.token,
        "text": text,
        "matched_stage": commit.matched_stage,
        "anchor_nodes": commit.anchor_nodes,
        "anchor_candidates": commit.anchor_candidates,
        "drafted": commit.drafted,
        "via": commit.via,
        **extra,
    }


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
