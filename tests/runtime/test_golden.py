"""Every golden trace (``tests/golden.py``) is reproduced byte for byte, by both schedules."""

import json

import golden
import pytest


@pytest.fixture(scope="module")
def records():
    return golden.recorded()


def test_the_matrix_is_the_recorded_one_and_covers_what_it_says(records):
    assert sorted(records) == sorted(golden.matrix()) and len(records) == 48
    traces = {name: json.loads(text) for name, text in records.items()}
    multi = [n for n, t in traces.items() if any(len(e.get("commits", [])) > 1 for e in t)]
    assert multi and all("draft1" in n for n in multi)  # draft chains commit several tokens per round
    pruned = [n for n, t in traces.items() if any(e["event"] == "round" and e["pruned"] for e in t)]
    assert len(pruned) >= 16 and all("prune1" in n for n in pruned)  # a row budget of one a stage


def test_the_sequential_schedule_reproduces_every_golden_trace(qwen3, records):
    changed = [name for name, case in golden.matrix().items() if golden.run(case, qwen3) != records[name]]
    assert not changed, f"traces that differ from the golden record: {changed}"


def test_the_distributed_schedule_reproduces_golden_traces(qwen3, records):
    cases = golden.matrix()
    names = ["K3-decs1-draft1-prune1-greedy", "K3-decs1-draft1-prune1-sampled"]  # one group, two requests
    with golden.decoder(
        cases[names[0]], qwen3, backend="distributed", devices=("cpu",) * 3, threads=1
    ) as dex:
        for name in names:
            assert golden.trace(dex, cases[name]) == records[name], name
