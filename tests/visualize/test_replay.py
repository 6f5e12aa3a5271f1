"""A live trace's replay is extended round by round and equals a full rebuild of the same events."""

import pytest

from dex_core import DexDecoder
from dex_core.testing import tiny_tokenizer
from dex_core.trace.events import RoundEvent
from visualize import ReplayCache, replay
from visualize.replay import _Index

PROMPT = [1, 2, 3, 4, 5]


@pytest.fixture(scope="module")
def trace(llama):
    decoder = DexDecoder(llama, explorers=3, tokenizer=tiny_tokenizer(), trace_top=5)
    return decoder.generate(PROMPT, 24, temperature=0.8, top_k=20, seed=1, node_text=True).trace


@pytest.fixture
def indexed(monkeypatch):
    """The round events the index processes, one entry per call."""
    seen = []
    real = _Index._round
    monkeypatch.setattr(_Index, "_round", lambda self, event: seen.append(event) or real(self, event))
    return seen


def test_the_extended_replay_equals_a_full_rebuild_after_every_round(trace, indexed):
    cache, events, earlier = ReplayCache(size=2), [], []
    rounds = [e for e in trace if isinstance(e, RoundEvent)]
    assert len(rounds) > 24 and any(e.commit for e in rounds) and any(not e.commit for e in rounds)
    for event in trace:
        events.append(event)
        if len(events) == 1:
            continue
        views = cache(events)
        rebuilt = replay(list(events))
        assert len(views) == len(rebuilt) and list(views) == list(rebuilt)
        assert views.vocab == rebuilt.vocab
        earlier.append((views, list(views)))
    assert len(views) == len(rounds) and views[-1].tokens == trace[-1].tokens
    assert all(list(v) == snapshot for v, snapshot in earlier)  # an earlier replay keeps its rounds
    assert len(earlier[3][0]) < len(views)


def test_following_a_live_trace_indexes_each_round_once(trace, indexed):
    cache, events = ReplayCache(size=2), list(trace[:1])
    for event in trace[1:]:
        events.append(event)
        cache(events)
        cache(events)  # a second panel asking for the same length reuses the replay
    live = len(indexed)
    replay(trace)
    assert live == len(indexed) - live == sum(isinstance(e, RoundEvent) for e in trace)


def test_a_trace_cut_short_in_place_is_indexed_again(trace):
    cache, events = ReplayCache(size=2), list(trace)
    full = cache(events)
    del events[10:]
    cut = cache(events)
    assert list(cut) == list(replay(list(events))) and len(cut) < len(full)


def test_the_live_tab_extends_one_replay_per_run(trace, indexed):
    from app.ui import debugger as dbg

    events = list(trace[:1])
    for event in trace[1:]:
        events.append(event)
        last = dbg.views(events)[-1]
    assert last == replay(list(trace))[-1] and len(indexed) == 2 * sum(
        isinstance(e, RoundEvent) for e in trace
    )
