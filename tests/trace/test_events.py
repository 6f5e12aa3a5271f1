"""Each trace event is declared once (``dex_core.trace.events``): the JSON Schema of a trace file derives from the
declarations, and every golden trace and a trace saved by an older DEX validate against it and parse into the same
typed events that their records say."""

import gzip
import json
from dataclasses import MISSING, fields
from pathlib import Path

import fastjsonschema
import golden
import pytest

from dex_core import DexError
from dex_core.trace.events import (
    EVENTS,
    CommitRecord,
    NodeRecord,
    RoundEvent,
    StartEvent,
    parse_events,
    trace_schemas,
)
from dex_core.trace.schema import TRACE_FORMAT, TRACE_LIMITS, schema_of
from dex_core.trace.validate import parse_trace, validate_trace

OLD = Path(__file__).with_name(
    "old-trace-c4b0faf.json.gz"
)  # assets/traces/example.json as commit c4b0faf made it


@pytest.fixture(scope="module")
def validators():
    return {name: fastjsonschema.compile(s) for name, s in trace_schemas().items()}


def golden_traces() -> dict[str, list[dict]]:
    return {name: json.loads(text) for name, text in golden.recorded().items()}


def test_the_schema_of_each_event_is_its_declaration(validators):
    for kind, cls in EVENTS.items():
        schema = trace_schemas()[kind]
        declared = {f.name for f in fields(cls)}
        assert set(schema["properties"]) == declared | {"event"} | (
            {"commit"} if cls is RoundEvent else set()
        )
        required = {"event"} | {f.name for f in fields(cls) if _required(f)}
        assert set(schema["required"]) == required | ({"commit"} if cls is RoundEvent else set()), kind
    node = schema_of(NodeRecord, TRACE_LIMITS)
    assert trace_schemas()["round"]["properties"]["nodes"]["items"] == node
    assert trace_schemas()["round"]["properties"]["commit"] == schema_of(
        CommitRecord, TRACE_LIMITS, null=True
    )


def _required(f) -> bool:
    return f.default is MISSING and f.default_factory is MISSING


def test_every_golden_trace_validates_against_the_derived_schema_and_round_trips(validators):
    traces = golden_traces()
    assert len(traces) == 48
    for name, found in traces.items():
        for record in found:
            validators[record["event"]](record)
        events, _ = validate_trace({"format": TRACE_FORMAT, "version": 1, "events": found})
        typed = parse_events(events)
        assert golden.stripped(typed) == found, (
            name
        )  # the dict form is the record (its clock's seconds aside)


def test_a_trace_saved_by_an_older_dex_loads_with_the_defaults_its_declarations_give(validators):
    found, meta = parse_trace(gzip.decompress(OLD.read_bytes()))
    for record in found:
        validators[record["event"]](record)
    events = parse_events(found)
    start, rounds = events[0], [e for e in events if isinstance(e, RoundEvent)]
    assert (
        isinstance(start, StartEvent)
        and start.method == "dex"
        and start.model is None
        and start.pipeline is False
    )
    assert start.made_on == "cpu" and start.proposal_vocab is None and start.cost is None
    old_rounds = [r for r in found if r["event"] == "round"]
    assert all("commits" not in r and "pruned" not in r for r in old_rounds)  # it predates both keys
    for event, record in zip(rounds, old_rounds):
        assert event.commits == ([CommitRecord.from_record(record["commit"])] if record["commit"] else [])
        assert event.pruned == [] and event.chains is None and event.commit == (event.commits or [None])[0]
    tokens = [c.token for e in events for c in e.commits]
    assert tokens == events[-1].tokens and len(tokens) == events[-1].stats.tokens > 0


def test_a_record_that_breaks_its_declaration_is_refused_by_name():
    found = next(iter(golden_traces().values()))
    bad = json.loads(json.dumps(found))
    bad[1]["nodes"][0]["stage"] = 1.5  # a float where the declaration says integer
    with pytest.raises(DexError, match=r"events\[1\]\.nodes\[0\]\.stage must be an integer"):
        validate_trace({"format": TRACE_FORMAT, "version": 1, "events": bad})
    bad = json.loads(json.dumps(found))
    bad[0]["surprise"] = 1  # a key no declaration has
    with pytest.raises(DexError, match=r"events\[0\] has a key that a DEX trace does not have"):
        validate_trace({"format": TRACE_FORMAT, "version": 1, "events": bad})
