"""Saved traces are untrusted input: every crafted file is refused with DexError (never another exception),
every trace DEX records is accepted, and whatever is accepted renders with its text escaped."""

import copy
import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dex_core import DexDecoder, DexError, ar_stream, load_trace, save_trace
from dex_core.testing import tiny_tokenizer
from dex_core.trace.events import parse_events
from dex_core.trace.files import read_records, records
from dex_core.trace.schema import TRACE_LIMITS, TraceLimits
from dex_core.trace.validate import parse_trace
from visualize import (
    ReplayCache,
    fsm_html,
    lattice_figure,
    lattice_graph,
    replay,
    round_table_html,
    stats_html,
    tokens_html,
)

PAYLOAD = '"><img src=x onerror="window.__xss=1">'
PROMPT = [1, 2, 3, 4]


def document(events, meta=None) -> dict:
    return {"format": "dex-trace", "version": 1, "meta": meta or {"model": "tiny"}, "events": events}


def walk(obj, path=()):
    """(path, value) of everything in a JSON document, containers and scalars, the document first."""
    yield path, obj
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list) else ()
    for key, value in items:
        yield from walk(value, path + (key,))


def leaves(obj):
    return [(path, value) for path, value in walk(obj) if not isinstance(value, (dict, list))]


def parent_of(doc, path: tuple):
    for key in path[:-1]:
        doc = doc[key]
    return doc


def replaced(doc: dict, path: tuple, value) -> dict:
    out = copy.deepcopy(doc)
    parent_of(out, path)[path[-1]] = value
    return out


def first_of_each_field(doc: dict, kind) -> list[tuple]:
    """One path per field (list indices collapsed) whose value is of ``kind``."""
    out = {}
    for path, value in leaves(doc):
        if isinstance(value, kind) and not isinstance(value, bool):
            shape = tuple("*" if isinstance(p, int) else p for p in path)
            out.setdefault(shape, path)
    return list(out.values())


def render_everything(events) -> str:
    """Every view of a trace (its validated records, or its typed events) drawn."""
    events = parse_events(events)
    html = ""
    for view in replay(events):
        fig = lattice_figure(view)
        html += round_table_html(view) + fsm_html(view) + tokens_html(view) + stats_html(view, events[-1])
        html += json.dumps(fig.to_plotly_json(), default=str)
    lattice_graph(events)
    return html


@pytest.fixture(scope="module")
def real_traces(llama):
    tok = tiny_tokenizer()
    traces = {}
    for K in (1, 2, 3, 4):
        traces[f"greedy-K{K}"] = (
            DexDecoder(llama, explorers=K, tokenizer=tok, trace_top=5)
            .generate(PROMPT, 8, node_text=True)
            .trace
        )
        traces[f"sampled-K{K}"] = (
            DexDecoder(llama, explorers=K, tokenizer=tok, trace_top=5)
            .generate(PROMPT, 8, temperature=0.8, top_k=20, top_p=0.9, seed=K, node_text=True)
            .trace
        )
    traces["no-tokenizer-no-decs-no-top"] = (
        DexDecoder(llama, explorers=3, decs=False, trace_top=0).generate(PROMPT, 6).trace
    )
    traces["stopped-early"] = traces["greedy-K3"][:-3]
    traces["ar"] = list(ar_stream(llama, PROMPT, 6, tokenizer=tok))
    traces["ar-sampled"] = list(ar_stream(llama, PROMPT, 6, temperature=0.7, seed=3))
    return traces


@pytest.fixture(scope="module")
def valid(real_traces) -> dict:
    return json.loads(json.dumps(document(records(real_traces["greedy-K3"]))))


def rejected(doc_or_text, limits=TRACE_LIMITS) -> str:
    text = doc_or_text if isinstance(doc_or_text, (str, bytes)) else json.dumps(doc_or_text)
    with pytest.raises(DexError) as info:
        parse_trace(text, limits)
    return str(info.value)


def test_every_trace_dex_records_is_accepted(real_traces, tmp_path):
    for name, events in real_traces.items():
        save_trace(tmp_path / f"{name}.json", events, {"model": "tiny", "prompt": "hello <b>"})
        loaded, meta = load_trace(tmp_path / f"{name}.json")
        assert loaded == events and meta["prompt"] == "hello <b>", name
        assert read_records(tmp_path / f"{name}.json")[0] == json.loads(json.dumps(records(events))), name


