"""Trace events: JSON-serializable, versioned, replayable, and consistent with the lattice."""

import json
from dataclasses import replace

import pytest

from dex_core import DexDecoder, DexError, load_trace, save_trace
from dex_core.trace.events import EndEvent, RoundEvent, StartEvent, parse_events
from dex_core.trace.files import read_records, records
from dex_core.trace.schema import TRACE_FORMAT, TRACE_VERSION

CHAINED = [4, 8, 15, 16, 23, 42, 7, 9] * 3  # a prompt that repeats itself: lookups find drafts


@pytest.fixture(scope="module", params=["sampled", "chains"])
def trace(llama, request):
    if request.param == "sampled":
        return (
            DexDecoder(llama, explorers=4, trace_top=5, prune="none", draft="none")
            .generate([4, 8, 15, 16, 23, 42], 24, temperature=0.8, seed=2)
            .trace
        )
    events = (
        DexDecoder(llama, explorers=4, trace_top=5, prune="none", draft="gate=0").generate(CHAINED, 24).trace
    )
    assert any(len(e.commits) > 1 for e in events if isinstance(e, RoundEvent))  # the test must see chains
    return events


def _write_records(path, found: list[dict]) -> None:
    """A trace file of ``found``, records as they are (an older or a corrupted trace: save_trace writes events)."""
    doc = {"format": TRACE_FORMAT, "version": TRACE_VERSION, "meta": {}, "events": found}
    path.write_text(json.dumps(doc))


def test_events_are_plain_json_and_survive_a_round_trip(trace, tmp_path):
    json.dumps(records(trace))
    save_trace(tmp_path / "t.json", trace, {"model": "tiny"})
    events, meta = load_trace(tmp_path / "t.json")
    assert events == trace and meta == {"model": "tiny"}
    assert read_records(tmp_path / "t.json")[0] == json.loads(json.dumps(records(trace)))
    assert isinstance(trace[0], StartEvent) and trace[0].version == TRACE_VERSION
    assert trace[0].record()["event"] == "start" and trace[-1].record()["event"] == "end"
    assert isinstance(trace[-1], EndEvent) and trace[-1].stats.tokens == 24


def test_a_saved_trace_parses_once_into_typed_events_that_say_what_its_records_say(trace, tmp_path):
    save_trace(tmp_path / "t.json", trace)
    found, _ = read_records(tmp_path / "t.json")
    events = parse_events(found)
    assert events == load_trace(tmp_path / "t.json")[0] == trace
    start, rounds, end = events[0], events[1:-1], events[-1]
    assert (
        isinstance(start, StartEvent)
        and isinstance(end, EndEvent)
        and all(isinstance(e, RoundEvent) for e in rounds)
    )
    assert (start.method, start.depths, start.explorers, start.device) == (
        "dex",
        found[0]["depths"],
        4,
        "cpu",
    )
    assert [c.token for e in rounds for c in e.commits] == end.tokens == found[-1]["tokens"]
    assert [c.via for e in rounds for c in e.commits] == [c["via"] for e in found[1:-1] for c in e["commits"]]
    assert {n.kind for e in rounds for n in e.nodes} <= {"root", "depth", "position", "chain"}
    assert end.stop == "length" and parse_events(events) == events  # typed events pass through as they are
    with pytest.raises(DexError, match="not a trace event"):
        parse_events([{"event": "frame"}])


def test_foreign_and_newer_files_are_refused(tmp_path):
    (tmp_path / "a.json").write_text('{"x": 1}')
    with pytest.raises(DexError, match="not a DEX trace"):
        load_trace(tmp_path / "a.json")
    (tmp_path / "b.json").write_text(json.dumps({"format": "dex-trace", "version": TRACE_VERSION + 1}))
    with pytest.raises(DexError, match="newer trace version"):
        load_trace(tmp_path / "b.json")


def test_replaying_rounds_rebuilds_the_lattice_and_the_output(trace):
    alive: dict = {}
    committed = []
    for event in trace:
        if not isinstance(event, RoundEvent):
            continue
        for node in event.nodes:
            assert node.id not in alive
            assert node.kind in ("root", "depth", "position", "chain")
            assert node.top == sorted(node.top, key=lambda tp: -tp[1])
            alive[node.id] = node
        assert sorted(i for b in event.batches for i in b) == sorted(n.id for n in event.nodes)
        for k, batch in enumerate(event.batches):
            assert all(alive[i].stage == k for i in batch)
        for i in event.cut or []:
            del alive[i]
        if event.collapse is None:
            assert event.commits == [] and event.commit is None
            if not any(n.kind == "chain" for n in alive.values()):
                assert len(alive) == 2**event.state_after - 1
        else:
            c = event.collapse
            assert set(c["kept"]) | set(c["dropped"]) | set(c["committed"]) == set(alive)
            commits = event.commits
            assert commits[0] is event.commit and c["committed"] == [
                i for m in commits for i in m.anchor_nodes
            ]
            for commit, after in zip(commits, commits[1:] + [None]):
                assert [alive[i].token for i in commit.anchor_nodes] == commit.anchor_candidates
                assert commit.token == commit.anchor_candidates[-1]
                assert commit.anchor_candidates.index(commit.token) == commit.matched_stage
                if (
                    after is not None
                ):  # a second commit in a round is a chain slot fed the token just committed
                    assert commit.via == "chain" and after.drafted
                    assert alive[after.anchor_nodes[0]].input_token == commit.token
                committed.append(commit.token)
            alive = {i: alive[i] for i in c["kept"]}
        assert sorted(alive) == event.alive
    assert committed == trace[-1].tokens


