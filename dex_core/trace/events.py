"""Trace events, each declared once: the only interface between ``dex_core`` and the viewers (``visualize``, ``app``).

A run yields typed events in order — ``StartEvent``, then one ``RoundEvent`` per round (DEX) or one ``TokenEvent``
per token (AR), then ``EndEvent`` — and every event's committed tokens are its ``commits`` (a round's, several when a
draft chain committed; an AR token event is its own). Each field below carries its JSON Schema (``schema.spec``), so
the schema of a saved trace (``trace_schemas``), the validator's field checks (``dex_core.trace.validate``), the
dict form written to a file (``record()``) and the typed parse of one (``parse_event``) all derive from these
declarations. A field with a default is a key older traces lack; reading such a trace gives the default.

The file (schema version 1) is ``{"format": "dex-trace", "version", "meta" (strings and numbers, such as the model),
"events"}`` (``dex_core.trace.files``), each event its ``record()`` with an ``"event"`` key naming its kind; a
round's record also holds ``"commit"``, a copy of its first commit (or null), as traces made before draft chains
held only that. A trace stopped early has no end event.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import MISSING, dataclass
from typing import ClassVar, Literal, get_args

from ..algorithm.lattice import NodeKind, Via
from ..config import DEPTH_CHOICES, DTYPES, MAX_SEED, DexError
from ..families import SUPPORTED_TYPES
from .schema import (
    MAX_NUMBER,
    STOPS,
    TRACE_FORMAT,
    TRACE_LIMITS,
    TRACE_VERSION,
    Stopped,
    TraceLimits,
    array,
    boolean,
    ids,
    integer,
    k_range,
    nested,
    number,
    one_of,
    record,
    scalar,
    schema_of,
    seconds_by_name,
    spec,
    text,
)
from .stats import GenerationStats, stats_schema

_K = lambda lim: lim.max_explorers  # noqa: E731


class _Record:
    """A declared record: its dict form (``record``) and its parse (``from_record``)."""

    __slots__ = ()
    event: ClassVar[str | None] = None  # the ``"event"`` key of an event's record
    commits: ClassVar[tuple] = ()  # the tokens an event committed (a round's and an AR token's say otherwise)

    def record(self) -> dict:
        """The JSON form, as a trace file holds it (a sparse field at its default is left out)."""
        out = {"event": self.event} if self.event else {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if not (f.metadata["sparse"] and value == _default(f)):
                out[f.name] = _plain(value)
        return out

    @classmethod
    def from_record(cls, record: dict):
        """The typed record of a dict whose keys were validated (``dex_core.trace.validate``)."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in record.items() if k in names})


def _default(f: dataclasses.Field):
    return f.default_factory() if f.default_factory is not MISSING else f.default


def _plain(value):
    if isinstance(value, _Record):
        return value.record()
    if isinstance(value, GenerationStats):
        return dataclasses.asdict(value)
    if isinstance(value, list) and value and isinstance(value[0], _Record):
        return [v.record() for v in value]
    return value


def _top(lim: TraceLimits) -> dict:
    """One candidate at a node: ``[token, probability, text]`` (text only with a tokenizer)."""
    items = [integer()(lim), number(0.0, 1.0)(lim), text(lim)]
    return {"type": "array", "items": items, "additionalItems": False, "minItems": 2}


def _logprob(lim: TraceLimits) -> dict:
    """One alternative of a committed token: ``[token, log-probability]``."""
    return {
        "type": "array",
        "items": [integer()(lim), number(-MAX_NUMBER, 0.0)(lim)],
        "additionalItems": False,
        "minItems": 2,
    }