def test_markup_in_any_numeric_field_is_refused_with_the_field_named(valid):
    paths = first_of_each_field(valid, (int, float))
    assert len(paths) > 40
    for path in paths:
        message = rejected(replaced(valid, path, PAYLOAD))
        assert "not a valid DEX trace" in message and "<img" not in message, path
    assert "events[0].depths[0] must be an integer" in rejected(
        replaced(valid, ("events", 0, "depths", 0), PAYLOAD)
    )


def test_markup_in_a_text_field_is_kept_as_text_and_escaped_when_drawn(valid):
    doc = copy.deepcopy(valid)
    texts = [path for path, _ in leaves(doc) if path[-1] in ("text", "model")]
    for path in texts:
        parent_of(doc, path)[path[-1]] = PAYLOAD + "<script>window.__xss=1</script>"
    events, _ = parse_trace(json.dumps(doc))
    html = render_everything(events)
    assert len(texts) > 20 and "&lt;img src=x" in html
    assert "<img" not in html and "<script" not in html


def test_markup_in_fields_that_name_a_kind_is_refused(valid):
    for path in first_of_each_field(valid, str):
        if path[-1] not in ("text", "model") and path[-3:-1][:1] != (
            "top",
        ):  # a top entry's third item is text
            message = rejected(replaced(valid, path, PAYLOAD))
            assert (
                "must be one of" in message
                or path == ("format",)
                and "not a DEX trace" in message
                or path[-1] == "device"
                and "events[0].device must name a device like cpu or cuda:0" in message
            ), path
    assert "has a key that a DEX trace does not have" in rejected(replaced(valid, ("events", 1, PAYLOAD), 1))


@pytest.mark.parametrize("value", [None, True, 1.5, [], {}, "7", -1, 2**40])
def test_a_wrong_type_or_range_anywhere_is_refused(valid, value):
    allowed = {(None, "parent"), (None, "new_anchor"), (-1, "seed"), (2**40, "seed")}
    for path in first_of_each_field(valid, int):
        try:
            parse_trace(json.dumps(replaced(valid, path, value)))
            assert (value, path[-1]) in allowed, path
        except DexError:
            pass


def test_a_missing_key_is_refused_and_named(valid):
    for event in (0, 1, len(valid["events"]) - 1):
        for key in valid["events"][event]:
            if key in (
                "adapter_depths",
                "timings",
                "proposal_vocab",
                "depth_choice",
                "pruned",
                "prune",
                "cost",
                "dtype",
                "device",
                "model",
                "draft",
                "commits",
                "chains",
                "cut",
            ):  # optional (absent in older traces)
                continue
            doc = copy.deepcopy(valid)
            del doc["events"][event][key]
            assert f"events[{event}] is missing {key}" in rejected(doc)
    node = copy.deepcopy(valid)
    del node["events"][1]["nodes"][0]["stage"]
    assert "events[1].nodes[0] is missing stage" in rejected(node)


@pytest.mark.parametrize(
    "text,message",
    [
        ("", "invalid JSON"),
        ("[]", "not a DEX trace"),
        ("1", "not a DEX trace"),
        ('"x"', "not a DEX trace"),
        ("null", "not a DEX trace"),
        ('{"format": "dex-trace"', "invalid JSON"),
        (b"\xff\xfe\x00{", "not a DEX trace"),
        ('{"format": "dex-trace", "version": 1, "events": []}', "events has fewer than 1 items"),
        ('{"format": "dex-trace", "version": 1, "events": [1]}', "events[0] must be an object"),
        ('{"format": "dex-trace", "version": 1, "events": [{}]}', "events[0] is missing event"),
        ('{"format": "dex-trace", "version": 9, "events": []}', "newer trace version"),
        ('{"format": "dex-trace", "version": 1.0, "events": []}', "version must be an integer"),
        ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
        ('{"format": "dex-trace", "meta": ' + "[" * 50_000 + "]" * 50_000 + "}", "nested too deeply"),
        ('{"format": "dex-trace", "version": 1, "meta": {"a": [[[[1]]]]}, "events": []}', "meta.a must be"),
        ('{"format": "dex-trace", "version": NaN}', "NaN"),
        ('{"format": "dex-trace", "version": -Infinity}', "NaN"),
        ('{"format": "dex-trace", "version": 1e999}', "out of range"),
        ('{"format": "dex-trace", "version": ' + "9" * 5000 + "}", "numbers in range"),
    ],
)
def test_malformed_documents_are_refused(text, message):
    assert message in rejected(text)


