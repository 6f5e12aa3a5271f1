"""The distributed schedule: real explorer processes on torch.distributed (gloo on CPU). Groups that only serve
requests are conftest's ``explorer_group``s, shared by the session; the tests that kill, stop or patch explorers,
and those of the CLI and of scripts, start their own."""

import os
import signal
import time

import psutil
import pytest
import torch
from faults import RaiseOnce
from helpers import live_children, started_since

from dex_core import DexDecoder, ar_generate
from dex_core.distributed.group import ExplorerError, ExplorerGroup
from dex_core.testing import tiny_tokenizer
from dex_core.trace.events import RoundEvent

pytestmark = pytest.mark.process  # every test here starts explorer processes, or a script that does

# a one-token prompt (no prefill), a prompt prefilled at once, and a repeating one that commits along draft chains
PROMPTS = [[9], [5, 17, 3, 88, 40, 2, 61], [4, 8, 15, 16, 23, 42] * 3]
SAMPLED = dict(temperature=0.9, top_k=30, top_p=0.95)


def without_timings(trace):
    return [{k: v for k, v in e.record().items() if k not in ("timings", "stats")} for e in trace]


def running(pids) -> list[int]:
    return [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]


@pytest.fixture(scope="module")
def model(qwen3):
    """The golden traces' family (conftest), shared with the other files' explorer groups."""
    return qwen3


@pytest.fixture(scope="module")
def light():
    """Light heads of 8 rows, a recorded top 3, pruning to 2 new branches, and draft chains forced on (every
    lookup runs all stages); one tokenizer, so that every test asking for these options gets the same group."""
    return {"tokenizer": tiny_tokenizer(), "proposal_vocab": 8, "trace_top": 3, "prune": 2, "draft": "gate=0"}


@pytest.mark.parametrize("K,is_light", [(2, False), (3, True)])
def test_distributed_equals_sequential_equals_ar_over_several_calls_of_one_group(
    model, explorer_group, light, K, is_light
):
    options = light if is_light else {}
    dist_decoder = explorer_group(model, K, **options)
    sequential_decoder = DexDecoder(model, explorers=K, **options)
    pids = dist_decoder.group.pids()
    assert len(pids) == K and all(psutil.pid_exists(p) for p in pids)
    assert dist_decoder.group.data_link == ("gloo", False)  # CPU ranks: rows straight over gloo
    for i, prompt in enumerate(PROMPTS):
        sequential = sequential_decoder.generate(prompt, 24)
        distributed = dist_decoder.generate(prompt, 24)
        assert distributed.tokens == sequential.tokens == ar_generate(model, prompt, 24).tokens
        assert without_timings(distributed.trace) == without_timings(sequential.trace)
        chained = [e for e in distributed.trace if len(e.commits) > 1]
        assert chained or not is_light or i < 2  # the repeating prompt commits along draft chains
        sampled = dist_decoder.generate(prompt, 16, **SAMPLED, seed=i)
        assert sampled.tokens == ar_generate(model, prompt, 16, **SAMPLED, seed=i).tokens
        piped = dist_decoder.generate(prompt, 8, pipeline=True)  # AR through the same stages and ranks
        assert piped.tokens == ar_generate(model, prompt, 8).tokens and piped.stats.rounds == K * 8
    assert dist_decoder.group.pids() == pids  # the same processes served every call
    # every distributed round exchanges (rows, or at least the control all-gather); the sequential schedule never
    rounds = [e for e in distributed.trace if isinstance(e, RoundEvent)]
    assert all(len(e.timings["expand"]) == K and e.timings["communication"] > 0 for e in rounds)
    assert distributed.trace[-1].stats.communication_seconds == pytest.approx(
        sum(e.timings["communication"] for e in rounds)
    )
    assert all(e.timings["communication"] == 0 for e in sequential.trace if isinstance(e, RoundEvent))
    assert sequential.trace[-1].stats.communication_seconds == 0


def test_a_reused_explorer_group_gives_the_trace_of_a_fresh_one(model, explorer_group, light):
    """The same requests on the session's group, after it served others (a longer call, a sampled one, a stream
    stopped at round 5), and on a freshly started group: the same traces, timings aside. The fresh group's first
    request has a one-token prompt (no prefill): in its first round only ranks 0 and 1 exchange rows, the rest go
    straight to the control all-gather (on NCCL this hung before the communicator was formed eagerly and warmed up
    by every rank)."""
    reused = explorer_group(model, 3, **light)
    served = reused.group.pids()
    reused.generate(PROMPTS[1] * 3, 32)
    reused.generate(PROMPTS[2], 12, **SAMPLED, seed=7)
    stream = reused.stream(PROMPTS[2], 60)
    for event in stream:
        if isinstance(event, RoundEvent) and event.round == 5:
            break
    stream.close()
    requests = [(PROMPTS[0], {}), (PROMPTS[2], {}), (PROMPTS[1], dict(SAMPLED, seed=3))]
    again = [without_timings(reused.generate(p, 24, **sampling).trace) for p, sampling in requests]
    assert reused.group.pids() == served  # one group served every call
    with DexDecoder(
        model, explorers=3, backend="distributed", devices=("cpu",) * 3, threads=1, **light
    ) as fresh:
        pids = fresh.group.pids()
        first = [without_timings(fresh.generate(p, 24, **sampling).trace) for p, sampling in requests]
    assert set(pids).isdisjoint(served) and first == again
    assert any(len(e.get("commits", [])) > 1 for e in first[1])  # compared: commits along draft chains too
    assert running(pids) == []  # closed: every explorer ended


