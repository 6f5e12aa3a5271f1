"""Host work off the critical path (issue 59): on an accelerator a round's record is made while the next round's
stage steps run; on the CPU, where a step runs as it is called, each round's event reaches the consumer before the
next round's first step. Both orders make the same trace and tokens."""

import dataclasses

import pytest

from dex_core import DexDecoder, hf_greedy
from dex_core.runtime import engine
from dex_core.testing import tiny_model
from dex_core.trace.events import RoundEvent


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama", layers=6)


def steps_before_each_round(decoder, prompt, new):
    """Each round event (timings dropped) with the stage steps that had run when the consumer got it."""
    calls = []
    for e in decoder.explorers:
        step = e.step
        e.step = lambda hidden, table, step=step: (calls.append(1), step(hidden, table))[1]
    seen = []
    for event in decoder.stream(prompt, new):
        if isinstance(event, RoundEvent):
            seen.append((dataclasses.replace(event, timings={}), len(calls)))
    return seen


def ran(event: RoundEvent) -> int:
    return sum(1 for b in event.batches if b)  # one stage step per explorer with a batch


def test_on_the_cpu_each_rounds_event_comes_before_the_next_rounds_steps(model):
    prompt = [5, 9, 2, 7, 5, 9, 2]
    decoder = DexDecoder(model, explorers=3, prune=2)
    seen = steps_before_each_round(decoder, prompt, 14)
    assert any(e.commits for e, _ in seen)
    total = 0
    for event, steps in seen:
        total += ran(event)
        assert steps == total  # this round's steps, none of the next one's
    tokens = [c.token for e, _ in seen for c in e.commits]
    assert tokens == hf_greedy(model, prompt, 14)


def test_on_an_accelerator_a_record_waits_for_the_next_rounds_steps_and_is_the_same(model, monkeypatch):
    prompt = [5, 9, 2, 7, 5, 9, 2]
    cpu = steps_before_each_round(DexDecoder(model, explorers=3, prune=2), prompt, 14)
    monkeypatch.setattr(engine, "overlaps", lambda view: True)
    overlapped = steps_before_each_round(DexDecoder(model, explorers=3, prune=2), prompt, 14)
    assert [e for e, _ in overlapped] == [e for e, _ in cpu]  # the same records, made a round later
    rounds = [e for e, _ in cpu]
    for r, (_, steps) in enumerate(overlapped[:-1]):
        assert steps == sum(ran(e) for e in rounds[: r + 2])  # the next round's steps already ran
    assert overlapped[-1][1] == sum(ran(e) for e in rounds)  # the last: after the loop


def fake_cuda_events(monkeypatch) -> list:
    """CUDA's events as the clock uses them (recorded, passed at once here, one second a span), for a machine
    without CUDA: the list it returns holds every event made."""
    import torch

    made = []

    class Event:
        def __init__(self, enable_timing):
            made.append(self)

        def record(self, stream):
            pass

        def query(self):
            return True

        def synchronize(self):
            pass

        def elapsed_time(self, other):
            return 1000.0  # ms

    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device: None)
    return made


def test_the_clock_records_events_it_read_again_rather_than_making_new_ones(monkeypatch):
    from dex_core.runtime.clock import Clock

    made = fake_cuda_events(monkeypatch)
    clock = Clock("cpu")
    clock.cuda = True  # the CUDA path, on a machine without one
    for _ in range(100):  # a round: spans, then its read
        for name in ("plan", "masks", ("expand", 0), "decode"):
            with clock.span(name):
                pass
        assert clock.read(("plan", "masks", ("expand", 0), "decode"), wait=False) == dict.fromkeys(
            ("plan", "masks", ("expand", 0), "decode"), 1.0
        )
    assert len(made) == 8  # the first round's four spans; every later one records them again


def test_a_run_on_cuda_makes_its_clock_events_once_not_every_round(monkeypatch):
    from dex_core import DexDecoder
    from dex_core.runtime import engine
    from dex_core.runtime.clock import Clock
    from dex_core.testing import tiny_model

    made = fake_cuda_events(monkeypatch)

    def cuda_clock(device):  # the CUDA path of the run's clock, on a machine without one
        clock = Clock(device)
        clock.cuda = True
        return clock

    monkeypatch.setattr(engine, "Clock", cuda_clock)
    decoder = DexDecoder(tiny_model("llama"), explorers=3, prune="none")
    counts = []
    for n in (40, 160):  # four times the rounds
        made.clear()
        result = decoder.generate(list(range(5, 14)), n)
        counts.append(len(made))
        assert result.stats.reader_seconds > 0  # the reader's spans were read and counted
    # as many as a round's spans need at once: its reader's too are read, so no round makes more
    assert counts[1] == counts[0], counts
