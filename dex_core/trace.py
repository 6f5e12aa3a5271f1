"""Trace records: the only interface between ``dex_core`` and the viewers (``visualize``, ``app``).

A trace is a list of plain JSON-serializable events, in order. Schema version 1:

``{"event": "start", "version", "method", "explorers", "depths", "num_layers", "prompt",
   "max_new_tokens", "sampling": {"temperature", "top_k", "top_p", "seed"}, "decs"}``
    ``method`` is "dex" or "ar"; ``prompt`` the prompt token ids.

``{"event": "round", "round", "state_before", "state_after", "batches", "nodes", "commit",
   "collapse", "alive", "timings"}`` — one per explorer round (DEX only).
    ``batches[k]``: ids of the nodes explorer k computed. ``nodes``: the new exploration tokens,
    each ``{"id", "slot", "parent", "kind" ("root" | "depth" | "position"), "stage", "position"
    (absolute position of the predicted token), "input_token", "token", "text", "top"
    ([[token, probability], ...] at this depth, best first), "masked" (DECS-masked ids)}``.
    ``commit`` (or null): ``{"index", "position", "token", "text", "matched_stage",
    "anchor_nodes", "anchor_candidates"}``. ``collapse`` (or null): ``{"committed", "kept",
    "dropped", "new_anchor"}`` (node ids). ``alive``: node ids in the lattice after the round.
    ``state_before``/``state_after``: the FSM state q (anchor stages computed) around the round.
    ``timings`` (seconds): ``{"expand": [per explorer], "communication", "decode", "masks", "plan",
    "commit", "collapse", "trace", "prefill" (the prompt's pass, on the first round only), "round"}``.

``{"event": "token", "index", "position", "token", "text", "seconds"}`` — one per token (AR only).

``{"event": "end", "tokens", "stop" ("eos" | "length"), "stats"}`` — ``stats`` as in
    ``GenerationStats.to_dict()``.
"""

from __future__ import annotations

import json
from pathlib import Path

TRACE_FORMAT = "dex-trace"
TRACE_VERSION = 1


def save_trace(path: str | Path, events: list[dict], meta: dict | None = None) -> None:
    """Write events (and optional metadata such as the model name) as one JSON document."""
    doc = {"format": TRACE_FORMAT, "version": TRACE_VERSION, "meta": meta or {}, "events": list(events)}
    Path(path).write_text(json.dumps(doc, separators=(",", ":")))


def load_trace(path: str | Path) -> tuple[list[dict], dict]:
    """Read a saved trace; returns ``(events, meta)``. Raises ValueError for foreign or newer files."""
    try:
        doc = json.loads(Path(path).read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path} is not a DEX trace (invalid JSON: {err})") from None
    if not isinstance(doc, dict) or doc.get("format") != TRACE_FORMAT:
        raise ValueError(f"{path} is not a DEX trace (no 'format': '{TRACE_FORMAT}')")
    if doc.get("version", 0) > TRACE_VERSION:
        raise ValueError(f"{path} has trace version {doc['version']}; this DEX reads up to {TRACE_VERSION}")
    return doc["events"], doc.get("meta", {})


def node_record(node, text: str | None, top: list, masked: list[int]) -> dict:
    return {"id": node.id, "slot": node.slot, "parent": node.parent, "kind": node.kind,
            "stage": node.stage, "position": node.position, "input_token": node.input_token,
            "token": node.token, "text": text, "top": top, "masked": list(masked)}


def commit_record(plan, index: int, text: str | None) -> dict:
    return {"index": index, "position": plan.position, "token": plan.token, "text": text,
            "matched_stage": plan.matched_stage, "anchor_nodes": plan.anchor_nodes,
            "anchor_candidates": plan.anchor_candidates}


def collapse_record(plan) -> dict:
    return {"committed": plan.anchor_nodes, "kept": plan.kept, "dropped": plan.dropped,
            "new_anchor": plan.new_anchor}
