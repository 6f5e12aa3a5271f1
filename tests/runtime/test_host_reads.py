"""One host read per rank per round: the round's choices reach the host in one transfer on the sequential schedule and
on the distributed one (a real gloo world of two spawned processes), whatever the row budget, draft chains,
sampling or trace candidates; ``HostReads`` counts what a GPU would wait for."""

import torch
import torch.multiprocessing as mp

from dex_core import DexDecoder
from dex_core.host_reads import HostReads, reads_per_event
from dex_core.runtime.reference import ar_generate, hf_greedy
from dex_core.testing import tiny_model
from dex_core.trace.events import EndEvent, RoundEvent

PROMPT = [3, 5, 7, 9, 3, 5, 7, 9, 3, 5]  # repeats: draft chains find drafts


def rounds_reads(decoder, prompt, new: int, **options) -> tuple[list[int], list[int]]:
    """Host reads counted in each round of a sequential run, and its tokens."""
    reads, tokens = [], None
    for event, counted in reads_per_event(decoder.stream(prompt, new, **options)):
        if isinstance(event, RoundEvent):
            reads.append(counted.count)
        tokens = event.tokens if isinstance(event, EndEvent) else tokens
    return reads, tokens


def test_the_counter_sees_every_kind_of_host_read_and_restores_cuda_events():
    original = torch.cuda.Event.synchronize
    t = torch.arange(4.0)
    with HostReads() as counted:
        t.tolist(), t[1].item(), int(t[2]), float(t[3]), t.cpu(), [0, 1][t[1].long()]
        if t[1] > 0:
            assert torch.cuda.Event.synchronize is not original
        torch.cat([t, t]).sum()  # no read: stays a tensor
    assert [name for name, _ in counted.where] == [
        "tolist", "item", "__int__", "__float__", "cpu", "__index__", "__bool__",
    ]  # fmt: skip
    assert counted.where[0][1].startswith("test_host_reads.py:") and torch.cuda.Event.synchronize is original


def test_a_sequential_round_reads_the_host_once_at_any_k_budget_or_sampling():
    model = tiny_model("llama", layers=8, seed=0)
    for K, options in ((4, {"prune": "auto"}), (8, {"prune": "none", "trace_top": 5}), (8, {"prune": 3})):
        decoder = DexDecoder(model, explorers=K, **options)
        reads, tokens = rounds_reads(decoder, PROMPT, 20)
        assert reads and set(reads) == {1}, (K, options, reads)
        assert tokens == hf_greedy(model, PROMPT, 20)
    sampled = DexDecoder(model, explorers=4, prune="auto")
    reads, tokens = rounds_reads(sampled, PROMPT, 16, temperature=0.8, top_k=20, seed=3)
    assert (
        set(reads) == {1}
        and tokens == ar_generate(model, PROMPT, 16, temperature=0.8, top_k=20, seed=3).tokens
    )


def test_a_distributed_round_reads_the_host_once_on_every_rank(tmp_path):
    import faults

    context = mp.get_context("spawn")
    out = context.Queue()
    procs = [
        context.Process(target=faults.host_reads_of_rank, args=(rank, str(tmp_path), PROMPT, 16, out))
        for rank in range(2)
    ]
    for p in procs:
        p.start()
    try:
        results = sorted(out.get(timeout=120) for _ in procs)
    finally:
        for p in procs:
            p.join(timeout=30)
            p.kill()
    model = tiny_model("llama", layers=8, seed=0)
    for rank, reads, tokens in results:
        assert reads and set(reads) == {1}, (rank, reads)
        assert tokens == hf_greedy(model, PROMPT, 16)
    assert len(results[0][1]) == len(results[1][1])  # the same rounds on both ranks


class FakeEvent:
    """A CUDA event's protocol on the host: ``done`` says whether the device has passed it."""

    def __init__(self, at: float, done: bool):
        self.at, self.done, self.synced = at, done, 0

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        self.synced += 1
        self.done = True

    def elapsed_time(self, later) -> float:
        return (later.at - self.at) * 1000.0


def test_on_cuda_a_rounds_timings_never_wait_and_a_final_read_waits_only_for_what_is_left():
    from dex_core.runtime.clock import Clock

    clock = Clock("cpu")
    clock.cuda = True  # the CUDA path, on events the test controls
    first = [FakeEvent(0.0, True), FakeEvent(0.5, True)]
    second = [FakeEvent(1.0, True), FakeEvent(1.25, False)]  # the device has not passed its end yet
    clock._spans = {"expand": [tuple(first), tuple(second)]}
    assert clock.seconds("expand", wait=False) == 0.5  # the first span only; the second stays for later
    assert second[1].synced == 0 and len(clock._spans["expand"]) == 1
    assert clock.read() == {"expand": 0.25} and second[1].synced == 1  # waited for, once, at the end
    clock._spans = {"decode": [(FakeEvent(2.0, True), FakeEvent(2.5, True))]}
    done = clock._spans["decode"][0][1]
    assert clock.read() == {"decode": 0.5} and done.synced == 0  # passed already: no wait