@dataclass(frozen=True, slots=True)
class StartEvent(_Record):
    """The run: ``method`` "dex" or "ar" (AR over the whole model); ``prompt`` the prompt token ids; ``sampling``
    ``{"temperature", "top_k", "top_p", "seed"}``."""

    event: ClassVar[str] = "start"
    version: int = spec(integer(1, TRACE_VERSION))
    method: Literal["dex", "ar"] = spec(one_of(["dex", "ar"]))
    explorers: int = spec(k_range())
    depths: list[int] = spec(array(integer(1), _K, 1))
    num_layers: int = spec(integer(1))
    prompt: list[int] = spec(array(integer(), lambda lim: lim.max_prompt_tokens, 1))
    max_new_tokens: int = spec(integer(1))
    decs: bool = spec(boolean)
    sampling: dict = spec(
        nested(
            {
                "temperature": number(),
                "top_k": integer(0, null=True),
                "top_p": number(0.0, 1.0, null=True),
                "seed": integer(0, MAX_SEED),  # as GenerationOptions takes it
            }
        )
    )
    # the depths whose candidates went through an inducing adapter
    adapter_depths: list[int] = spec(array(integer(1), _K), factory=list)
    # DEX: the rows of the non-final stages' proposal heads (the vocabulary size when they are full)
    proposal_vocab: int | None = spec(integer(1), None, sparse=True)
    # DEX: how the depths were chosen: "given", "uniform split", or the best set stored with the adapters
    depth_choice: str | None = spec(one_of(DEPTH_CHOICES), None, sparse=True)
    # DEX with a row budget: rows per stage a round at most
    prune: int | None = spec(integer(1), None, sparse=True)
    # DEX with draft chains: their bounds (DraftBounds: ngram, min_ngram, length, chains, rows, gate)
    draft: dict | None = spec(
        lambda lim: {"type": "object", "maxProperties": 16, "additionalProperties": integer()(lim)},
        None,
        sparse=True,
    )
    # DEX: the weights of the model's parts in layer-equivalents (ModelCost.weights()); proposal null when full
    cost: dict | None = spec(
        nested({"head": number(), "adapter": number(), "proposal": number(null=True)}), None, sparse=True
    )
    dtype: str | None = spec(one_of(DTYPES), None, sparse=True)  # the model's, which dex verify reloads it in
    device: str | None = spec(  # where the token choices were made ("cpu", "cuda:0")
        lambda lim: {"type": "string", "pattern": r"^[a-z]{1,16}(:[0-9]{1,4})?$"}, None, sparse=True
    )
    pipeline: bool = spec(
        boolean, False, sparse=True
    )  # AR through the stages: no stage but the last proposes
    # the model's identity (model.adapters.identity); no fingerprint where the embeddings were not loaded
    model: dict | None = spec(
        nested(
            {
                "model_type": one_of(SUPPORTED_TYPES),
                "num_layers": integer(1),
                "hidden_size": integer(1),
                "vocab_size": integer(1),
                "fingerprint": number(),
            },
            optional=("fingerprint",),
        ),
        None,
        sparse=True,
    )

    @property
    def made_on(self) -> str:
        """The device type the trace was made on (traces that do not record it were made on the CPU)."""
        return (self.device or "cpu").split(":")[0]


@dataclass(frozen=True, slots=True)
class NodeRecord(_Record):
    """A new exploration token: ``kind`` "root" | "depth" | "position" | "chain"; ``position`` the absolute position of
    the token it predicts; ``token`` its candidate (-1: the stage proposed nothing, in a pipeline trace); ``top`` the
    candidates at this depth, best first (empty when ``trace_top`` is 0); ``masked`` the ids DECS masked."""

    id: int = spec(integer())  # unique within a trace
    slot: int = spec(integer())
    parent: int | None = spec(integer(null=True))
    kind: NodeKind = spec(one_of(get_args(NodeKind)))
    stage: int = spec(k_range(0, 1))
    position: int = spec(integer())
    input_token: int = spec(integer())
    token: int = spec(integer(-1))
    text: str | None = spec(text)  # null without a tokenizer
    top: list = spec(array(_top, lambda lim: lim.max_top_k))  # [[token, probability(, text)], ...]
    masked: list[int] = spec(array(integer(), _K))


@dataclass(frozen=True, slots=True)
class CommitRecord(_Record):
    """A committed token: the shallowest stage whose anchor candidate matched it, and the anchor's node and candidate
    at every stage. ``margin``: the committed final-depth node's top-1 minus top-2 score in float32 (noise included
    when sampling; absent when no second token was left), ``near_tie``: whether it is within ``tie_gap`` of the dtype.
    ``drafted``: its slot's input was a looked-up token; ``via``: how the next anchor was found. ``logprob`` and
    ``top_logprobs`` (``[[token, log-probability], ...]``, likeliest first): the token's log-probability at the
    final depth and the alternatives there, in a run that asked for them (``DexDecoder.request(logprobs=k)``)."""

    index: int = spec(integer())
    position: int = spec(integer())
    token: int = spec(integer())
    text: str | None = spec(text)
    matched_stage: int = spec(k_range(0, 1))
    anchor_nodes: list[int] = spec(array(integer(), _K, 1))
    anchor_candidates: list[int] = spec(array(integer(-1), _K, 1))
    drafted: bool = spec(boolean, False)
    via: Via | None = spec(one_of(get_args(Via)), None, sparse=True)
    margin: float | None = spec(number(), None, sparse=True)
    near_tie: bool | None = spec(boolean, None, sparse=True)
    tie_gap: float | None = spec(number(), None, sparse=True)
    logprob: float | None = spec(number(-MAX_NUMBER, 0.0), None, sparse=True)
    top_logprobs: list | None = spec(array(_logprob, lambda lim: lim.max_top_k), None, sparse=True)


def _commit(lim: TraceLimits) -> dict:
    return schema_of(CommitRecord, lim, null=True)


