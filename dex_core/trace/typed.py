"""A trace's events parsed once into typed records (``parse_events``), for code that reads a trace rather than
draws it: ``StartEvent``, ``RoundEvent`` (its ``NodeRecord``s and ``CommitRecord``s), ``TokenEvent``, ``EndEvent``.

The fields are the keys documented in ``dex_core.trace.events``; a key that older traces lack takes the default
its documentation gives (absent: ``None``, no draft chains, not AR through the stages). Parsing keeps every value
as it was read (lists stay lists), so a typed event says exactly what its record said. What is written stays the
plain records of ``dex_core.trace.events``: typing happens where a trace is read.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Literal

from ..algorithm.lattice import NodeKind, Via
from ..config import DexError
from .events import round_commits
from .schema import TRACE_VERSION, Stopped


@dataclass(frozen=True)
class StartEvent:
    method: Literal["dex", "ar"]
    depths: list[int]
    num_layers: int
    prompt: list[int]
    max_new_tokens: int
    decs: bool
    sampling: dict  # {"temperature", "top_k", "top_p", "seed"}
    explorers: int
    version: int = TRACE_VERSION
    adapter_depths: list[int] = field(default_factory=list)
    proposal_vocab: int | None = None
    depth_choice: str | None = None
    prune: int | None = None
    draft: dict | None = None  # DraftBounds as a dict
    cost: dict | None = None  # ModelCost.weights()
    dtype: str | None = None
    device: str | None = None
    pipeline: bool = False
    model: dict | None = None  # the model's identity (dex_core.model.adapters.identity); None in older traces

    @property
    def made_on(self) -> str:
        """The device type the trace was made on (traces that do not record it were made on the CPU)."""
        return (self.device or "cpu").split(":")[0]


@dataclass(frozen=True)
class NodeRecord:
    id: int
    slot: int
    parent: int | None
    kind: NodeKind
    stage: int
    position: int
    input_token: int
    token: int
    text: str | None
    top: list  # [[token, probability(, text)], ...], best first
    masked: list[int]


@dataclass(frozen=True)
class CommitRecord:
    index: int
    position: int
    token: int
    text: str | None
    matched_stage: int
    anchor_nodes: list[int]
    anchor_candidates: list[int]
    drafted: bool = False
    via: Via | None = None
    margin: float | None = None
    near_tie: bool | None = None
    tie_gap: float | None = None


@dataclass(frozen=True)
class RoundEvent:
    round: int
    state_before: int
    state_after: int
    batches: list[list[int]]
    nodes: list[NodeRecord]
    commits: list[CommitRecord]  # in order; the first is the record's ``commit``
    collapse: dict | None
    alive: list[int]
    timings: dict | None = None
    pruned: list[int] = field(default_factory=list)
    chains: list[list[int]] | None = None  # with draft chains on
    cut: list[int] | None = None


@dataclass(frozen=True)
class TokenEvent:
    index: int
    position: int
    token: int
    text: str | None
    seconds: float


@dataclass(frozen=True)
class EndEvent:
    tokens: list[int]
    stop: Stopped
    stats: dict  # GenerationStats.to_dict()


Event = StartEvent | RoundEvent | TokenEvent | EndEvent


def _record(cls, record: dict, **parsed):
    """``cls`` from ``record``'s keys that are its fields, but those in ``parsed`` (fields already typed)."""
    names = {f.name for f in dataclasses.fields(cls)} - set(parsed)
    return cls(**{k: v for k, v in record.items() if k in names}, **parsed)


def parse_event(record: dict | Event) -> Event:
    """One trace record as its typed event (a typed event is returned as it is)."""
    if isinstance(record, (StartEvent, RoundEvent, TokenEvent, EndEvent)):
        return record
    kind = record.get("event") if isinstance(record, dict) else None
    if kind == "start":
        return _record(StartEvent, record)
    if kind == "round":
        nodes = [_record(NodeRecord, n) for n in record["nodes"]]
        commits = [_record(CommitRecord, c) for c in round_commits(record)]
        return _record(RoundEvent, record, nodes=nodes, commits=commits)
    if kind == "token":
        return _record(TokenEvent, record)
    if kind == "end":
        return _record(EndEvent, record)
    raise DexError(f"not a trace event: {kind!r:.40} (an event is one of 'start', 'round', 'token', 'end')")


def parse_events(records) -> list[Event]:
    """A trace's records (saved, received from another process, or typed already) as typed events, in order."""
    return [parse_event(r) for r in records]
