"""The prepared GPU check runs on the CPU too (``--device cpu --quick``), so it cannot rot before a GPU
machine runs it."""

import importlib.util
import json
from pathlib import Path

import pytest

from dex_core.analysis.collectives import CONTROL_COLUMNS

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_check.py"
ROUNDS = (
    SCRIPT.parents[1] / "docs" / "results" / "gpu-check-rounds-default-cpu-b32.json"
)  # replayed by default


@pytest.mark.slow
def test_the_gpu_check_runs_on_the_cpu_and_reports_every_section(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    gpu_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_check)
    out = tmp_path / "not" / "yet" / "gpu.json"  # folders the check must create
    assert (
        gpu_check.main(
            ["--device", "cpu", "--quick", "--out", str(out), "--markdown", str(tmp_path / "gpu.md")]
        )
        == 0
    )
    report = json.loads(out.read_text())
    assert set(gpu_check.SECTIONS) <= set(report) and "skipped" not in report and "errors" not in report
    exact = report["exactness"]
    assert set(exact) == {"float32 greedy", "bfloat16 greedy", "bfloat16 sampled"}
    assert exact["float32 greedy"]["dex_eq_ar"] == exact["float32 greedy"]["dex_eq_hf"] == 2
    assert all(r["certified"] == r["tokens"] == 16 for r in exact.values())  # 2 prompts x 8 tokens
    assert [r["method"] for r in report["speed"]] == [
        "AR (HF generate)",
        "DEX K=2 (sequential, one device)",
        "DEX K=3 (sequential, one device)",
    ]
    assert all(r["identical_to_ar"] for r in report["speed"][1:])
    assert all(1.0 <= r["rounds_per_token"] <= K for r, K in zip(report["speed"][1:], (2, 3)))
    assert sorted(map(int, report["profile"])) == [1, 2, 4]
    assert set(report["profile"]["1"]) == {"layer 0", "layer 3", "head", "proposal"}
    assert report["distributed"]["identical_to_sequential"] == report["distributed"]["prompts"] == 2
    together = report["shared"]  # four requests sharing rounds, in this process and on two gloo processes
    assert together["requests"] == 4 and together["new_tokens"] == [8, 6, 4, 2]
    for name in ("sequential", "distributed"):
        assert together[name]["identical_to_alone"] == 4 and together[name]["shared_tokens_per_second"] > 0
    trained = report["training"]  # two training ranks beside one process: the same adapters
    assert trained["devices"] == ["cpu", "cpu"] and trained["max_abs_difference"] <= 1e-6
    reads = report["host_reads"]  # every round read once: its choices, in one transfer
    assert reads["rounds"] > 2 and reads["most_reads_a_round"] == reads["mean_reads_a_round"] == 1
    assert list(reads["where"]) == [next(iter(reads["where"]))] and "readback.py" in next(
        iter(reads["where"])
    )
    runs = {r["mode"]: r for r in report["compiled"]["runs"]}  # the compiled stage step beside the eager one
    assert list(runs) == ["eager", "default", "reduce-overhead"] and all(
        r["identical_to_ar"] for r in runs.values()
    )
    assert runs["eager"]["new_op_shapes_after_warm_up"] == 0 and runs["eager"]["compilations"] == 0
    assert report["compiled"]["explorers"] == 2  # the least K asked: 2 explorers
    assert (
        0 < runs["default"]["compilations"] <= 2 * 4
    )  # buckets of 1, 2, 4 and 8 rows: the CPU's budget of 8
    assert exact["float32 greedy"]["weights"] == "float32 (as loaded)"
    assert exact["bfloat16 greedy"]["weights"] == "bfloat16 (a copy rounded from float32)"
    printed = capsys.readouterr().out
    assert "| bfloat16 greedy | bfloat16 (a copy rounded from float32) | 2 |" in printed
    check_real_size(report["real_size"])
    assert (
        "not yet measured on a GPU" in printed
        and "projection: measured rounds" in printed
        and "row budget (prune=auto's rule" in printed
        and "| Llama-2-70B | compiled | " in printed
        and "nvlink 2.5 us a step, 450 GB/s (assumed)" in printed
        and "FAILED" not in printed
    )