@dataclass(frozen=True, slots=True)
class RoundEvent(_Record):
    """One explorer round (DEX). ``batches[k]``: the ids of the nodes explorer k computed; ``commits``: the round's
    commits in order; ``collapse``: the round's whole collapse ``{"committed", "kept", "dropped", "new_anchor"}`` (node
    ids; null without a commit); ``alive``: the ids in the lattice after the round; ``state_before``/``state_after``:
    the FSM state q around it. ``timings`` (seconds): ``{"expand": [per explorer], "communication", "decode",
    "masks", "plan", "commit", "collapse", "trace", "prefill" (first round only), "round", "bookkeeping", "projected"}``
    (``dex_core.trace.build.round_timings``). ``pruned``: nodes whose position child the row budget did not start this
    round (it waits: a later round may start it, ``Lattice.waiting``);
    with draft chains, ``chains`` the chains started (their stage-0 node ids) and ``cut`` the nodes dropped because
    the slot before them proposed another token."""

    event: ClassVar[str] = "round"
    round: int = spec(integer(1))
    state_before: int = spec(k_range(0))
    state_after: int = spec(k_range(0))
    batches: list[list[int]] = spec(array(ids, _K, 1))
    nodes: list[NodeRecord] = spec(
        array(lambda lim: schema_of(NodeRecord, lim), lambda lim: lim.max_nodes_per_round)
    )
    collapse: dict | None = spec(
        nested({"committed": ids, "kept": ids, "dropped": ids, "new_anchor": integer(null=True)}, null=True)
    )
    alive: list[int] = spec(ids)
    commits: list[CommitRecord] = spec(array(_commit, lambda lim: lim.max_tokens), factory=list)
    timings: dict | None = spec(seconds_by_name, None, sparse=True)
    pruned: list[int] = spec(ids, factory=list)
    chains: list[list[int]] | None = spec(array(ids, lambda lim: lim.max_nodes_per_round), None, sparse=True)
    cut: list[int] | None = spec(ids, None, sparse=True)

    @property
    def commit(self) -> CommitRecord | None:
        """The round's first commit."""
        return self.commits[0] if self.commits else None

    def record(self) -> dict:
        out = _Record.record(self)
        out["commit"] = out["commits"][0] if self.commits else None
        return out

    @classmethod
    def from_record(cls, record: dict) -> RoundEvent:
        commits = record.get("commits") or ([record["commit"]] if record.get("commit") else [])
        return _Record.from_record.__func__(
            cls,
            {
                **record,
                "nodes": [NodeRecord.from_record(n) for n in record["nodes"]],
                "commits": [CommitRecord.from_record(c) for c in commits],
            },
        )


@dataclass(frozen=True, slots=True)
class TokenEvent(_Record):
    """One token of an AR run (its own commit)."""

    event: ClassVar[str] = "token"
    index: int = spec(integer())
    position: int = spec(integer())
    token: int = spec(integer())
    text: str | None = spec(text)
    seconds: float = spec(number())

    @property
    def commits(self) -> tuple[TokenEvent]:
        return (self,)


@dataclass(frozen=True, slots=True)
class EndEvent(_Record):
    """The run's end: its new tokens, why it stopped ("cancelled": the caller stopped a distributed stream early) and
    its statistics."""

    event: ClassVar[str] = "end"
    tokens: list[int] = spec(array(integer(), lambda lim: lim.max_tokens))
    stop: Stopped = spec(one_of(STOPS))
    stats: GenerationStats = spec(stats_schema)

    @classmethod
    def from_record(cls, record: dict) -> EndEvent:
        names = {f.name for f in dataclasses.fields(GenerationStats)}
        stats = GenerationStats(**{k: v for k, v in record["stats"].items() if k in names})
        return cls(tokens=record["tokens"], stop=record["stop"], stats=stats)


Event = StartEvent | RoundEvent | TokenEvent | EndEvent
EVENTS: dict[str, type] = {cls.event: cls for cls in (StartEvent, RoundEvent, TokenEvent, EndEvent)}


def parse_event(record: dict | Event) -> Event:
    """One trace record (validated: ``dex_core.trace.validate``) as its typed event; a typed event is returned as it
    is."""
    if isinstance(record, _Record):
        return record
    cls = EVENTS.get(record.get("event")) if isinstance(record, dict) else None
    if cls is None:
        kinds = ", ".join(repr(k) for k in EVENTS)
        raise DexError(f"not a trace event: {str(type(record).__name__):.40} (an event is one of {kinds})")
    return cls.from_record(record)


def parse_events(records) -> list[Event]:
    """A trace's records (saved, or typed already) as typed events, in order."""
    return [parse_event(r) for r in records]


@functools.lru_cache(maxsize=4)
def trace_schemas(limits: TraceLimits = TRACE_LIMITS) -> dict[str, dict]:
    """JSON Schemas (draft 4: integers exclude floats) of a saved trace under ``limits``: "document" and each event
    kind, derived from the declarations."""
    event = {"type": "object", "required": ["event"], "properties": {"event": {"enum": list(EVENTS)}}}
    document = record(
        {
            "format": {"enum": [TRACE_FORMAT]},
            "version": integer(1, TRACE_VERSION)(limits),
            "meta": {"type": "object", "maxProperties": 64, "additionalProperties": scalar(limits)},
            "events": array(lambda lim: event, lambda lim: max(lim.max_rounds, lim.max_tokens) + 2, 1)(
                limits
            ),
        },
        optional=("meta",),
    )
    schemas = {"document": document}
    for kind, cls in EVENTS.items():
        extra = {"commit": _commit(limits)} if cls is RoundEvent else {}
        schemas[kind] = schema_of(cls, limits, event={"enum": [kind]}, **extra)
    return {name: {"$schema": "http://json-schema.org/draft-04/schema#", **s} for name, s in schemas.items()}
