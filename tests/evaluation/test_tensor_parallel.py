"""ar-tp: transformers' own tensor parallelism (tp_plan="auto") over real torch.distributed ranks on the CPU."""

import subprocess
from types import SimpleNamespace

import pytest
import torch

from dex_core.config import DexError, GenerationOptions
from dex_core.evaluation.baselines.tensor_parallel import TensorParallelAR, tp_size, tp_sizes
from dex_core.evaluation.bench.bench import BenchConfig, run_bench
from dex_core.evaluation.bench.report import terminal
from dex_core.runtime.reference import ar_generate
from dex_core.testing import tiny_model


@pytest.mark.process
def test_ar_tp_over_two_ranks_equals_ar_generate_on_a_float64_model(tiny_dir, llama):
    sampled = GenerationOptions(temperature=1.0, seed=7, max_new_tokens=10)
    with TensorParallelAR(str(tiny_dir), None, torch.float64) as group:  # 4 heads, 2 KV heads: 2 ranks
        assert group.size == 2 and group.devices == ["cpu", "cpu"]
        procs = list(group._procs)
        for prompt in ([3, 1, 4, 1, 5, 9, 2, 6], [7, 7, 8]):
            answer = group.generate(prompt, 10)
            assert answer.tokens == ar_generate(llama, prompt, 10).tokens
            assert len(answer.tokens) == 10 and answer.stop == "length"
            assert 0 < answer.prefill_seconds < answer.seconds
        assert (
            group.generate([5, 6], options=sampled).tokens
            == ar_generate(llama, [5, 6], options=sampled).tokens
        )
    assert all(p.poll() is not None for p in procs)  # closed: every rank has ended


def test_a_tp_size_that_does_not_divide_the_heads_is_refused_before_any_process(monkeypatch):
    def no_process(*args, **kwargs):
        raise AssertionError("a process was started")

    monkeypatch.setattr(subprocess, "Popen", no_process)
    default = SimpleNamespace(num_attention_heads=9, num_key_value_heads=3)  # the default model's heads
    assert (tp_sizes(default), tp_size(default)) == ([3], 3)
    with pytest.raises(
        DexError,
        match=r"^tp_size 2 needs a size that divides the model's 9 attention heads "
        r"and 3 KV heads; sizes that work: 3$",
    ):
        tp_size(default, 2)
    one_kv = SimpleNamespace(num_attention_heads=4, num_key_value_heads=1)
    with pytest.raises(DexError, match="4 attention heads and 1 KV heads; no size >= 2 divides both"):
        tp_size(one_kv)
    with pytest.raises(
        DexError, match="divides the model's 4 attention heads and 2 KV heads; sizes that work: 2"
    ):
        TensorParallelAR(tiny_model("llama", layers=1), 3, torch.float64)
    with pytest.raises(DexError, match="tp_size 3 needs"):
        run_bench(BenchConfig(quick=True, methods=("ar-hf", "ar-tp"), tp_size=3), log=lambda line: None)
    with pytest.raises(DexError, match="tp_size must be an integer >= 2"):
        BenchConfig(tp_size=1)


@pytest.mark.process
def test_dex_bench_quick_ar_tp_row_is_identical_and_certified():
    report = run_bench(BenchConfig(quick=True, methods=("ar-hf", "ar-tp")), log=lambda line: None)
    rows = {r["method"]: r for r in report["results"]}
    assert set(rows) == {"ar-hf", "ar-tp"}
    tp = rows["ar-tp"]
    assert (tp["identical"], tp["prompts"], tp["certified"], tp["tokens"]) == (3, 3, 48, 48)
    assert tp["certified_worst_gap"] == 0.0 and tp["devices"] == tp["tp_size"] == 2
    assert "tp_plan='auto'" in tp["schedule"] and "no headline" in tp["schedule"]
    assert 0 < tp["rank0_seconds"] <= tp["seconds"] and tp["rank0_decode_tokens_per_second"] > 0
    line = next(line for line in terminal(report).splitlines() if line.startswith("ar-tp "))
    assert "2 tensor-parallel ranks" in line  # its configuration cell says how it ran


TP_PARENT = """
import sys, time, torch
from dex_core.testing import tiny_model
from dex_core.evaluation.baselines.tensor_parallel import TensorParallelAR

group = TensorParallelAR(tiny_model("llama"), 2, torch.float64)
print(*[p.pid for p in group._procs], group._tmp, flush=True)
time.sleep(600)
"""


@pytest.mark.slow
@pytest.mark.process
def test_ranks_end_and_remove_their_folder_when_the_parent_is_killed(tmp_path):
    import os
    import signal
    import sys
    import time

    import psutil

    script = tmp_path / "parent.py"
    script.write_text(TP_PARENT)
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    *pids, folder = parent.stdout.readline().split()
    assert len(pids) == 2 and os.path.isdir(folder)
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait(timeout=30)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and (
        os.path.exists(folder) or any(psutil.pid_exists(int(p)) for p in pids)
    ):
        time.sleep(0.2)
    alive = [p for p in pids if psutil.pid_exists(int(p)) and psutil.Process(int(p)).status() != "zombie"]
    assert not alive and not os.path.exists(folder)  # rank 0 removed what the killed parent could not