LAYERS = {"Llama-2-70B": 80, "CodeLlama-34B": 48, "Qwen3-32B": 64}


def check_real_size(real: dict) -> None:
    """The real-size section of the quick run: the stage step alone (eager at every row count, compiled at 1 and 8
    rows for the 70B shape), its host table apart, the weights' bytes, the links at K = 2, 4, 8, and the projection
    of the committed rounds (K = 2, 4, 8) in every column."""
    assert set(real["tables"]) == set(LAYERS) and real["ranks"] == [2, 4, 8] and real["step_rows"] == [1, 8]
    rows = [1, 2, 4, 8, 16, 32]
    for name, t in real["tables"].items():
        assert set(t) == {
            "step",
            "host",
            "layer",
            "layer_mode",
            "cudagraph_skips",
            "bytes",
            "head",
            "proposal",
        } | {"adapter", "tp", "links"}
        assert t["layer_mode"] == "eager" and t["layer"] == t["step"]["eager"]  # no CUDA graphs on a CPU
        assert list(t["step"]) == (["eager", "compiled"] if name == "Llama-2-70B" else ["eager"])
        for part in ("layer", "host", "head", "proposal", "adapter"):
            assert sorted(map(int, t[part])) == rows and min(t[part].values()) > 0
        if name == "Llama-2-70B":
            assert (
                sorted(map(int, t["step"]["compiled"])) == [1, 8] and min(t["step"]["compiled"].values()) > 0
            )
        for W in (
            "2",
            "4",
            "8",
        ):  # the links timed among 2, 4 and 8 gloo processes (one launch), the TP shards
            link = t["links"][W]
            assert link["ranks"] == int(W) and link["backend"] == "gloo" and link["p2p"] > 0
            assert link["all_reduce"] > 0 and sorted(map(int, link["exchange"])) == rows
            assert t["tp"][W]["layer"] == t["tp"][W]["step"]["eager"] > 0 and t["tp"][W]["head"] > 0
    # the scaled Llama layer by hand: hidden 256, 8 query heads and 1 KV head of 32, MLP 896, two norms; bfloat16
    h, q, kv, mlp = 256, 8 * 32, 32, 896
    assert real["tables"]["Llama-2-70B"]["bytes"]["layer"] == 2 * (
        2 * h * q + 2 * h * kv + 3 * h * mlp + 2 * h
    )
    assert real["tables"]["Llama-2-70B"]["bytes"]["row"] == 2 * h
    rounds = {len(r["batch_sizes"][0]): r for r in json.loads(ROUNDS.read_text())["speed"][1:]}
    for name, layers in LAYERS.items():
        projected = real["projection"][name]
        assert [p["K"] for p in projected] == [2, 4, 8] and all(
            "gpu-check-rounds-default-cpu-b32.json" in p["source"] for p in projected
        )
        t = real["tables"][name]
        stage = {n: layers / 8 * t["layer"][n] + t["proposal"][n] for n in t["layer"]}  # a K = 8 stage
        budget = 2  # the rule by hand: each step from 2 rows on within 10% of the 2-row step, in order
        for n in sorted(int(n) for n in stage if int(n) > 2):
            if stage[str(n)] > 1.1 * stage["2"]:
                break
            budget = n
        assert real["row_budget_k8"][name] == budget
        for p in projected:
            assert {link: set(by) for link, by in p["columns"].items()} == {
                link: {"measured", "bandwidth_bound"} for link in ("measured", "nvlink", "pcie", "network")
            }
            for by in p["columns"].values():
                for c in by.values():
                    assert c["dex"] is not None and c["widest_stage_rows"] <= 32
                    assert c["speedup_over_pipeline_ar"] == pytest.approx(
                        c["pipeline_ar"]["total"] / c["dex"]["total"]
                    )
            check_cells(p, t, layers, rounds[p["K"]], real["pricing"])


