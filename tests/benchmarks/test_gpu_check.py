"""The prepared GPU check runs on the CPU too (``--device cpu --quick``), so it cannot rot before a GPU
machine runs it."""

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_check.py"


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
    assert 0 < runs["default"]["compilations"] <= 3 * 2  # K = 3 explorers, buckets of 1 and 2 rows
    assert exact["float32 greedy"]["weights"] == "float32 (as loaded)"
    assert exact["bfloat16 greedy"]["weights"] == "bfloat16 (a copy rounded from float32)"
    printed = capsys.readouterr().out
    assert "| bfloat16 greedy | bfloat16 (a copy rounded from float32) | 2 |" in printed
    real = report["real_size"]
    assert set(real["tables"]) == {"Llama-2-70B", "CodeLlama-34B", "Qwen3-32B"} and real["ranks"] == [2, 3]
    for tables in real["tables"].values():
        assert set(tables) == {"layer", "head", "proposal", "adapter", "tp", "links"}
        for name in ("layer", "head", "proposal", "adapter"):
            assert sorted(map(int, tables[name])) == [1, 2, 4, 8] and min(tables[name].values()) > 0
        for W in ("2", "3"):  # the links timed among 2 and 3 gloo processes, the tensor-parallel shards
            link = tables["links"][W]
            assert link["ranks"] == int(W) and link["backend"] == "gloo" and link["p2p"] > 0
            assert link["all_reduce"] > 0 and sorted(map(int, link["exchange"])) == [1, 2, 4, 8]
            assert tables["tp"][W]["layer"] > 0 and tables["tp"][W]["head"] > 0
    for name, layers in (("Llama-2-70B", 80), ("CodeLlama-34B", 48), ("Qwen3-32B", 64)):
        rows = real["projection"][name]
        assert [p["K"] for p in rows] == [2, 3] and all(p["source"] == "tiny random here" for p in rows)
        t = real["tables"][name]
        stage = {n: layers / 8 * t["layer"][n] + t["proposal"][n] for n in t["layer"]}  # a K = 8 stage
        assert real["row_budget_k8"][name] == max(int(n) for n, s in stage.items() if s <= 1.1 * stage["1"])
        for p, run in zip(
            rows, report["speed"][1:]
        ):  # the formulas on the measured tables (module docstring)
            K = str(p["K"])
            link, tp = t["links"][K], t["tp"][K]
            assert p["pipeline_ar"]["total"] == pytest.approx(
                layers * t["layer"]["1"] + t["head"]["1"] + (p["K"] - 1) * link["p2p"]
            )
            assert p["tensor_parallel"]["total"] == pytest.approx(
                layers * tp["layer"] + tp["head"] + (2 * layers + 1) * link["all_reduce"]
            )
            rounds = len(run["batch_sizes"])
            assert p["dex"]["host"] == pytest.approx(run["host_seconds_per_round"] * rounds / run["tokens"])
            assert run["host_seconds_per_round"] > 0 and p["widest_stage_rows"] <= 8
            assert p["speedup_over_pipeline_ar"] == pytest.approx(
                p["pipeline_ar"]["total"] / p["dex"]["total"]
            )
    assert (
        "not yet measured on a GPU" in printed
        and "projection: measured rounds" in printed
        and "row budget (prune=auto's rule" in printed
        and "FAILED" not in printed
    )


def test_the_projection_adds_every_term_as_its_formula_says():
    from dex_core.evaluation.bench.real_size import project

    tables = {  # seconds, made up so that each term can be computed by hand
        "layer": {1: 1.0, 2: 2.0, 4: 3.0},
        "head": {1: 10.0, 2: 11.0, 4: 12.0},
        "proposal": {1: 0.5, 2: 0.6, 4: 0.8},
        "adapter": {1: 0.1, 2: 0.2, 4: 0.3},
        "tp": {2: {"layer": 0.6, "head": 5.0}},
        "links": {2: {"exchange": {1: 0.05, 2: 0.06, 4: 0.08}, "p2p": 0.02, "all_reduce": 0.03}},
    }
    run = {"batch_sizes": [[2, 1], [4, 3]], "tokens": 2, "host_seconds_per_round": 0.25}
    got = project(tables, 4, run)  # 4 layers on K = 2 explorers: 2 each
    # round 1: stage 0 = 2 x 2.0 + 0.6 + 0.2 = 4.8, stage 1 = 2 x 1.0 + 10 = 12 -> 12
    # round 2: stage 0 = 2 x 3.0 + 0.8 + 0.3 = 7.1, stage 1 = 2 x 2.5 + 11.5 = 16.5 (3 rows: between 2 and 4)
    assert got["dex"]["compute"] == pytest.approx((12 + 16.5) / 2)
    assert got["dex"]["host"] == pytest.approx(0.25 * 2 / 2)
    assert got["dex"]["link"] == pytest.approx((0.06 + 0.08) / 2)  # each round's widest stage's rows
    assert got["dex"]["total"] == pytest.approx(14.25 + 0.25 + 0.07)
    assert got["pipeline_ar"] == pytest.approx({"compute": 4 * 1.0 + 10.0, "link": 1 * 0.02, "total": 14.02})
    assert got["tensor_parallel"] == pytest.approx(
        {"compute": 4 * 0.6 + 5.0, "link": (2 * 4 + 1) * 0.03, "total": 7.67}
    )
    assert got["speedup_over_pipeline_ar"] == pytest.approx(14.02 / 14.57)
    assert got["speedup_over_tensor_parallel"] == pytest.approx(7.67 / 14.57)
    assert got["speedup_over_tensor_parallel_compute_only"] == pytest.approx(7.4 / 14.25)
    assert got["widest_stage_rows"] == 4
    wide = project(tables, 4, run | {"batch_sizes": [[5, 1]]})  # past the measured rows: not extrapolated
    assert wide["dex"] is None and "speedup_over_pipeline_ar" not in wide
    assert wide["pipeline_ar"]["total"] == pytest.approx(14.02)


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
