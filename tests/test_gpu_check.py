"""The prepared GPU check runs on the CPU too (``--device cpu --quick``), so it cannot rot before a GPU
machine runs it."""

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "gpu_check.py"


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
    assert exact["float32 greedy"]["weights"] == "float32 (as loaded)"
    assert exact["bfloat16 greedy"]["weights"] == "bfloat16 (a copy rounded from float32)"
    printed = capsys.readouterr().out
    assert "| bfloat16 greedy | bfloat16 (a copy rounded from float32) | 2 |" in printed
    real = report["real_size"]
    assert set(real["tables"]) == {"Llama-2-70B", "CodeLlama-34B", "Qwen3-32B"}
    for tables in real["tables"].values():
        assert set(tables) == {"layer", "head", "proposal", "adapter", "exchange"}
        assert all(sorted(map(int, t)) == [1, 2, 4, 8] and min(t.values()) > 0 for t in tables.values())
    for name, layers in (("Llama-2-70B", 80), ("CodeLlama-34B", 48), ("Qwen3-32B", 64)):
        rows = real["projection"][name]
        assert [p["K"] for p in rows] == [2, 3]
        t = real["tables"][name]
        stage = {n: layers / 8 * t["layer"][n] + t["proposal"][n] for n in t["layer"]}  # a K = 8 stage
        assert real["row_budget_k8"][name] == max(int(n) for n, s in stage.items() if s <= 1.1 * stage["1"])
        for p in rows:  # pipeline AR: every layer and the head at one row, K - 1 hops
            ar = layers * t["layer"]["1"] + t["head"]["1"] + (p["K"] - 1) * t["exchange"]["1"]
            assert abs(p["pipeline_ar_seconds_per_token"] - ar) < 1e-12
            assert p["speedup"] == p["pipeline_ar_seconds_per_token"] / p["dex_seconds_per_token"]
    assert (
        "not yet measured on a GPU" in printed
        and "projection: the speed section's measured rounds" in printed
        and "row budget (prune=auto's rule" in printed
    )