class Kinds:
    """A parent's connection to a rank that notes the kind of each message it receives (``wait`` needs fileno)."""

    def __init__(self, conn, kinds: list):
        self.conn, self.kinds = conn, kinds

    def fileno(self) -> int:
        return self.conn.fileno()

    def recv(self):
        msg = self.conn.recv()
        self.kinds.append(msg[0])
        return msg

    def __getattr__(self, name):
        return getattr(self.conn, name)


def test_ranks_note_each_round_on_the_shared_board_and_send_the_parent_no_message_a_round(
    model, explorer_group, monkeypatch
):
    """Liveness is shared memory, not a pickled message a round from every rank: over a run the parent receives
    rank 0's event batches only, and the board of rounds holds every rank's last round."""
    decoder = explorer_group(model, 2)
    group, kinds = decoder.group, []
    monkeypatch.setattr(group, "_conns", [Kinds(c, kinds) for c in group._conns])
    result = decoder.generate(PROMPTS[1], 24)
    last = [e.round for e in result.trace if isinstance(e, RoundEvent)][-1]
    assert last > 0 and set(kinds) == {"events"}
    assert list(group._rounds) == [last, last, 0, 0]  # then rank 0's tally of shared rounds: none ran


@pytest.mark.slow
def test_rows_staged_through_the_host_as_on_a_shared_gpu_give_the_sequential_tokens(model, monkeypatch):
    # the shared-GPU path (every rank agrees to stage; host copies of the rows over gloo), forced on CPU ranks;
    # K=3: the middle rank both receives and sends; a one-token prompt skips the prefill, a longer one uses it
    monkeypatch.setattr(ExplorerGroup, "stage_rows", True)
    options = {"tokenizer": tiny_tokenizer(), "trace_top": 2}
    with DexDecoder(
        model, explorers=3, backend="distributed", devices=("cpu",) * 3, threads=1, **options
    ) as decoder:
        assert decoder.group.data_link == ("gloo", True)
        for prompt in ([9], [5, 17, 3, 88, 40, 2, 61]):
            sequential = DexDecoder(model, explorers=3, **options).generate(prompt, 24)
            staged = decoder.generate(prompt, 24)
            assert staged.tokens == sequential.tokens == ar_generate(model, prompt, 24).tokens
            assert without_timings(staged.trace) == without_timings(sequential.trace)
        sampled = decoder.generate(prompt, 16, temperature=0.9, top_p=0.95, seed=3)
        assert sampled.tokens == ar_generate(model, prompt, 16, temperature=0.9, top_p=0.95, seed=3).tokens


@pytest.mark.slow
def test_a_rank_that_raises_at_round_3_ends_the_call_fast_and_leaves_no_process(model, tmp_path):
    before = live_children()  # the session's shared groups and browser are children too
    adapter = RaiseOnce(str(tmp_path / "raised"), at=3)
    decoder = DexDecoder(
        model, depths=(2, 4, 6), adapters={2: adapter}, backend="distributed", devices=("cpu",) * 3, threads=1
    )
    pids = decoder.group.pids()
    tic = time.monotonic()
    with pytest.raises(ExplorerError, match="explorer rank 0 failed: RuntimeError: injected fault at call 3"):
        decoder.generate([1, 2, 3, 4], 20)
    assert time.monotonic() - tic < 10
    assert not decoder.group.alive and not started_since(before) and running(pids) == []
    # the next call starts a fresh group and is exact again
    result = decoder.generate([1, 2, 3, 4], 20)
    assert result.tokens == ar_generate(model, [1, 2, 3, 4], 20).tokens
    assert set(decoder.group.pids()).isdisjoint(pids)
    decoder.close()
    assert not started_since(before)


