"""A decoder serves one run at a time (``dex_core.runtime.turns``): a second stream started on it before the first
ended gets the AR reference's tokens, and the first stops with a clear error rather than step on state the second
owns; steps advanced from two threads (a server's cancelled request still finishing its step) never overlap."""

import threading

import pytest
import torch

from dex_core import DexDecoder, DexError, ar_generate
from dex_core.testing import tiny_model
from dex_core.trace.events import EndEvent

NEW = 24


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama")


def _prompt(seed: int, n: int = 9) -> list[int]:
    return torch.randint(0, 96, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _tokens(events) -> list[int]:
    return [t for e in events if isinstance(e, EndEvent) for t in e.tokens]


def test_a_stream_begun_beside_another_is_exact_and_the_older_stops_with_a_clear_error(model):
    decoder = DexDecoder(model, explorers=3, prune="none")
    first, second = _prompt(1), _prompt(2, 14)
    older = decoder.stream(first, NEW)
    for _ in range(4):  # the start event and three rounds: its caches hold its prompt and lattice
        next(older)
    newer = list(decoder.stream(second, NEW))
    assert _tokens(newer) == ar_generate(model, second, NEW).tokens
    with pytest.raises(DexError, match="one run at a time"):
        next(older)
    assert decoder.generate(first, NEW).tokens == ar_generate(model, first, NEW).tokens  # nothing left behind


def test_steps_from_two_threads_never_overlap_and_the_newest_run_is_exact(model):
    decoder = DexDecoder(model, explorers=4, prune="none")
    first, second = _prompt(3), _prompt(4, 17)
    older, stepped, outcome = decoder.stream(first, 200), threading.Event(), []

    def advance():  # a cancelled request's thread, still running its stream's steps
        try:
            for i, _ in enumerate(older):
                if i == 3:
                    stepped.set()
            outcome.append("finished")
        except DexError as err:
            outcome.append(str(err))

    thread = threading.Thread(target=advance)
    thread.start()
    assert stepped.wait(60)
    newer = decoder.generate(second, NEW)
    thread.join(60)
    assert newer.tokens == ar_generate(model, second, NEW).tokens
    assert outcome and "one run at a time" in outcome[0]
