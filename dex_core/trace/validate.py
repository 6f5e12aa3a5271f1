"""The one validator of saved traces (``parse_trace``). A trace file is untrusted input: it is uploaded to the app and
shared between users, so it is checked before anything reads it.

``parse_trace(data)`` turns the bytes of a saved trace into ``(events, meta)`` or raises ``DexError``
with a short message that says what is wrong and where (``events[3].nodes[0].stage must be an
integer``); messages never echo values or paths from the file. It checks, in this order:

1. size: the bytes (``max_file_bytes``), JSON without NaN or infinity, the counts of rounds, tokens, nodes;
2. structure: JSON Schemas (``trace_schemas``: the envelope, then each event by its kind) of the
   records declared in ``dex_core.trace.events``, compiled by ``fastjsonschema`` (about 30 times faster
   than ``jsonschema``: a 64 MB trace is checked in seconds): types (an integer is never a float or a
   bool), required keys, no unknown keys, integer and probability ranges, string lengths, array sizes;
3. references: the first event is ``start`` and only the last may be ``end``; round events in DEX
   traces, token events in AR ones; round numbers increase; node ids are unique; every id that a
   round's batches, commits, collapse, cut or alive list names, and every node's parent, exists; stages
   and matched stages are below the number of explorers; depths increase and end at ``num_layers``.

Limits live in ``TraceLimits`` (``TRACE_LIMITS`` holds the defaults; pass another to ``load_trace`` to
change them). The app's upload size limit is ``TRACE_LIMITS.max_file_bytes``. A trace the app itself
recorded can exceed them (K=8 at 512 tokens on a model whose depths rarely agree); such a trace is
refused with a message naming the limit, and can still be viewed where it was made."""

from __future__ import annotations

import functools
import json
import math

import fastjsonschema

from ..algorithm.lattice import NO_PROPOSAL
from ..config import DexError
from .events import trace_schemas
from .schema import TRACE_FORMAT, TRACE_LIMITS, TRACE_VERSION, TraceLimits


@functools.lru_cache(maxsize=4)
def _validators(limits: TraceLimits) -> dict:
    return {name: fastjsonschema.compile(schema) for name, schema in trace_schemas(limits).items()}


def prepare(limits: TraceLimits = TRACE_LIMITS) -> None:
    """Compile the validators of ``limits`` now, once: a process that forks trace readers (the app's trace worker)
    gives each of them the compiled code instead of a compilation of its own."""
    _validators(limits)


def _check_schema(doc: dict, limits: TraceLimits) -> None:
    check, prefix = _validators(limits), ""
    try:
        check["document"](doc)
        for i, event in enumerate(doc["events"]):
            prefix = f"events[{i}]"
            check[event["event"]](event)
    except fastjsonschema.JsonSchemaValueException as err:
        raise _schema_error(err, prefix) from None


def _schema_error(err: fastjsonschema.JsonSchemaValueException, prefix: str) -> DexError:
    where = prefix
    for part in err.path[1:]:  # names from the file are shown only when they are plain identifiers
        name = part if part.isidentifier() and len(part) <= 40 else "?"
        where += f"[{part}]" if part.isdigit() else ("." if where else "") + name
    rule, v = err.rule, err.rule_definition
    reasons = {
        "type": lambda: (
            "must be " + " or ".join(_TYPE_NAMES.get(t, t) for t in (v if isinstance(v, list) else [v]))
        ),
        "required": lambda: "is missing " + ", ".join(k for k in v if k not in err.value),
        "additionalProperties": lambda: "has a key that a DEX trace does not have",
        "enum": lambda: "must be one of " + ", ".join(json.dumps(x) for x in v),
        "minimum": lambda: f"must be >= {v}",
        "maximum": lambda: f"must be <= {v}",
        "maxLength": lambda: f"is longer than {v} characters",
        "pattern": lambda: (
            "must name a device like cpu or cuda:0"
            if where.endswith(".device")
            else "is not valid Unicode text"
        ),
        "maxItems": lambda: f"has more than {v} items",
        "minItems": lambda: f"has fewer than {v} items",
        "maxProperties": lambda: f"has more than {v} keys",
        "items": lambda: "has more items than allowed",
    }
    return _reject(where or "the document", reasons[rule]() if rule in reasons else "has the wrong shape")