def check_cells(p: dict, t: dict, layers: int, run: dict, pricing: dict) -> None:
    """One cell of each column recomputed by hand from the report's tables (projection's docstring)."""
    K, W = p["K"], str(p["K"])
    bw = pricing["fraction"] * pricing["peak_bytes_per_second"]
    assert pricing["peak_source"] == "assumed (a CPU)" and pricing["fraction_source"] == "assumed"
    link, size, tp, c = t["links"][W], t["bytes"], t["tp"][W], p["columns"]
    assert c["measured"]["measured"]["tensor_parallel"]["total"] == pytest.approx(
        layers * tp["layer"] + tp["head"] + (2 * layers + 1) * link["all_reduce"]
    )
    assert c["measured"]["bandwidth_bound"]["pipeline_ar"]["total"] == pytest.approx(
        (layers * size["layer"] + size["head"]) / bw + (K - 1) * link["p2p"]
    )
    a, b = (pricing["links"]["nvlink"][k] for k in ("latency_seconds", "bytes_per_second"))
    ring = 2 * (K - 1) * a + 2 * (K - 1) / K * size["row"] / b
    assert c["nvlink"]["bandwidth_bound"]["tensor_parallel"]["total"] == pytest.approx(
        (layers * size["tp"][W]["layer"] + size["tp"][W]["head"]) / bw + (2 * layers + 1) * ring
    )
    a, b = (pricing["links"]["pcie"][k] for k in ("latency_seconds", "bytes_per_second"))
    control = 8 * CONTROL_COLUMNS  # a row of the round's choices, float64, all-gathered
    widest = [max(1, max(r)) for r in run["batch_sizes"]]  # each round's widest stage's rows
    exchanges = sum(a + n * size["row"] / b + (K - 1) * (a + (n + 1) * control / b) for n in widest)
    assert c["pcie"]["measured"]["dex"]["link"] == pytest.approx(exchanges / run["tokens"])
    assert c["pcie"]["measured"]["dex"]["host"] == pytest.approx(
        run["host_seconds_per_round"] * len(run["batch_sizes"]) / run["tokens"]
    )
    a, b = (pricing["links"]["network"][k] for k in ("latency_seconds", "bytes_per_second"))
    assert c["network"]["measured"]["pipeline_ar"]["total"] == pytest.approx(
        layers * t["layer"]["1"] + t["head"]["1"] + (K - 1) * (a + size["row"] / b)
    )


def test_a_tensor_parallel_shard_divides_heads_width_and_vocabulary():
    from dex_core.evaluation.bench.real_size import SHAPES, shard

    llama = shard(SHAPES["Llama-2-70B"], 8)
    assert (llama["num_attention_heads"], llama["num_key_value_heads"], llama["head_dim"]) == (8, 1, 128)
    assert (llama["intermediate_size"], llama["vocab_size"], llama["hidden_size"]) == (3584, 4000, 8192)
    qwen = shard(SHAPES["Qwen3-32B"], 3)  # rounded up: the largest shard sets the pace
    assert (qwen["num_attention_heads"], qwen["num_key_value_heads"], qwen["intermediate_size"]) == (
        24,
        3,
        8534,
    )
    assert qwen["vocab_size"] == 50646 and qwen["head_dim"] == 128


def test_no_section_starts_past_the_time_limit_and_those_left_are_named(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    gpu_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_check)
    out = tmp_path / "gpu.json"
    argv = ["--device", "cpu", "--quick", "--sections", "profile,host_reads,compiled", "--time-limit", "1e-9"]
    assert gpu_check.main([*argv, "--out", str(out)]) == 0
    report = json.loads(out.read_text())  # the first section starts; past the limit, none after it
    assert "profile" in report and report["skipped"] == ["host_reads", "compiled"]
    assert set(report["section_seconds"]) == {"profile"}
    assert "sections SKIPPED (past --time-limit): host_reads, compiled" in capsys.readouterr().out