def test_nan_and_infinity_in_a_trace_are_refused(valid):
    for bad in (math.nan, math.inf, -math.inf):
        doc = replaced(valid, ("events", 1, "timings", "round"), bad)
        assert "NaN and infinity" in rejected(json.dumps(doc))


def minimal_rounds(rounds: int, K: int = 1, nodes_per_round: int = 1) -> dict:
    """A valid K=1 DEX trace: each round creates roots and commits the first one."""
    events = [
        {
            "event": "start",
            "version": 1,
            "method": "dex",
            "explorers": K,
            "depths": list(range(1, K + 1)),
            "num_layers": K,
            "prompt": [1],
            "max_new_tokens": rounds,
            "decs": True,
            "sampling": {"temperature": 0.0, "top_k": None, "top_p": None, "seed": 0},
        }
    ]
    for r in range(rounds):
        ids = list(range(r * nodes_per_round, (r + 1) * nodes_per_round))
        nodes = [
            {
                "id": i,
                "slot": i,
                "parent": None,
                "kind": "root",
                "stage": 0,
                "position": 1 + r,
                "input_token": 1,
                "token": 5,
                "text": "a",
                "top": [[5, 1.0]],
                "masked": [],
            }
            for i in ids
        ]
        events.append(
            {
                "event": "round",
                "round": r + 1,
                "state_before": 0,
                "state_after": 0,
                "batches": [ids] + [[] for _ in range(K - 1)],
                "nodes": nodes,
                "commit": {
                    "index": r,
                    "position": 1 + r,
                    "token": 5,
                    "text": "a",
                    "matched_stage": 0,
                    "anchor_nodes": ids[:1] * K,
                    "anchor_candidates": [5] * K,
                },
                "collapse": {"committed": ids[:1], "kept": [], "dropped": ids[1:], "new_anchor": None},
                "alive": [],
            }
        )
    return document(events)


def test_sizes_beyond_the_limits_are_refused_before_deeper_work(tmp_path):
    assert parse_trace(json.dumps(minimal_rounds(20)))[0][-1]["round"] == 20
    assert "8000 rounds; this DEX accepts at most 5000 (TraceLimits.max_rounds)" in rejected(
        minimal_rounds(8000)
    )
    assert "TraceLimits.max_nodes" in rejected(
        minimal_rounds(20, nodes_per_round=10), TraceLimits(max_nodes=100)
    )
    assert "has more than 8 items" in rejected(
        minimal_rounds(3, nodes_per_round=9), TraceLimits(max_nodes_per_round=8)
    )
    assert "explorers must be <= 64" in rejected(minimal_rounds(2, K=65))
    long_text = replaced(minimal_rounds(2), ("events", 1, "nodes", 0, "text"), "x" * 1001)
    assert "text is longer than 1000 characters" in rejected(long_text)
    surrogate = replaced(minimal_rounds(2), ("events", 1, "nodes", 0, "text"), "\ud800")
    assert "not valid Unicode" in rejected(json.dumps(surrogate))
    big = tmp_path / "big.json"
    big.write_text(json.dumps(minimal_rounds(50)))
    with pytest.raises(DexError, match="larger than 1000 bytes"):
        load_trace(big, TraceLimits(max_file_bytes=1000))


def test_broken_references_are_refused(valid):
    first_round = valid["events"][1]
    cases = {
        ("events", 0, "depths"): [1, 2, 3],
        ("events", 1, "event"): "start",
        ("events", 2, "round"): 1,
        ("events", 2, "nodes", 0, "id"): first_round["nodes"][0]["id"],
        ("events", 2, "nodes", 0, "parent"): 10_000,
        ("events", 2, "batches", 0): [10_000],
        ("events", 2, "alive"): [10_000],
        ("events", 1, "batches"): [[0]],
    }
    for path, value in cases.items():
        assert "not a valid DEX trace" in rejected(replaced(valid, path, value)), path
    commit_round = next(i for i, e in enumerate(valid["events"]) if e.get("commit"))
    for key in ("anchor_nodes", "matched_stage"):
        value = [10_000, 10_001, 10_002] if key == "anchor_nodes" else 3
        assert "not a valid DEX trace" in rejected(
            replaced(valid, ("events", commit_round, "commit", key), value)
        )
    assert "exactly when commit is" in rejected(replaced(valid, ("events", commit_round, "collapse"), None))
    token = valid["events"][commit_round]["commit"]["token"]  # an edit of commit, not of its copy in commits
    assert rejected(replaced(valid, ("events", commit_round, "commit", "token"), 500)).endswith(
        f"events[{commit_round}].commits[0].token must equal events[{commit_round}].commit.token (commit is a "
        f"copy of the round's first commit); got {token} and 500"
    )
    ends_twice = replaced(valid, ("events",), valid["events"] + [valid["events"][-1]])
    assert "only the last" in rejected(ends_twice)