_TYPE_NAMES = {
    "integer": "an integer",
    "number": "a number",
    "string": "a string",
    "boolean": "true or false",
    "object": "an object",
    "array": "a list",
}


def _reject(where: str, what: str) -> DexError:
    return DexError(f"not a valid DEX trace: {where} {what}")


class _BadNumber(ValueError):
    """NaN, Infinity or a number out of float range (1e999) in the JSON text."""


def _finite(text: str) -> float:
    if not math.isfinite(value := float(text)):
        raise _BadNumber("a number is out of range")
    return value


def _no_constant(name: str):
    raise _BadNumber(f"{name} is not allowed")


def parse_trace(data: bytes | str, limits: TraceLimits = TRACE_LIMITS) -> tuple[list[dict], dict]:
    """``(events, meta)`` of a saved trace's JSON text, or ``DexError`` saying what is wrong."""
    if len(data) > limits.max_file_bytes:
        raise DexError(f"the trace is larger than {limits.max_file_bytes} bytes (TraceLimits.max_file_bytes)")
    try:
        doc = json.loads(data, parse_float=_finite, parse_constant=_no_constant)
    except RecursionError:
        raise DexError("not a DEX trace: its JSON is nested too deeply") from None
    except json.JSONDecodeError as err:
        raise DexError(f"not a DEX trace: invalid JSON at line {err.lineno} column {err.colno}") from None
    except _BadNumber as err:
        raise DexError(f"not a valid DEX trace: {err} (NaN and infinity are not JSON)") from None
    except ValueError:  # bytes that are not UTF-8, integers of thousands of digits
        raise DexError("not a DEX trace: the file is not UTF-8 JSON text with numbers in range") from None
    return validate_trace(doc, limits)


def validate_trace(doc, limits: TraceLimits = TRACE_LIMITS) -> tuple[list[dict], dict]:
    """``(events, meta)`` of a parsed trace document, or ``DexError`` (see the module docstring)."""
    if not isinstance(doc, dict) or doc.get("format") != TRACE_FORMAT:
        raise DexError(f"not a DEX trace (no 'format': '{TRACE_FORMAT}')")
    version = doc.get("version")
    if type(version) is int and version > TRACE_VERSION:
        raise DexError(
            f"this file has a newer trace version; this DEX reads trace version {TRACE_VERSION} and older"
        )
    if isinstance(doc.get("events"), list):
        _check_counts(doc["events"], limits)
    _check_schema(doc, limits)
    _check_references(doc["events"])
    return doc["events"], doc.get("meta", {})


def _check_counts(events: list, limits: TraceLimits) -> None:
    def count(kind: str) -> int:
        return sum(1 for e in events if isinstance(e, dict) and e.get("event") == kind)

    nodes = sum(len(e["nodes"]) for e in events if isinstance(e, dict) and isinstance(e.get("nodes"), list))
    for n, cap, what, name in (
        (count("round"), limits.max_rounds, "rounds", "max_rounds"),
        (count("token"), limits.max_tokens, "tokens", "max_tokens"),
        (nodes, limits.max_nodes, "nodes", "max_nodes"),
    ):
        if n > cap:
            raise DexError(f"the trace has {n} {what}; this DEX accepts at most {cap} (TraceLimits.{name})")


def _check_references(events: list[dict]) -> None:
    start = events[0]
    if start["event"] != "start":
        raise _reject("events[0]", 'must be the "start" event')
    K, depths = start["explorers"], start["depths"]
    if (
        len(depths) != K
        or any(b <= a for a, b in zip(depths, depths[1:]))
        or depths[-1] != start["num_layers"]
    ):
        raise _reject("events[0].depths", "must hold one increasing depth per explorer, ending at num_layers")
    if not set(start.get("adapter_depths", ())) <= set(depths):
        raise _reject("events[0].adapter_depths", "must be explored depths")
    expected = "round" if start["method"] == "dex" else "token"
    seen, alive, last = set(), set(), 0
    for i, event in enumerate(events[1:], 1):
        if event["event"] == "end" and i == len(events) - 1:
            continue
        if event["event"] != expected:
            raise _reject(
                f"events[{i}]",
                f'must be a "{expected}" event (a {start["method"]} trace; only the '
                'first event is "start", only the last "end")',
            )
        if expected == "round":
            if event["round"] <= last:
                raise _reject(f"events[{i}].round", "must be greater than the previous round's")
            alive = _check_round(event, f"events[{i}]", K, seen, alive, start.get("pipeline", False))
            last = event["round"]