def test_decs_masks_are_recorded_and_respected(trace):
    nodes = [n for e in trace if isinstance(e, RoundEvent) for n in e.nodes]
    deep = [n for n in nodes if 0 < n.stage < 3]
    assert deep and all(len(n.masked) == n.stage for n in deep)
    assert all(n.token not in n.masked for n in nodes)
    assert all(n.masked == [] for n in nodes if n.stage == 3)


def test_dtype_device_and_commit_margins_are_recorded_and_optional(trace, tmp_path):
    start = trace[0]
    assert (start.dtype, start.device) == ("float64", "cpu")
    commits = [c for e in trace if isinstance(e, RoundEvent) for c in e.commits]
    assert len(commits) == 24 and all(type(c.near_tie) is bool and c.margin >= 0 for c in commits)
    assert all(c.near_tie == (c.margin <= c.tie_gap) for c in commits)
    old = json.loads(json.dumps(records(trace)))  # a trace made before these keys existed (and before chains)
    for key in ("dtype", "device"):
        del old[0][key]
    single = not any(len(e["commits"]) > 1 for e in old[1:-1])
    for e in old[1:-1] if single else []:
        for key in ("commits", "chains", "cut"):
            e.pop(key, None)
        if e["commit"]:
            for key in ("margin", "near_tie", "tie_gap", "drafted", "via"):
                del e["commit"][key]
    _write_records(tmp_path / "old.json", old)
    assert read_records(tmp_path / "old.json")[0] == old
    loaded = load_trace(tmp_path / "old.json")[0]  # typed: what the older trace lacks reads as its default
    assert (loaded[0].dtype, loaded[0].device, loaded[0].made_on) == (None, None, "cpu")
    assert [c.token for e in loaded[1:-1] for c in e.commits] == [c.token for c in commits]
    if single:
        assert all(
            (c.margin, c.near_tie, c.tie_gap, c.drafted, c.via) == (None, None, None, False, None)
            for e in loaded[1:-1]
            for c in e.commits
        )
        assert all(e.chains is None and e.cut is None for e in loaded[1:-1])
    bad = json.loads(json.dumps(records(trace)))
    bad[0]["device"] = "cuda 0"
    _write_records(tmp_path / "bad.json", bad)
    with pytest.raises(DexError, match=r"events\[0\].device must name a device like cpu or cuda:0"):
        load_trace(tmp_path / "bad.json")
    bad[0]["device"], next(e for e in bad[1:-1] if e["commit"])["commit"]["near_tie"] = ("cpu", 1)
    _write_records(tmp_path / "bad.json", bad)
    with pytest.raises(DexError, match=r"commit.near_tie must be true or false"):
        load_trace(tmp_path / "bad.json")


def test_a_commit_with_no_second_token_saves_without_a_margin(llama, tmp_path):
    trace = DexDecoder(llama, explorers=2).generate([3, 1, 4], 4, temperature=1.0, top_k=1).trace
    commits = [e.commit for e in trace if isinstance(e, RoundEvent) and e.commit]
    assert len(commits) == 4 and all(
        c.margin is None and "margin" not in c.record() and c.near_tie is False for c in commits
    )
    save_trace(tmp_path / "k1.json", trace)
    assert load_trace(tmp_path / "k1.json")[0] == trace
    assert read_records(tmp_path / "k1.json")[0] == json.loads(json.dumps(records(trace)))


def test_a_skeletons_start_event_records_its_models_shapes_without_a_fingerprint(llama, tmp_path):
    import torch

    from dex_core.config import GenerationOptions
    from dex_core.model.stage_load import skeleton
    from dex_core.model.view import model_view
    from dex_core.runtime.request import make_request
    from dex_core.trace.build import start_event

    view = model_view(skeleton(llama.config, torch.float64))  # the model's shapes on the meta device
    start = start_event(make_request(view, [4, 8, 15], GenerationOptions(max_new_tokens=4)), view)
    assert start.model == {"model_type": "llama", "num_layers": 6, "hidden_size": 48, "vocab_size": 96}
    save_trace(tmp_path / "t.json", [start])
    assert load_trace(tmp_path / "t.json")[0] == [start]  # the fingerprint is optional
    save_trace(tmp_path / "bad.json", [replace(start, model={**start.model, "model_type": "<b>gpt2"})])
    with pytest.raises(DexError, match=r"events\[0\].model.model_type must be one of \"llama\""):
        load_trace(tmp_path / "bad.json")