def test_replay_builds_views_on_demand_with_negative_indices_and_slices(real_traces):
    views = replay(real_traces["greedy-K3"])
    eager = list(views)
    assert views[-1] == eager[-1] and views[-len(views)] == eager[0] and views[2:5] == eager[2:5]
    assert views[3] is not views[3] and views[3] == views[3]
    assert views[5].tokens is not views[6].tokens and views[5].nodes is not views[6].nodes
    with pytest.raises(IndexError):
        views[len(views)]


def test_replay_cache_reuses_a_replay_until_the_trace_grows_or_is_evicted(real_traces):
    trace, cache = real_traces["greedy-K3"], ReplayCache(size=2)
    events = trace[:10]
    first = cache(events)
    assert cache(events) is first
    events.append(trace[10])
    grown = cache(events)
    assert grown is not first and len(grown) == len(first) + 1 and cache(events) is grown
    cache(trace[:5]), cache(trace[:6])
    assert cache(events) is not grown


def test_a_long_trace_at_the_round_cap_replays_one_frame_at_a_time():
    events, _ = parse_trace(json.dumps(minimal_rounds(TRACE_LIMITS.max_rounds, K=2, nodes_per_round=3)))
    views = replay(parse_events(events))
    last = views[-1]
    assert len(views) == TRACE_LIMITS.max_rounds and len(last.tokens) == TRACE_LIMITS.max_rounds
    assert tokens_html(last).count('class="dex-tok"') == TRACE_LIMITS.max_rounds and len(last.nodes) == 3


def test_a_missing_file_is_refused_without_its_folder(tmp_path):
    with pytest.raises(DexError) as info:
        load_trace(tmp_path / "nope.json")
    assert str(tmp_path) not in str(info.value) and "nope.json" in str(info.value)


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats()
    | st.text(max_size=20)
    | st.sampled_from([PAYLOAD, "round", "start", "end", "root", "depth", "dex", -1, 0, 1, 2**31]),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


PLAUSIBLE = {
    int: st.integers(0, 40),
    float: st.floats(0, 1),
    str: st.sampled_from([PAYLOAD, "", "x"]) | st.text(),
}


def mutated(data, doc):
    """``doc`` with one random change: a key dropped, any JSON value put anywhere, or a plausible one (an
    int for an int, a reordered or shortened list), which often passes the schema and tests the rest."""
    path, value = data.draw(st.sampled_from(list(walk(doc))))
    how = data.draw(st.sampled_from(["drop", "any", "plausible", "plausible"]))
    if not path:
        return data.draw(json_values)
    doc = copy.deepcopy(doc)
    parent = parent_of(doc, path)
    if how == "drop" and isinstance(path[-1], str):
        del parent[path[-1]]
    elif how == "plausible" and isinstance(value, list):
        parent[path[-1]] = data.draw(st.permutations(value))[: data.draw(st.integers(0, len(value)))]
    elif how == "plausible" and type(value) in PLAUSIBLE:
        parent[path[-1]] = data.draw(PLAUSIBLE[type(value)])
    else:
        parent[path[-1]] = data.draw(json_values)
    return doc


# a mutation touches one to three of the valid trace's 2,750 values (148 kinds of field): the profile's examples
# would leave most kinds untouched, so the fuzzer takes 8 times as many (96 under ci, about 65 ms each)
@settings(max_examples=8 * settings.default.max_examples)
@given(data=st.data())
def test_any_mutation_of_a_valid_trace_loads_and_renders_or_raises_dex_error(valid, data):
    doc = valid
    for _ in range(data.draw(st.integers(1, 3))):
        doc = mutated(data, doc)
    try:
        events, _ = parse_trace(json.dumps(doc))
    except DexError:
        return
    assert "<img" not in render_everything(events)