def _unlike_commit(where: str, commit: dict | None, commits: list) -> DexError:
    """Why a round's ``commits`` is not its ``commit`` followed by the round's other commits (a chain's)."""
    if None in commits:
        return _reject(f"{where}.commits", "must not hold null")
    if commit is None or not commits:
        return _reject(
            f"{where}.commits", "must begin with the round's commit, and be empty when commit is null"
        )
    first = commits[0]
    key = next(
        k
        for k in sorted(set(commit) | set(first))
        if (k in commit, commit.get(k)) != (k in first, first.get(k))
    )
    here, there = (f"{r[key]!r:.40}" if key in r else "nothing" for r in (first, commit))
    return _reject(
        f"{where}.commits[0].{key}",
        f"must equal {where}.commit.{key} (commit is a copy of the round's first commit); got {here} and {there}",
    )


def _check_round(
    event: dict, where: str, K: int, seen: set[int], alive: set[int], pipeline: bool
) -> set[int]:
    """Check one round against the ids seen so far; add its nodes to ``seen``; return its alive ids. A token of -1
    (no proposal) belongs only to a non-final stage of a pipeline trace (AR through the stages)."""
    if max(event["state_before"], event["state_after"]) > K:
        raise _reject(f"{where}.state_after", f"and state_before must be <= the {K} explorers")
    new: set[int] = set()
    for j, node in enumerate(event["nodes"]):
        if node["id"] in seen:
            raise _reject(f"{where}.nodes[{j}].id", "repeats the id of an earlier node")
        if node["stage"] >= K:
            raise _reject(f"{where}.nodes[{j}].stage", f"must be below the {K} explorers")
        if node["parent"] is not None and node["parent"] not in seen:
            raise _reject(f"{where}.nodes[{j}].parent", "names no earlier node")
        if node["token"] == NO_PROPOSAL and not (pipeline and node["stage"] < K - 1):
            raise _reject(
                f"{where}.nodes[{j}].token", "is -1 (no proposal) outside a pipeline trace's earlier stages"
            )
        seen.add(node["id"])
        new.add(node["id"])
    present = alive | new
    if len(event["batches"]) != K:
        raise _reject(f"{where}.batches", f"must hold one batch per explorer ({K})")
    for k, batch in enumerate(event["batches"]):
        if not new.issuperset(batch):
            raise _reject(f"{where}.batches[{k}]", "names a node this round did not create")
    commit, collapse, commits = (
        event["commit"],
        event["collapse"],
        event.get("commits", [event["commit"]] * bool(event["commit"])),
    )
    if (commit is None) != (collapse is None):
        raise _reject(f"{where}.collapse", "must be given exactly when commit is")
    if commits[:1] != ([commit] if commit else []) or None in commits:
        raise _unlike_commit(where, commit, commits)
    for c, at in zip(
        commits, ("commit",) if "commits" not in event else (f"commits[{j}]" for j in range(len(commits)))
    ):
        if len(c["anchor_nodes"]) != K or len(c["anchor_candidates"]) != K:
            raise _reject(f"{where}.{at}", f"must name one anchor node and candidate per explorer ({K})")
        if c["matched_stage"] >= K:
            raise _reject(f"{where}.{at}.matched_stage", f"must be below the {K} explorers")
        if NO_PROPOSAL in c["anchor_candidates"] and not (
            pipeline and NO_PROPOSAL not in c["anchor_candidates"][-1:]
        ):
            raise _reject(f"{where}.{at}.anchor_candidates", "hold -1 (no proposal) outside a pipeline trace")
        if not present.issuperset(c["anchor_nodes"]):
            raise _reject(f"{where}.{at}.anchor_nodes", "names a node that is not in the lattice")
    for key, ids in [(f"collapse.{k}", collapse[k]) for k in ("committed", "kept", "dropped") if collapse] + [
        ("cut", event.get("cut", []))
    ]:  # once per round, not once per commit
        if not present.issuperset(ids):
            raise _reject(f"{where}.{key}", "names a node that is not in the lattice")
    if not present.issuperset(event["alive"]):
        raise _reject(f"{where}.alive", "names a node that is not in the lattice")
    return set(event["alive"])
