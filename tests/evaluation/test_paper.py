"""dex paper --quick: the paper's figures on the tiny float64 model, exact rows, figures whose numbers follow from
the run, and a report that opens from disk in Chromium with every figure drawn."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dex_core.cli import main
from dex_core.evaluation.paper.paper import CLAIMS, PROGRESS, findings, write_paper
from dex_core.evaluation.paper.walltime import fit, predict, table1
from dex_core.trace.events import RoundEvent
from visualize.paper import paper_html


@pytest.fixture(scope="module")
def paper(tmp_path_factory):
    """``dex paper --quick`` run once, in this process (the ``dex`` entry point's subprocess smoke test is
    tests/cli/test_cli.py's); it draws paper.html in a process of its own (``python -m visualize.paper``)."""
    out = tmp_path_factory.mktemp("paper")
    assert main(["paper", "--quick", "--out", str(out)]) == 0
    return out, json.loads((out / "paper.json").read_text())


@pytest.mark.process
def test_every_row_is_exact_and_every_figure_is_computed_from_the_run(paper):
    _, data = paper
    tokens = 3 * 16  # the quick matrix: 3 synthetic prompts x 16 tokens
    for name, panel in data["fig3"].items():
        methods = {r["method"] for r in panel["rows"]}
        assert methods == {"ar-hf", "dex", "self-spec", "adadecode", "del"}
        assert all(r["identical"] == r["prompts"] == 3 for r in panel["rows"])
        dex = [r for r in panel["rows"] if r["method"] == "dex"]
        ordering = min(r["layer_forwards_per_token"] for r in dex) < min(
            r["layer_forwards_per_token"]
            for r in panel["rows"]
            if r["method"] in ("self-spec", "adadecode", "del")
        )
        assert panel["ordering_holds"]["layer_forwards_per_token"] == ordering
        # float64 and full heads (the tiny vocabulary is below the light heads' rows): the replay is the run
        for row in data["fig4"][name]["rows"]:
            assert row["replayed_depth_speedup"] == pytest.approx(row["depth_speedup"])
            if row["explorers"] == 2:  # two stages: the single-exit variant is the same set
                assert row["single_exit_replayed_depth_speedup"] == row["replayed_depth_speedup"]
            assert len(row["uniform_depths"]) == row["explorers"] and row["uniform_depths"][-1] == 6
            assert 1.0 <= row["uniform_replayed_depth_speedup"] <= row["explorers"]
        assert {len(h) for h in data["fig6"][name].values()} == {6}
        assert [sum(h) for h in data["fig6"][name].values()] == [tokens, tokens]  # plain lens, adapters
    modes = {(r["mode"], r["decs"]) for r in data["decs"]}
    assert modes == {(m, d) for m in ("greedy", "temperature 1.0") for d in (True, False)}
    assert all(r["identical"] == r["prompts"] == 3 and r["explorers"] == 4 for r in data["decs"])
    assert data["findings"] == findings(data) and set(data["findings"]) == set(CLAIMS)
    fitted = data["appendix_b"]["synthetic"]
    assert [r["explorers"] for r in fitted["rows"]] == [2, 3] and fitted["tau_seconds"] > 0
    for r in fitted["rows"]:
        assert r["error"] == pytest.approx(r["predicted_speedup"] / r["measured_speedup"] - 1)


def test_the_walltime_model_recovers_constant_overheads_and_table1_adds_up(llama, explorer_group):
    tau, L = 0.01, 6
    tune = [
        {"method": "ar-hf", "seconds": 20 * tau * (L + 2.0), "tokens": 20},
        {
            "method": "dex",
            "depths": [3, 6],
            "seconds": 10 * tau * (9.0 + 4.0),
            "tokens": 10,
            "layer_work_per_token": 9.0,
        },
    ]
    fitted = fit(tune, L, tau)
    assert fitted["delta_ar"] == pytest.approx(2.0) and fitted["delta_x"][(3, 6)] == pytest.approx(4.0)
    # an eval split with other work per token but the same overheads: predicted exactly
    evaluated = [
        {"method": "ar-hf", "seconds": 30 * tau * (L + 2.0), "tokens": 30},
        {
            "method": "dex",
            "explorers": 2,
            "depths": [3, 6],
            "seconds": 30 * tau * (7.5 + 4.0),
            "tokens": 30,
            "layer_work_per_token": 7.5,
        },
    ]
    (row,) = predict(evaluated, fitted, L)
    assert row["predicted_speedup"] == pytest.approx(8.0 / 11.5) and row["error"] == pytest.approx(0.0)
    trace = explorer_group(llama, 2).generate([3, 1, 4, 1, 5], 12).trace
    table = table1([trace])
    rounds = [e.timings for e in trace if isinstance(e, RoundEvent)]
    assert table["rounds"] == len(rounds) and table["ranks"] == 2
    parts = {r["part"]: r for r in table["rows"]}
    expand = sum(sum(t["expand"]) / 2 for t in rounds)  # the mean over the explorers, per round
    assert parts["expansion"]["ms_per_round"] == pytest.approx(1e3 * expand / len(rounds))
    assert (
        sum(r["share"] for r in table["rows"]) == pytest.approx(1.0) and parts["communication"]["share"] > 0
    )


@pytest.mark.process
def test_every_quick_finding_says_its_model_is_tiny_and_random_and_real_runs_do_not(paper):
    _, data = paper
    caveat = "A tiny random 6-layer model (--quick): a check of the pipeline, not a result. "
    assert set(data["findings"]) == set(CLAIMS)
    assert all(text.startswith(caveat) for text in data["findings"].values()), data["findings"]
    real = findings({**data, "config": {**data["config"], "quick": False}})  # as a real model's run
    assert real == {k: text[len(caveat) :] for k, text in data["findings"].items()}
    assert real["fig6"].startswith("Median stable EAD over all sets: layer ") and "tiny random" not in str(
        real
    )


@pytest.mark.process
def test_a_relative_out_folder_gets_its_report_drawn(paper, tmp_path, monkeypatch):
    _, data = paper
    monkeypatch.chdir(tmp_path)  # the drawing process runs elsewhere: the paths it gets are absolute
    assert write_paper(data, "rel", log=lambda _: None) == (
        tmp_path / "rel/paper.json",
        tmp_path / "rel/paper.html",
    )
    assert "Median stable EAD over all sets" in (tmp_path / "rel" / "paper.html").read_text()


@pytest.mark.process
def test_the_report_escapes_what_the_file_says(paper):
    _, data = paper
    evil = json.loads(json.dumps(data))
    evil["model"] = "<script>window.__xss=1</script>"
    evil["findings"]["fig3"] = '<img src=x onerror="window.__xss=1">'
    html = paper_html(evil)
    assert "<script>window.__xss" not in html and "<img src=x" not in html
    assert "&lt;img src=x onerror=&quot;window.__xss=1&quot;&gt;" in html


@pytest.mark.process
def test_the_report_opens_offline_with_every_figure_drawn(paper, page):
    out, data = paper
    outside = []
    page.on("request", lambda r: None if r.url.startswith(("file:", "data:")) else outside.append(r.url))
    page.goto((out / "paper.html").as_uri(), timeout=60_000)
    page.wait_for_function(
        "() => [...document.querySelectorAll('.js-plotly-plot')].filter(g => g.data?.length"
        " && g.querySelector('.barlayer .point, .scatterlayer .point')).length === 3",
        timeout=60_000,
    )
    titles = page.evaluate(
        "() => [...document.querySelectorAll('.js-plotly-plot')].map(g => g.layout.title.text)"
    )
    cells = page.evaluate("() => [...document.querySelectorAll('.paper-claims td')].map(td => td.innerText)")
    predicted = page.evaluate("() => document.querySelectorAll('.paper-table tr').length")
    bars = page.evaluate("() => document.querySelector('#paper-fig-0').data.filter(t => t.type === 'bar')")
    assert [t.split(":")[0] for t in titles] == ["Fig. 3", "Fig. 4", "Fig. 6"] and outside == []
    assert cells == [text for key in CLAIMS for text in (CLAIMS[key], data["findings"][key])]
    rows = data["fig3"]["synthetic"]["rows"]
    assert bars[0]["y"] == [
        r["layer_forwards_per_token"] for r in rows
    ]  # the figure draws the JSON's numbers
    # tables: Fig. 5 (a row per AR and DEX row of the set), Appendix B (a row per DEX row); Table 1 not run
    assert predicted == 2 + len(data["fig5"]["synthetic"]) + len(data["appendix_b"]["synthetic"]["rows"])


# wall-clock figures, which differ between any two runs
MEASURED = ("seconds", "tokens_per_second", "projected_tokens_per_second", "speedup_vs_ar")


@pytest.mark.slow  # a quick paper run killed part-way, then finished (about a minute)
@pytest.mark.process
def test_a_paper_run_killed_mid_run_resumes_and_ends_with_the_rows_of_an_uninterrupted_run(
    paper, tmp_path, capsys
):
    _, whole = paper
    out = tmp_path / "report"
    run = subprocess.Popen(
        [sys.executable, "-m", "dex_core.cli", "paper", "--quick", "--out", str(out)],
        cwd=Path(__file__).resolve().parents[2],
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:  # killed (no clean-up runs) as soon as its first prompt set is kept
        while not (out / PROGRESS).exists() and run.poll() is None:
            time.sleep(0.05)
        run.send_signal(signal.SIGKILL)
        assert run.wait(30) == -signal.SIGKILL, "the run ended before it could be killed"
    finally:
        run.kill()
    kept = json.loads((out / PROGRESS).read_text())["pieces"]
    assert list(kept) == ["eval:synthetic"] and not (out / "paper.json").exists()
    assert main(["paper", "--quick", "--out", str(out)]) == 0
    assert f"resuming from {out / PROGRESS}: 1 pieces finished (eval:synthetic)" in capsys.readouterr().err
    resumed = json.loads((out / "paper.json").read_text())
    assert not (out / PROGRESS).exists()  # the report is whole: nothing left to resume

    def rows(data):
        return [{k: v for k, v in r.items() if k not in MEASURED} for r in data["bench"]["results"]]

    assert rows(resumed) == rows(whole) and len(rows(whole)) == 6  # AR, DEX at K = 2 and 3, three selectors
    for key in ("oracle", "answers"):
        assert resumed["bench"][key] == whole["bench"][key]
    assert resumed["decs"] == whole["decs"] and resumed["fig6"] == whole["fig6"]


def test_the_resolution_finding_says_where_a_finer_k_falls_below_a_coarser_one():
    from dex_core.evaluation.paper.claims import ordering

    # 0.01 below the coarser K is within the slack
    assert ordering({2: 1.20, 3: 1.19, 4: 1.50}).startswith("The ordering holds")
    assert ordering({2: 1.18, 3: 1.05, 4: 1.50, 5: 1.06}) == (
        "The ordering breaks: K=3 (1.05×) falls below K=2 (1.18×), K=5 (1.06×) falls below K=4 (1.50×)."
    )
