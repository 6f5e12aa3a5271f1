"""Requests in flight share rounds (``dex_core.runtime.crew``): each explorer runs one step a round over every
request's rows, and every request gets exactly the tokens it gets alone, whatever joins, leaves or fails beside it."""

import pytest
import torch
from helpers import interleaved

from dex_core import DexDecoder, DexError, ar_generate, shapes
from dex_core.model.cache import LanesWrite
from dex_core.model.explorer import Explorer
from dex_core.runtime import crew
from dex_core.testing import tiny_model
from dex_core.trace.events import EndEvent, RoundEvent

SAMPLED = [
    {"temperature": 0.8, "seed": 11},
    {"temperature": 1.3, "top_k": 7, "seed": 12},
    {"temperature": 0.6, "top_p": 0.8, "seed": 13},
    {"temperature": 1.0, "top_k": 20, "top_p": 0.9, "seed": 2**63},
]


@pytest.fixture(scope="module")
def model():
    return tiny_model("mistral", sliding_window=12)  # a window shorter than the runs: windowed masks per lane


def _prompt(seed: int, n: int) -> list[int]:
    head = torch.randint(0, 96, (n,), generator=torch.Generator().manual_seed(seed)).tolist()
    return head + head[: n // 2]  # a repeated stretch: draft chains find their n-grams


def _requests() -> list[tuple[list[int], int, dict]]:
    """Eight requests: prompts of 3 to 40 tokens (and half again, repeated), 16 to 40 new tokens, four greedy and four
    sampled."""
    lengths, news = [3, 9, 14, 21, 6, 27, 11, 40], [24, 40, 40, 18, 30, 16, 28, 20]
    options = [{}, *SAMPLED[:2], {}, SAMPLED[2], {}, SAMPLED[3], {}]
    return [(_prompt(i, n), new, o) for i, (n, new, o) in enumerate(zip(lengths, news, options))]


def _alone(model, prompt, new, options) -> list[int]:
    return DexDecoder(model, explorers=3).generate(prompt, new, **options).tokens


def _rows_per_step(monkeypatch) -> list[int]:
    """The lanes of every shared step, recorded as they run."""
    seen, step = [], Explorer.expand_seats

    def counting(self, hidden, *args):
        seen.append(hidden.shape[0])
        return step(self, hidden, *args)

    monkeypatch.setattr(Explorer, "expand_seats", counting)
    return seen


def test_eight_requests_in_shared_rounds_each_get_their_tokens_alone(model, monkeypatch):
    monkeypatch.setattr(crew, "PREFILL_CHUNK", 8)  # prompts go in by chunks, between the others' rounds
    requests, lanes = _requests(), _rows_per_step(monkeypatch)
    decoder = DexDecoder(model, explorers=3)
    decoder.share(8)
    # six at once, request 1 cancelled by its consumer at its 16th event, two joining at the 5th turn, mid-run
    events = interleaved(decoder, requests, 6, (1, 16), 5)
    for i, (prompt, new, options) in enumerate(requests):
        alone = _alone(model, prompt, new, options)
        committed = [c.token for e in events[i] if isinstance(e, RoundEvent) for c in e.commits]
        if i == 1:
            assert committed == alone[: len(committed)] and len(committed) < new
            continue
        end = events[i][-1]
        assert isinstance(end, EndEvent) and end.tokens == committed == alone, i
        if not options:
            assert alone == ar_generate(model, prompt, new).tokens
        assert end.stats.model_seconds <= end.stats.wall_seconds and end.stats.tokens_per_second > 0
    assert max(lanes) == 8 and min(lanes) <= 6  # all eight shared steps, after fewer did
    assert all(len(e.seats) == 1 for e in decoder.explorers)  # every lane but the stage's own freed


def test_a_shared_step_reads_only_the_entries_its_lanes_can_see(model, monkeypatch):
    """The lanes' buffer keeps the capacity of the longest context it held; a step's attention reads only the entries
    the lanes in flight can see (``explorer.seen_columns``), and each request's tokens stay its own."""
    monkeypatch.setattr(
        shapes, "CAPACITY_STEP", 16
    )  # capacities in steps of 16 entries: a tiny model's contexts
    decoder = DexDecoder(model, explorers=3)
    decoder.share(2)
    decoder.generate(_prompt(30, 80), 4)  # every stage's buffer grows past 120 entries
    read, update = [], LanesWrite.update

    def reading(self, *args, **kwargs):
        keys, values = update(self, *args, **kwargs)
        read.append((keys.shape[2], values.shape[2], self.lanes.capacity))
        return keys, values

    monkeypatch.setattr(LanesWrite, "update", reading)
    requests = [(_prompt(31, 6), 20, {}), (_prompt(32, 9), 20, SAMPLED[0])]
    events = interleaved(decoder, requests, 2, (-1, 0), -1)
    for i, (prompt, new, options) in enumerate(requests):
        assert events[i][-1].tokens == _alone(model, prompt, new, options), i
    assert all(k == v < capacity for k, v, capacity in read) and min(c for *_, c in read) >= 120
    assert max(k for k, *_ in read) <= 64  # 15 + 20 entries and a region: never the 120 the buffer holds


def test_a_request_stopped_at_its_eos_leaves_and_the_others_run_on(model):
    prompt, other = _prompt(20, 8), _prompt(21, 13)
    alone = _alone(model, prompt, 30, {})
    eos = alone[5]
    stopped = _alone(model, prompt, 30, {"eos_token_id": eos})
    assert stopped == alone[: alone.index(eos) + 1]
    decoder = DexDecoder(model, explorers=3)
    decoder.share(2)
    a = decoder.stream(prompt, 30, eos_token_id=eos)
    b = decoder.stream(other, 30)
    ends = {}
    while len(ends) < 2:
        for name, stream in (("a", a), ("b", b)):
            if name not in ends and isinstance(event := next(stream), EndEvent):
                ends[name] = event
    assert ends["a"].tokens == stopped and ends["a"].stop == "eos"
    assert ends["b"].tokens == _alone(model, other, 30, {})


def test_a_failed_round_ends_every_request_in_flight_and_the_next_starts_clean(model, monkeypatch):
    decoder = DexDecoder(model, explorers=3)
    decoder.share(4)
    first, second = decoder.stream(_prompt(30, 7), 20), decoder.stream(_prompt(31, 9), 20)
    next(first), next(second), next(first), next(second)  # start events, then both in flight
    step = Explorer.expand_seats

    def broken(self, *args):
        raise RuntimeError("an explorer's device failed")

    monkeypatch.setattr(Explorer, "expand_seats", broken)
    with pytest.raises(RuntimeError, match="device failed"):
        list(first)
    with pytest.raises(DexError, match="the round failed: an explorer's device failed"):
        list(second)
    monkeypatch.setattr(Explorer, "expand_seats", step)
    prompt = _prompt(32, 11)
    assert decoder.generate(prompt, 20).tokens == ar_generate(model, prompt, 20).tokens


def test_past_its_most_in_flight_a_new_request_stops_the_oldest(model):
    decoder = DexDecoder(model, explorers=3)
    decoder.share(2)
    streams = [decoder.stream(_prompt(40 + i, 6), 16) for i in range(3)]
    for s in streams[:2]:
        next(s), next(s)
    newest = [e for e in streams[2] if isinstance(e, EndEvent)]
    assert newest[0].tokens == ar_generate(model, _prompt(42, 6), 16).tokens
    with pytest.raises(DexError, match="2 runs at a time"):
        list(streams[0])
    assert [e for e in streams[1] if isinstance(e, EndEvent)][0].tokens == ar_generate(
        model, _prompt(41, 6), 16
    ).tokens


def test_a_stream_closed_during_a_round_leaves_after_it_and_the_others_run_on(model, monkeypatch):
    """A consumer's stream closed while a round runs (the collector closing an abandoned one, or a server's event loop)
    lets its request go before the next round, not mid-step: the others' tokens are their own."""
    prompts = [_prompt(50 + i, 7 + 3 * i) for i in range(3)]
    decoder = DexDecoder(model, explorers=3)
    decoder.share(3)
    streams = [decoder.stream(p, 24) for p in prompts]
    for _ in range(2):  # the start events, then a round: all three in flight
        for s in streams:
            next(s)
    step, closed = Explorer.expand_seats, []

    def closing(self, *args):
        if not closed:
            closed.append(len(self.seats))
            streams[1].close()
        return step(self, *args)

    monkeypatch.setattr(Explorer, "expand_seats", closing)
    ends = {i: [e for e in streams[i] if isinstance(e, EndEvent)][0] for i in (0, 2)}
    assert closed == [3]
    for i in (0, 2):
        assert ends[i].tokens == _alone(model, prompts[i], 24, {})
    assert all(len(e.seats) == 1 for e in decoder.explorers)


def test_a_prompt_that_fails_to_go_in_ends_its_own_request_only(model, monkeypatch):
    decoder = DexDecoder(model, explorers=3)
    decoder.share(2)
    first, prompt = decoder.stream(_prompt(60, 8), 24), _prompt(61, 12)
    next(first), next(first)  # in flight
    fill = crew.prefill

    def failing(member, view):
        if list(member.run.request.prompt) == prompt:
            raise MemoryError("no room for this prompt")
        return fill(member, view)

    monkeypatch.setattr(crew, "prefill", failing)
    with pytest.raises(DexError, match="its prompt failed to go in: no room for this prompt"):
        list(decoder.stream(prompt, 24))
    end = [e for e in first if isinstance(e, EndEvent)][0]
    assert end.tokens == _alone(model, _prompt(60, 8), 24, {})
    assert all(len(e.seats) == 1 for e in decoder.explorers)


def test_the_time_a_consumer_holds_its_events_is_its_readers_not_the_models(model, monkeypatch):
    """Each request's seconds: the rounds it was in and its prefill are the model's; the time its consumer held its
    round events (here 5 injected seconds on its last) is its reader's, and its end event, made when asked, counts
    it."""
    import time
    from types import SimpleNamespace

    held = [0.0]
    monkeypatch.setattr(
        "dex_core.runtime.clock.time", SimpleNamespace(perf_counter=lambda: time.perf_counter() + held[0])
    )
    decoder = DexDecoder(model, explorers=3)
    decoder.share(2)
    mine, other = decoder.stream(_prompt(70, 9), 12), decoder.stream(_prompt(71, 5), 30)
    next(other)
    events = []
    for event in mine:
        events.append(event)
        if isinstance(event, RoundEvent) and sum(len(e.commits) for e in events[1:]) == 12:
            held[0] += 5.0  # its reader holds its last round
    stats = events[-1].stats
    assert isinstance(events[-1], EndEvent) and stats.tokens == 12
    assert 5.0 <= stats.reader_seconds and stats.model_seconds < 5.0
    assert stats.model_seconds == pytest.approx(stats.round_seconds + stats.prefill_seconds, rel=1e-6)
    other.close()
