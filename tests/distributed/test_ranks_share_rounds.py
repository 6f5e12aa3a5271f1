"""Requests share rounds on real explorer processes (gloo on CPU): the ranks agree each step which requests are in the
round (``dex_core.distributed.roster``), one send carries every request's rows and one all-gather their choices
(``crew_wire``), and each request gets exactly its tokens alone; a dead rank ends every request in flight with one
error, and the next request starts a fresh group."""

import os
import signal

import pytest
import torch
from helpers import interleaved

from dex_core import DexDecoder, ExplorerError, ar_generate
from dex_core.testing import tiny_tokenizer
from dex_core.trace.events import EndEvent, RoundEvent

pytestmark = pytest.mark.process

# light heads of 8 rows, pruning to 2 new branches, draft chains forced on
OPTIONS = {"tokenizer": tiny_tokenizer(), "proposal_vocab": 8, "trace_top": 3, "prune": 2, "draft": "gate=0"}
SAMPLED = [{"temperature": 0.8, "seed": 3}, {"temperature": 1.2, "top_k": 9, "top_p": 0.9, "seed": 4}]


def _prompt(seed: int, n: int) -> list[int]:
    head = torch.randint(0, 96, (n,), generator=torch.Generator().manual_seed(seed)).tolist()
    return head + head[: n // 2]  # a repeated stretch: draft chains find their n-grams


def _requests() -> list[tuple[list[int], int, dict]]:
    """Six requests: prompts of 1 to 18 tokens, 12 to 24 new tokens, greedy and seeded sampling."""
    lengths, news = [1, 9, 14, 5, 21, 7], [20, 24, 12, 18, 16, 22]
    options = [{}, SAMPLED[0], {}, SAMPLED[1], {}, {}]
    prompts = [[7] if n == 1 else _prompt(i, n) for i, n in enumerate(lengths)]
    prompts[4] = [4, 8, 15, 16, 23, 42] * 3  # it commits along draft chains
    return list(zip(prompts, news, options))


@pytest.fixture(scope="module")
def shared(qwen3):
    """A distributed decoder of 3 explorer processes whose requests share rounds."""
    decoder = DexDecoder(
        qwen3, explorers=3, backend="distributed", devices=("cpu",) * 3, threads=1, **OPTIONS
    )
    decoder.share(6)
    yield decoder
    decoder.close()


def test_requests_sharing_rounds_on_explorer_processes_each_get_their_tokens_alone(qwen3, shared):
    requests = _requests()
    # four at once, request 2 cancelled by its consumer at its 6th event, two joining at the 4th turn, mid-run
    events = interleaved(shared, requests, 4, (2, 6), 4)
    alone = DexDecoder(qwen3, explorers=3, **OPTIONS)
    for i, (prompt, new, options) in enumerate(requests):
        own = alone.generate(prompt, new, **options).tokens
        committed = [c.token for e in events[i] if isinstance(e, RoundEvent) for c in e.commits]
        if i == 2:
            assert committed == own[: len(committed)] and len(committed) < new
            continue
        assert isinstance(events[i][-1], EndEvent) and events[i][-1].tokens == committed == own, i
        if not options:
            assert own == ar_generate(qwen3, prompt, new).tokens
    rounds = [e for i in events for e in events[i] if isinstance(e, RoundEvent)]
    assert any(len(e.commits) > 1 for e in rounds)  # draft chains committed
    # the ranks ran fewer rounds than the requests' rounds added up (rank 0's tally on the group's board, /metrics')
    tally = shared.group.crew
    assert 0 < tally.rounds < len(rounds) and tally.rows > 0


def test_a_dead_rank_ends_every_request_in_flight_with_one_error_and_the_next_starts_fresh(qwen3, shared):
    prompts = [_prompt(40 + i, 6) for i in range(3)]
    streams = [shared.stream(p, 200) for p in prompts]
    for _ in range(3):  # start events, then rounds: all three in flight
        for s in streams:
            next(s)
    pids = shared.group.pids()
    os.kill(pids[1], signal.SIGKILL)
    errors = []
    for s in streams:
        with pytest.raises(ExplorerError) as err:
            list(s)
        errors.append(str(err.value))
    assert errors[0].startswith("explorer rank 1 died (was killed by SIGKILL)") and len(set(errors)) == 1
    after = shared.generate(prompts[0], 16)  # a fresh group, its requests still sharing rounds
    assert after.tokens == ar_generate(qwen3, prompts[0], 16).tokens
    assert set(shared.group.pids()).isdisjoint(pids) and shared.group.shares


def test_the_rows_a_group_counts_a_round_are_every_stages_as_in_one_process(qwen3, shared):
    """``/metrics``' rows a round: rank 0 once counted its own stage's alone; every rank holds every request's plan,
    so the group counts what the sequential schedule counts, round for round."""
    prompt, new = [4, 8, 15, 16, 23, 42] * 3, 14
    local = DexDecoder(qwen3, explorers=3, **OPTIONS)
    local.share(6)
    assert shared.generate(prompt, new).tokens == local.generate(prompt, new).tokens
    rows = local.schedule.crew.rows
    assert shared.group.crew.rows == rows > 0
