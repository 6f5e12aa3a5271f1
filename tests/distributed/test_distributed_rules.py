"""The distributed schedule's device and wait rules, proved on CPU without starting explorer processes:
how ranks wait for their peers, which backend and devices they agree on, and how torchrun ranks pick a GPU."""

import inspect
import threading
import time
import warnings
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from dex_core.analysis.profile import decode_order_seconds
from dex_core.config import DexError
from dex_core.distributed.group import ExplorerGroup
from dex_core.distributed.link import DistLink
from dex_core.distributed.placement import resolve_devices
from dex_core.distributed.rank import DataLink, data_backend, init_options, round_board, warm_up
from dex_core.distributed.torchrun import torchrun_device
from dex_core.runtime.links import Link, LocalLink


def gloo_pair():
    """Two gloo process groups of one world of 2 in this process (ranks 0 and 1), connected in threads."""
    store, groups = dist.HashStore(), [None, None]

    def join(rank):
        groups[rank] = dist.ProcessGroupGloo(dist.PrefixStore("pair", store), rank, 2, timedelta(seconds=20))

    threads = [threading.Thread(target=join, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return groups


def link(rank=1, count=2, device="cpu", op_timeout=1.0, staged=False):
    return DistLink(rank, count, 4, torch.float32, device, None, 0, op_timeout, staged=staged)


def gather(group, rank):
    """Start rank ``rank``'s all-gather of a (2, 4) tensor of its rank on ``group``; (work, gathered)."""
    out = [torch.empty(2, 4) for _ in range(2)]
    return group.allgather([out], [torch.full((2, 4), float(rank))]), out


# gloo's send/recv works report completion only once waited for, so the CUDA path (a poll) is shown on the
# gloo all-gather, which it also waits for on a GPU box (the control group), and the CPU path on a receive
@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_a_peer_that_never_sends_fails_the_wait_within_op_timeout_naming_the_rank(device):
    peer, waiting_group = gloo_pair()
    waiting = link(device=device)
    work = waiting_group.recv([torch.empty(2, 4)], 0, 7) if device == "cpu" else gather(waiting_group, 1)[0]
    tic = time.monotonic()
    with pytest.raises(
        TimeoutError,
        match=r"explorer rank 1 timed out after 1 s \(op_timeout\) waiting for "
        r"the rows from rank 0",
    ):
        waiting._wait([work], "the rows from rank 0")
    seconds = time.monotonic() - tic
    assert 0.9 < seconds < 2.5 and waiting.comm_seconds == pytest.approx(seconds, abs=0.2)
    if device == "cuda":  # the poll left the all-gather posted: the late peer still completes it
        gather(peer, 0)[0].wait()
        work.wait()


def test_the_poll_returns_once_the_peer_joins_and_counts_the_seconds():
    peer, waiting_group = gloo_pair()
    waiting = link(device="cuda", op_timeout=20.0)
    work, out = gather(waiting_group, 1)
    late = threading.Timer(0.3, lambda: gather(peer, 0)[0].wait())
    late.start()
    tic = time.monotonic()
    waiting._wait([work])
    late.join()
    assert time.monotonic() - tic < 5 and waiting.comm_seconds >= 0.25
    assert [t[0, 0].item() for t in out] == [0.0, 1.0]


class FakeWork:
    """A work that completes on its ``done``-th ``is_completed()`` call and records how it was waited for."""

    def __init__(self, done=3):
        self.done, self.polls, self.waits = done, 0, []

    def is_completed(self):
        self.polls += 1
        return self.polls >= self.done

    def wait(self, *timeout):
        self.waits.append(timeout)
        return True


def test_cuda_works_are_polled_then_waited_for_without_a_timeout_and_cpu_works_with_one():
    nccl, gloo = [FakeWork(3), FakeWork(5)], [FakeWork(), FakeWork()]
    link(device="cuda:0")._wait(nccl)  # NCCL's wait(timeout) would sleep in 1 ms steps on the host
    assert [w.polls for w in nccl] == [3, 5] and [w.waits for w in nccl] == [[()], [()]]
    link(device="cpu", op_timeout=4.0)._wait(gloo)  # gloo's wait(timeout) blocks on a condition variable
    assert all(w.polls == 0 and len(w.waits) == 1 for w in gloo)
    assert all(timedelta(seconds=3) < w.waits[0][0] <= timedelta(seconds=4) for w in gloo)
    assert DistLink._poll([FakeWork(2)], time.perf_counter() + 5) is True
    tic = time.perf_counter()
    assert DistLink._poll([FakeWork(10**9)], tic + 0.05) is False and time.perf_counter() - tic < 1


def test_the_warm_up_is_an_exchange_that_every_rank_takes_part_in(monkeypatch):
    posted = {}
    monkeypatch.setattr(dist, "P2POp", lambda op, tensor, peer: (op.__name__, peer, tuple(tensor.shape)))
    for rank in range(4):
        monkeypatch.setattr(
            dist, "batch_isend_irecv", lambda ops, rank=rank: posted.setdefault(rank, ops) and []
        )
        warm_up(link(rank, 4))
    assert posted == {
        0: [("isend", 1, (1, 4))],
        1: [("isend", 2, (1, 4)), ("irecv", 0, (1, 4))],
        2: [("isend", 3, (1, 4)), ("irecv", 1, (1, 4))],
        3: [("irecv", 2, (1, 4))],
    }


def test_an_nccl_world_forms_its_communicator_in_init_process_group():
    assert init_options("nccl", "cuda:1") == {"device_id": torch.device("cuda:1")}
    assert init_options("gloo", "cpu") == {}


def report(device, gpu=None, host="node-a", share=False, stage=False):
    return {"device": device, "host": host, "gpu": gpu, "share": share, "stage": stage}


def test_ranks_agree_on_the_data_backend_or_refuse_clearly():
    assert data_backend([report("cpu")] * 3) == DataLink("gloo", staged=False)
    # per-rank CUDA_VISIBLE_DEVICES: every rank's cuda:0, three different GPUs (one on another node)
    one_each = [report("cuda:0", "GPU-a"), report("cuda:0", "GPU-b"), report("cuda:0", "GPU-a", "node-b")]
    assert data_backend(one_each) == DataLink("nccl", staged=False)
    with pytest.raises(
        DexError, match=r"disagree on the device \(rank 0 on cuda:0, rank 1 on cuda:1, rank 2 on cpu\)"
    ):
        data_backend([report("cuda:0", "GPU-a"), report("cuda:1", "GPU-b"), report("cpu")])
    with pytest.raises(
        DexError,
        match=r"ranks 0 and 2 are on the same GPU \(cuda:0 on node-a\); NCCL refuses.*"
        r"torchrun ranks cannot share a GPU",
    ):  # torchrun's ranks do not allow it
        data_backend([report("cuda:0", "GPU-a"), report("cuda:1", "GPU-b"), report("cuda:0", "GPU-a")])


def test_ranks_that_share_a_gpu_all_stage_their_rows_through_the_host_over_gloo():
    shared = [
        report("cuda:0", "GPU-a", share=True),
        report("cuda:1", "GPU-b", share=True),
        report("cuda:0", "GPU-a", share=True),
    ]  # one shared GPU stages every rank, not just those two
    assert data_backend(shared) == DataLink("gloo", staged=True)
    apart = [report("cuda:0", "GPU-a", share=True), report("cuda:1", "GPU-b", share=True)]
    assert data_backend(apart) == DataLink("nccl", staged=False)  # allowed to share, but each has its own
    forced = [report("cpu", stage=k == 1) for k in range(3)]  # one rank asking stages all: the CPU test path
    assert data_backend(forced) == DataLink("gloo", staged=True)
    assert data_backend([report("cuda:0", "GPU-a", stage=True), report("cuda:1", "GPU-b")]).staged


def test_a_staged_link_on_a_gpu_sends_host_rows_and_waits_as_gloo_not_by_polling(monkeypatch):
    # staged, the data group is gloo, whose send/recv works report completion only once waited for: a
    # poll (the NCCL wait) would spin until op_timeout; rows received land on the device (a no-op here)
    sent, works = [], [FakeWork()]
    monkeypatch.setattr(dist, "P2POp", lambda op, tensor, peer: sent.append((op.__name__, tensor.device)))
    monkeypatch.setattr(dist, "batch_isend_irecv", lambda ops: works)
    staged = link(0, 2, device="cuda:0", op_timeout=4.0, staged=True)
    assert staged._swap(torch.ones(3, 4), 0) is None
    assert sent == [("isend", torch.device("cpu"))]
    assert works[0].polls == 0 and len(works[0].waits) == 1 and works[0].waits[0][0] > timedelta(seconds=3)


def gpus(monkeypatch, count):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)


def env(local, ranks):
    return {
        "RANK": str(local),
        "WORLD_SIZE": str(ranks),
        "LOCAL_RANK": str(local),
        "LOCAL_WORLD_SIZE": str(ranks),
    }


def test_torchrun_ranks_pick_their_gpu_from_local_rank_and_all_refuse_too_few_gpus(monkeypatch):
    gpus(monkeypatch, 8)
    assert [torchrun_device(env(k, 4)) for k in range(4)] == ["cuda:0", "cuda:1", "cuda:2", "cuda:3"]
    assert torchrun_device(env(2, 4), "cpu") == "cpu"
    gpus(monkeypatch, 1)  # one CUDA_VISIBLE_DEVICES per rank: each sees its own GPU as cuda:0
    assert [torchrun_device(env(k, 4), "cuda") for k in range(4)] == ["cuda:0"] * 4
    gpus(monkeypatch, 2)  # every rank refuses alike: none falls back to CPU while the others take a GPU
    for k in range(4):
        with pytest.raises(DexError, match=r"shows 2 GPUs to 4 ranks.*--nproc-per-node 2"):
            torchrun_device(env(k, 4))
    with pytest.raises(DexError, match="each rank takes the GPU of its LOCAL_RANK"):
        torchrun_device(env(0, 2), "cuda:1")
    gpus(monkeypatch, 0)
    assert [torchrun_device(env(k, 3)) for k in range(3)] == ["cpu"] * 3
    with pytest.raises(DexError, match="this rank sees no GPU"):
        torchrun_device(env(0, 3), "cuda")


def test_default_devices_take_one_gpu_each_or_share_the_visible_gpus_with_a_warning(monkeypatch):
    gpus(monkeypatch, 2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # one GPU each: nothing to warn about
        assert resolve_devices(None, 2) == ["cuda:0", "cuda:1"]
        assert resolve_devices(("cuda:1", "cuda:0"), 2) == ["cuda:1", "cuda:0"]
    staged = (
        r"explorers share cuda:0, cuda:1 \(cuda:0, cuda:1, cuda:0, cuda:1\): hidden rows are staged through"
    )
    with pytest.warns(UserWarning, match=staged + " the host over gloo"):
        assert resolve_devices(None, 4) == ["cuda:0", "cuda:1", "cuda:0", "cuda:1"]
    with pytest.warns(UserWarning, match=r"explorers share cuda:0 \(cuda:0, cuda:1, cuda:0\)"):
        assert resolve_devices(("cuda:0", "cuda:1", "cuda:0"), 3) == ["cuda:0", "cuda:1", "cuda:0"]
    with pytest.raises(DexError, match=r"cuda:2 is not available: 2 GPU\(s\) visible .* e.g. cuda:0,cuda:0"):
        resolve_devices(("cuda:0", "cuda:2"), 2)
    gpus(monkeypatch, 1)
    with pytest.warns(UserWarning, match=r"explorers share cuda:0 \(cuda:0, cuda:0, cuda:0\)"):
        assert resolve_devices(None, 3) == ["cuda:0"] * 3
    gpus(monkeypatch, 0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no GPU at all: CPU is the plain default, nothing to warn about
        assert resolve_devices(None, 3) == ["cpu"] * 3
        assert resolve_devices("cpu,cpu".split(","), 2) == ["cpu", "cpu"]


class StepClock:
    """A clock whose every span lasts the next of ``seconds``."""

    def __init__(self, seconds):
        self.seconds = iter(seconds)

    def stamp(self):
        return None

    def since(self, start):
        return next(self.seconds)


def test_the_profile_times_its_blocks_in_a_decodes_order_not_each_in_a_loop():
    calls = []
    blocks = {name: (lambda name=name: calls.append(name)) for name in ("layer", "head")}
    got = decode_order_seconds(blocks, 3, StepClock([1.0, 10.0, 3.0, 30.0, 2.0, 20.0]))
    assert calls == ["layer", "head"] * 4  # one warm-up pass, then every block once per repeat
    assert got == {"layer": 2.0, "head": 20.0}


def test_the_exchange_profile_uses_the_explorers_link_and_its_cache_key_names_it(
    llama, monkeypatch, tmp_path
):
    from dex_core.analysis import profile as prof

    gpus(monkeypatch, 2)
    assert prof.link_devices("cuda:0") == ("cuda:0", "cuda:1") and prof.link_devices("cpu") == ("cpu", "cpu")
    gpus(monkeypatch, 1)  # one GPU: the explorers (one GPU each) would run on CPU, over gloo
    assert prof.link_devices("cuda:0") == ("cpu", "cpu")
    monkeypatch.setattr(prof, "CACHE", tmp_path)
    monkeypatch.setattr(
        prof, "_compute_profile", lambda *_: {part: {1: 1.0} for part in ("layer", "head", "proposal")}
    )
    links = []
    monkeypatch.setattr(
        prof, "exchange_profile", lambda h, d, r, link: links.append(link) or {1: 2.0, 2: 3.0}
    )
    model = llama
    got = prof.measure_profile(model, 16, 2, log=lambda *_: None)
    nccl = prof.measure_profile(model, 16, 2, log=lambda *_: None, link=("cuda:0", "cuda:1"))
    assert links == [("cpu", "cpu"), ("cuda:0", "cuda:1")]
    assert "-float64-cpu-xgloo-" in got["key"] and "-float64-cpu-xnccl-" in nccl["key"]
    assert got["exchange_link"] == {"backend": "gloo", "devices": ["cpu", "cpu"]}
    assert (
        prof.measure_profile(model, 16, log=lambda *_: pytest.fail("not cached")) == got
    )  # tables read back


def test_both_links_meet_the_contract_the_round_loop_relies_on():
    methods = [m for m, v in vars(Link).items() if callable(v) and not m.startswith("_")]
    assert sorted(methods + list(Link.__annotations__)) == sorted(
        ["cancelled", "comm_seconds", "exchange", "inputs", "keep", "post", "prefill", "reset"]
    )
    for made in (LocalLink(), link()):
        assert made.comm_seconds == 0.0 and made.cancelled is False
        for m in methods:
            ours, contract = inspect.signature(getattr(made, m)), inspect.signature(getattr(Link, m))
            assert list(ours.parameters) == list(contract.parameters)[1:], (type(made).__name__, m)


def test_rank_0_sends_its_events_in_batches_of_the_batch_window_and_slow_rounds_and_the_end_at_once():
    from dex_core.distributed import event_batch
    from dex_core.trace.events import EndEvent, RoundEvent
    from dex_core.trace.stats import GenerationStats

    sent, now, window = [], [0.0], event_batch.BATCH_SECONDS
    batch = event_batch.EventBatch(lambda *msg: sent.append(msg), 7, clock=lambda: now[0])

    def event(kind: str, t: float):  # a round (or the end) made at t
        if kind == "end":
            return EndEvent(tokens=[], stop="length", stats=GenerationStats(2, [1, 2], wall_seconds=t))
        fields = dict(state_before=0, state_after=0, batches=[[]], nodes=[], collapse=None, alive=[])
        return RoundEvent(round=1, **fields, timings={"round": t})

    def made(e) -> float:
        return e.stats.wall_seconds if isinstance(e, EndEvent) else e.timings["round"]

    def at(t: float, kind: str = "round") -> list:
        now[0] = t
        batch.add(event(kind, t))
        return [(k, rid, [made(e) for e in events]) for k, rid, events in sent]

    assert at(0.3 * window) == at(0.6 * window) == []  # fast rounds: held
    assert at(window) == [("events", 7, [0.3 * window, 0.6 * window, window])]  # the window passed: they go
    assert at(3 * window)[-1] == ("events", 7, [3 * window])  # a slow round goes at once
    assert len(at(3.1 * window)) == 2 and at(3.2 * window, "end")[-1] == (
        "events",
        7,
        [3.1 * window, 3.2 * window],
    )
    assert batch.events == []


def test_the_rank_behind_on_the_board_of_rounds_is_named_with_the_rounds(tmp_path):
    """Ranks store their rounds on the board through their own mappings; once the others timed out waiting, the
    parent's blame reads the board and names the rank that fell behind, with the rounds."""
    path = tmp_path / "rounds"
    path.write_bytes(bytes(8 * 3))
    group = ExplorerGroup.__new__(ExplorerGroup)  # the parent's side only: no processes
    group.count, group._procs, group._rounds = 3, None, round_board(str(path))
    timeouts = [("error", k, (f"TimeoutError: explorer rank {k} timed out after 6 s", "")) for k in (0, 2)]
    for rounds, named in [
        ([7, 6, 7], "explorer rank 1 went silent at round 7 while the others waited at round 7"),
        ([4, 4, 5], "explorer ranks 0, 1 went silent at round 5 while the others waited at round 5"),
    ]:
        for rank, r in enumerate(rounds):
            round_board(str(path))[rank] = r  # as rank ``rank`` writes it, each round
        assert group._blame(timeouts, [(0, 1), (2, 1)], None) == named
