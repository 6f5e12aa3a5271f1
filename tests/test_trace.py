"""Trace events: JSON-serializable, versioned, replayable, and consistent with the lattice."""

import json

import pytest

from dex_core import DexDecoder, DexError, load_trace, save_trace
from dex_core.trace import TRACE_VERSION


@pytest.fixture(scope="module")
def trace(llama):
    return DexDecoder(llama, explorers=4, trace_top=5, prune="none").generate([4, 8, 15, 16, 23, 42], 24, temperature=0.8, seed=2).trace


def test_events_are_plain_json_and_survive_a_round_trip(trace, tmp_path):
    json.dumps(trace)
    save_trace(tmp_path / "t.json", trace, {"model": "tiny"})
    events, meta = load_trace(tmp_path / "t.json")
    assert events == json.loads(json.dumps(trace)) and meta == {"model": "tiny"}
    assert trace[0]["event"] == "start" and trace[0]["version"] == TRACE_VERSION
    assert trace[-1]["event"] == "end" and trace[-1]["stats"]["tokens"] == 24


def test_foreign_and_newer_files_are_refused(tmp_path):
    (tmp_path / "a.json").write_text('{"x": 1}')
    with pytest.raises(DexError, match="not a DEX trace"):
        load_trace(tmp_path / "a.json")
    (tmp_path / "b.json").write_text(json.dumps({"format": "dex-trace", "version": TRACE_VERSION + 1}))
    with pytest.raises(DexError, match="newer trace version"):
        load_trace(tmp_path / "b.json")


def test_replaying_rounds_rebuilds_the_lattice_and_the_output(trace):
    alive: dict[int, dict] = {}
    committed = []
    for event in trace:
        if event["event"] != "round":
            continue
        for node in event["nodes"]:
            assert node["id"] not in alive
            assert node["kind"] in ("root", "depth", "position")
            assert node["top"] == sorted(node["top"], key=lambda tp: -tp[1])
            alive[node["id"]] = node
        assert sorted(i for b in event["batches"] for i in b) == sorted(n["id"] for n in event["nodes"])
        for k, batch in enumerate(event["batches"]):
            assert all(alive[i]["stage"] == k for i in batch)
        if event["collapse"] is None:
            assert len(alive) == 2 ** event["state_after"] - 1
        else:
            c = event["collapse"]
            assert set(c["kept"]) | set(c["dropped"]) | set(c["committed"]) == set(alive)
            commit = event["commit"]
            assert [alive[i]["token"] for i in commit["anchor_nodes"]] == commit["anchor_candidates"]
            assert commit["token"] == commit["anchor_candidates"][-1]
            assert commit["anchor_candidates"].index(commit["token"]) == commit["matched_stage"]
            committed.append(commit["token"])
            alive = {i: alive[i] for i in c["kept"]}
        assert sorted(alive) == event["alive"]
    assert committed == trace[-1]["tokens"]


def test_decs_masks_are_recorded_and_respected(trace):
    nodes = [n for e in trace if e["event"] == "round" for n in e["nodes"]]
    deep = [n for n in nodes if 0 < n["stage"] < 3]
    assert deep and all(len(n["masked"]) == n["stage"] for n in deep)
    assert all(n["token"] not in n["masked"] for n in nodes)
    assert all(n["masked"] == [] for n in nodes if n["stage"] == 3)