def test_cli_distributed_backend_and_device_errors(tiny_dir, capsys):
    from dex_core.cli import main

    code = main(
        [
            "generate",
            "hello world",
            "--model",
            str(tiny_dir),
            "--no-chat",
            "--max-new-tokens",
            "6",
            "--explorers",
            "2",
            "--backend",
            "distributed",
            "--devices",
            "cpu,cpu",
            "--threads",
            "1",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0 and "distributed schedule:" in out and "6 tokens" in out
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    missing = f"cuda:{gpus}"  # one past the visible GPUs, on any machine
    code = main(
        [
            "generate",
            "hello",
            "--model",
            str(tiny_dir),
            "--explorers",
            "2",
            "--backend",
            "distributed",
            "--devices",
            f"{missing},{missing}",
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and f"{missing} is not available: {gpus} GPU(s) visible for 2 explorers" in err
    code = main(["generate", "hello", "--model", str(tiny_dir), "--explorers", "2", "--backend", "mpi"])
    err = capsys.readouterr().err  # the flag offers DecoderOptions.backend's choices
    assert code == 2 and "--backend: invalid choice: 'mpi'" in err and "'sequential', 'distributed'" in err


PLAIN_SCRIPT = """
from dex_core import DexDecoder, ar_generate
from dex_core.testing import tiny_model

model = tiny_model("llama")
dex = DexDecoder(model, explorers=2, backend="distributed", devices=("cpu", "cpu"), threads=1, start_timeout=300)
print("exact", dex.generate([3, 1, 4, 1, 5], 12).tokens == ar_generate(model, [3, 1, 4, 1, 5], 12).tokens)
"""


@pytest.mark.slow
def test_a_plain_script_without_a_main_guard_uses_the_distributed_backend(tmp_path):
    import subprocess
    import sys

    script = tmp_path / "plain.py"
    script.write_text(PLAIN_SCRIPT)  # no `if __name__ == "__main__":` guard, as users write
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == "exact True"


def _fault_after_round(decoder, prompt, at_round, fault):
    """Stream a long generation, call ``fault(pids)`` after round ``at_round``, and return the error and
    the seconds from the fault to the error."""
    stream = decoder.stream(prompt, 200)
    for event in stream:
        if isinstance(event, RoundEvent) and event.round == at_round:
            break
    tic = time.monotonic()
    fault(decoder.group.pids())
    with pytest.raises(ExplorerError) as err:
        for _ in stream:
            pass
    return str(err.value), time.monotonic() - tic


@pytest.mark.slow
def test_a_killed_or_stopped_rank_is_named_within_op_timeout_and_the_next_call_is_exact(model):
    """Three faults in turn on one decoder, each on the fresh group that the call after the one before started."""
    op_timeout = 6.0
    faults = [
        (signal.SIGKILL, [1], "explorer rank 1 died (was killed by SIGKILL)"),
        (signal.SIGSTOP, [0], "explorer rank 0 stopped"),
        (signal.SIGSTOP, [0, 1], "explorer ranks 0, 1 stopped"),
    ]
    with DexDecoder(
        model, explorers=2, backend="distributed", devices=("cpu",) * 2, threads=1, op_timeout=op_timeout
    ) as decoder:
        for sig, ranks, message in faults:
            pids = decoder.group.pids()
            error, seconds = _fault_after_round(
                decoder, [3, 1, 4], 3, lambda pids: [os.kill(pids[k], sig) for k in ranks]
            )
            assert message in error and seconds < op_timeout + 5, (message, error, seconds)
            assert not decoder.group.alive and running(pids) == []
            again = decoder.generate([2, 7, 1, 8], 12)  # a fresh group
            assert again.tokens == ar_generate(model, [2, 7, 1, 8], 12).tokens
            assert set(decoder.group.pids()).isdisjoint(pids)


PARENT_SCRIPT = """
import sys, time
from dex_core import DexDecoder
from dex_core.testing import tiny_model

dex = DexDecoder(tiny_model("llama"), explorers=2, backend="distributed", devices=("cpu", "cpu"), threads=1,
                 start_timeout=300)
print(*dex.group.pids(), dex.group._tmp, flush=True)
if sys.argv[1] == "busy":
    for _ in dex.stream([3, 1, 4], 240):
        pass
time.sleep(600)
"""


@pytest.mark.slow
@pytest.mark.parametrize("signal_name,state", [("SIGKILL", "idle"), ("SIGTERM", "busy")])
def test_explorers_end_themselves_when_their_parent_dies(tmp_path, signal_name, state):
    import subprocess
    import sys

    script = tmp_path / "parent.py"
    script.write_text(PARENT_SCRIPT)
    parent = subprocess.Popen([sys.executable, str(script), state], stdout=subprocess.PIPE, text=True)
    *pids, folder = parent.stdout.readline().split()
    pids = [int(p) for p in pids]
    assert len(pids) == 2 and all(psutil.pid_exists(p) for p in pids) and os.path.isdir(folder)
    time.sleep(1.0)
    os.kill(parent.pid, getattr(signal, signal_name))
    parent.wait(timeout=30)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and running(pids):
        time.sleep(0.2)
    alive = running(pids)
    assert not alive, f"explorers {alive} outlived their parent by 10 s"
    assert not os.path.exists(folder)  # rank 0 removed the group's folder, which the killed parent could not
