"""``dex paper``: the paper's evaluation (§4, App. A) run on one model, written as one JSON file and one standalone
HTML report (``paper.json``, ``paper.html`` in ``--out``).

One ``dex bench`` run over a fixed matrix (three prompt sets x 10 prompts x 96 new tokens, K = 2..8; ``--quick``:
the tiny float64 model and bench's quick matrix), every row checked against HF greedy, then per figure:

- **Fig. 3**, exploration against selection: per set, DEX at each K (the shipped adapters and DECS, no draft
  chains), self-speculation (exit and draft tuned), AdaDecode- and DEL-style selection
  (``evaluation.baselines.selectors``) and the EAD oracle, in critical-path layer forwards per token and memory-bound
  cost per token (all the work);
- **Fig. 4 left**, resolution: the measured depth-side speedup and rounds per token of each K (the adapter-aware
  set), beside the EAD rule's prediction, the projected K-device tokens/s, and the uniform split through the
  plain lens *replayed* with the EAD rule;
- **Fig. 4 right-top**, single exit: the same K stages with only the first and the final depth proposing,
  *replayed* with the EAD rule on this run's answers (full heads; the rule equals a greedy run,
  tests/analysis/test_ead.py) beside full exploration replayed the same way;
- **Fig. 4 right-bottom**, DECS: rounds per token with DECS on and off, greedy and at temperature 1.0 (sampled
  runs compared token by token with ``ar_generate`` under the same seed);
- **Fig. 6**: stable-EAD histograms per set, the plain lens against the adapters;
- **Fig. 5**: AR, tensor-parallel AR (``ar-tp``) and DEX tokens/s; **Table 1**: per-round shares of distributed
  K = 2 runs; **Appendix B**: the walltime model fitted on the tune split, its prediction of each DEX row.

The HTML is drawn by ``visualize.paper`` in its own process: dex_core computes, visualize draws (dex_core never
imports it).
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from ...analysis.ead import matches, set_cost
from ...analysis.profile import one_row_seconds
from ...config import (
    DEVICE_HELP,
    DecoderOptions,
    DexConfig,
    DexError,
    option,
    parse_ints,
    parse_list,
    resolve_depths,
)
from ...data.sets import PROMPT_SETS
from ...decoder import DexDecoder
from ...log import stderr
from ...model.adapter_choice import choose_depths
from ...model.lens import layer_candidates
from ...runtime.reference import ar_generate
from ..baselines.selectors import uniform_exits
from ..bench.bench import Bench, BenchConfig, run_bench
from ..bench.finished import Finished
from .claims import CLAIMS, MODES, findings
from .walltime import fit, predict, table1

SELECTORS = ("self-spec", "adadecode", "del")
METHODS = ("ar-hf", "dex", *SELECTORS)


@dataclass
class PaperConfig:
    model: str = option("default", "model spec, as for dex generate")
    device: str = option(DexConfig.device, DEVICE_HELP)
    sets: tuple[str, ...] = option(
        ("humaneval", "chat", "grounded"), "prompt sets: " + ", ".join(PROMPT_SETS)
    )
    prompts: int = option(10, "prompts per set, from its eval split")
    tune_prompts: int = option(3, "prompts per set from the tune split, for the selectors' tuning")
    max_new_tokens: int = option(96, "new tokens per prompt")
    explorers: tuple[int, ...] = option((2, 3, 4, 5, 6, 7, 8), "values of K")
    decs_explorers: tuple[int, ...] = option((4,), "values of K of the DECS on/off runs (greedy and T = 1.0)")
    table1_explorers: int = option(2, "K of Table 1's distributed runs (one process per explorer)")
    seed: int = option(0, "seed of the sampled runs (prompt i uses seed + i)")
    quick: bool = option(False, "the tiny float64 model and bench's quick matrix (seconds; for tests)")

    def __post_init__(self):
        self.sets = parse_list(self.sets, "sets")
        self.explorers = parse_ints(self.explorers, "explorers")
        self.decs_explorers = parse_ints(self.decs_explorers, "decs_explorers")
        if min(self.prompts, self.tune_prompts, self.max_new_tokens) < 1:
            raise DexError("prompts, tune_prompts and max_new_tokens must be positive")

    def bench(self, **changes) -> BenchConfig:
        """The dex bench run of the matrix (``changes``: other BenchConfig fields, e.g. the tune split's)."""
        fields = dict(
            model=self.model,
            device=self.device,
            sets=self.sets,
            prompts=self.prompts,
            tune_prompts=self.tune_prompts,
            max_new_tokens=self.max_new_tokens,
            explorers=self.explorers,
            # ar-tp: tests/evaluation/test_tensor_parallel.py
            methods=METHODS if self.quick else (*METHODS, "ar-tp"),
            draft="none",
            profile=not self.quick,
            quick=self.quick,
        )
        return BenchConfig(**{**fields, **changes})


PROGRESS = "paper.progress.json"  # in --out while a run is unfinished: what it finished (``Finished``)


def run_paper(cfg: PaperConfig, log=stderr, out: str | Path | None = None) -> dict:
    """Run the matrix and compute every figure's data (``paper.json``'s content). With ``out`` (the report's
    folder) each finished prompt set and phase is kept in ``out/paper.progress.json`` as it ends, and a run of the
    same options started again reads those back instead of running them (a report on a GPU box runs for hours)."""
    bench_cfg = cfg.bench()
    bench = Bench.load(bench_cfg, log)
    finished = None
    if out is not None:
        key = {"config": asdict(cfg), "model": bench_cfg.model, "adapter_depths": sorted(bench.adapters)}
        finished = Finished(Path(out) / PROGRESS, key)
        if len(finished):
            log(
                f"resuming from {finished.path}: {len(finished)} pieces finished ({', '.join(finished.pieces)})"
            )
    report = run_bench(bench_cfg, log, bench, finished)
    sets = {name: bench.prompts(name, bench_cfg.prompts, "eval") for name in bench_cfg.sets}
    lenses = {name: _lenses(bench, sets[name], report["answers"][name]) for name in sets}
    data = {
        "model": report["model"],
        "matrix": {
            "sets": list(bench_cfg.sets),
            "prompts": bench_cfg.prompts,
            "max_new_tokens": bench_cfg.max_new_tokens,
            "explorers": list(bench_cfg.explorers),
            "exits": list(uniform_exits(bench.L, bench_cfg.exits)),
        },
        "config": asdict(cfg),
        "num_layers": bench.L,
        "adapter_depths": sorted(bench.adapters),
        "claims": CLAIMS,
        "fig3": {name: _fig3(report, name) for name in sets},
        "fig4": {name: _fig4(report, name, lenses[name], bench_cfg.explorers) for name in sets},
        "decs": _piece(finished, "decs", lambda: _decs(bench, cfg, sets, report["answers"])),
        "fig6": {name: {k: _histogram(v, bench.L) for k, v in lenses[name].items()} for name in sets},
        "fig5": {name: _fig5(report, name) for name in sets},
        "appendix_b": _appendix_b(bench, cfg, report, log, finished),
        "table1": None if cfg.quick else _piece(finished, "table1", lambda: _table1(bench, cfg, sets)),
        "bench": report,
    }
    data["findings"] = findings(data)
    return data


def _piece(finished: Finished | None, name: str, compute):
    """Phase ``name``'s data: read back from ``finished`` when an earlier run ended it, else computed and kept."""
    if finished is not None and name in finished:
        return finished.get(name)
    value = json.loads(json.dumps(compute()))  # as a resumed run reads it back
    if finished is not None:
        finished.put(name, value)
    return value


def _appendix_b(bench: Bench, cfg: PaperConfig, report: dict, log, finished: Finished | None = None) -> dict:
    """The walltime model fitted per set on the tune split (AR and DEX measured there the same way) and its
    prediction of each eval-split DEX row's measured speedup (``evaluation.paper.walltime``)."""
    tune_cfg = cfg.bench(split="tune", prompts=cfg.tune_prompts, methods=("ar-hf", "dex"), profile=False)
    log(f"Appendix B: AR and DEX on {tune_cfg.prompts} tune-split prompts per set, to fit the walltime model")
    tune = run_bench(tune_cfg, log, replace(bench, cfg=tune_cfg), finished)
    tau = one_row_seconds(bench.model, min(8192, bench.model.config.vocab_size))["layer"]
    out = {}
    for name in report["oracle"]:
        fitted = fit([r for r in tune["results"] if r["set"] == name], bench.L, tau)
        rows = predict([r for r in report["results"] if r["set"] == name], fitted, bench.L)
        out[name] = {"delta_ar": fitted["delta_ar"], "tau_seconds": tau, "rows": rows}
    return out


def _table1(bench: Bench, cfg: PaperConfig, sets: dict) -> dict:
    """Table 1 from distributed runs at K = ``table1_explorers`` over the first prompt of each set."""
    K = min(cfg.table1_explorers, bench.L)
    decoder = DexDecoder(
        bench.model, explorers=K, adapters="none", backend="distributed", tokenizer=bench.tokenizer
    )
    try:
        traces = [decoder.generate(p[0], bench.cfg.max_new_tokens).trace for p in sets.values()]
    finally:
        decoder.close()
    return {"explorers": K, **table1(traces)}


def _lenses(bench: Bench, prompts: list, answers: list) -> dict:
    """Per lens ('plain lens', and 'adapters' when there are any): every layer's candidates and the answers."""
    out = {}
    for name, adapters in (("plain lens", {}), ("adapters", bench.adapters)):
        if name == "plain lens" or adapters:
            cands = torch.cat(
                [layer_candidates(bench.model, p, a, adapters) for p, a in zip(prompts, answers)]
            )
            out[name] = (cands, [t for a in answers for t in a], [len(a) for a in answers])
    return out


def _histogram(lens: tuple, L: int) -> list[int]:
    """How many tokens have each stable EAD 1..L."""
    omega = matches(lens[0], lens[1])
    stable = torch.where(~omega, torch.arange(1, L + 1, device="cpu"), 0).max(dim=1).values + 1
    return torch.bincount(stable, minlength=L + 1)[1:].tolist()


def _rows(report: dict, name: str) -> list[dict]:
    return [r for r in report["results"] if r["set"] == name]


def _fig3(report: dict, name: str) -> dict:
    """Per set: each DEX K, each selector and the oracle, in layer forwards and cost per token."""
    keep = (
        "method",
        "explorers",
        "depths",
        "identical",
        "prompts",
        "layer_forwards_per_token",
        "cost_per_token",
    )
    rows = [
        {k: r.get(k) for k in keep}
        for r in _rows(report, name)
        if r["method"] in ("ar-hf", "dex", *SELECTORS)
    ]
    dex = [r for r in rows if r["method"] == "dex"]
    selectors = [r for r in rows if r["method"] in SELECTORS]
    holds = {
        key: all(min(d[key] for d in dex) < s[key] for s in selectors) if dex and selectors else None
        for key in ("layer_forwards_per_token", "cost_per_token")
    }
    return {
        "rows": rows,
        "oracle": report["oracle"][name]["layer_forwards_per_token"],
        "ordering_holds": holds,
    }


def _fig5(report: dict, name: str) -> list[dict]:
    """Per set: AR, tensor-parallel AR (when run) and the DEX rows, measured tokens/s and certified tokens."""
    keep = ("method", "explorers", "devices", "tokens", "certified", "tokens_per_second", "speedup_vs_ar")
    rows = _rows(report, name)
    return [{k: r.get(k) for k in keep} for r in rows if r["method"] in ("ar-hf", "ar-tp", "dex")]


def _fig4(report: dict, name: str, lenses: dict, explorers) -> dict:
    """Per K of the run: measured, predicted and replayed speedups of the run's (adapter-aware) set; the
    single-exit replay; the uniform split through the plain lens, replayed."""
    dex = {r["explorers"]: r for r in _rows(report, name) if r["method"] == "dex"}
    cands, tokens, lengths = lenses["adapters" if "adapters" in lenses else "plain lens"]
    plain = lenses["plain lens"][0]
    rows = []
    for K in explorers:
        r = dex[K]
        full = set_cost(cands, tokens, r["depths"], r["decs"], lengths)
        masked = cands.clone()
        masked[:, [d - 1 for d in r["depths"][1:-1]], :] = -1  # intermediate depths propose nothing
        single = set_cost(masked, tokens, r["depths"], r["decs"], lengths)
        uniform = resolve_depths(plain.shape[1], explorers=K)
        even = set_cost(plain, tokens, uniform, r["decs"], lengths)
        rows.append(
            {
                "explorers": K,
                "depths": r["depths"],
                "rounds_per_token": r["rounds_per_token"],
                "depth_speedup": r["depth_speedup"],
                "predicted_depth_speedup": r.get("predicted_depth_speedup"),
                "projected_tokens_per_second": r.get("projected_tokens_per_second"),
                "replayed_depth_speedup": full["depth_speedup"],
                "single_exit_replayed_depth_speedup": single["depth_speedup"],
                "uniform_depths": list(uniform),
                "uniform_replayed_depth_speedup": even["depth_speedup"],
            }
        )
    return {"rows": rows, "oracle_speedup": report["oracle"][name]["speedup"]}


def _decs(bench: Bench, cfg: PaperConfig, sets: dict, answers: dict) -> list[dict]:
    """DECS on and off at each K of ``decs_explorers``, greedy (against HF greedy) and at temperature 1.0
    (against ``ar_generate`` with the same seed): rounds per token and identical prompts."""
    out, n = [], bench.cfg.max_new_tokens
    refs = {}
    for name, prompts in sets.items():
        for i, p in enumerate(prompts):
            refs[(name, i)] = ar_generate(bench.model, p, n, temperature=1.0, seed=cfg.seed + i).tokens
    for K in [k for k in cfg.decs_explorers if k <= bench.L]:
        adapters = "none" if cfg.quick else "auto"
        depths = choose_depths(bench.model, DecoderOptions(explorers=K, adapters=adapters))[0]
        covered = {d: a for d, a in bench.adapters.items() if d in depths[:-1]}
        for decs in (True, False):
            decoder = DexDecoder(  # as the bench's DEX rows: no draft chains (the paper has none)
                bench.model,
                depths=depths,
                decs=decs,
                adapters=covered,
                draft="none",
                tokenizer=bench.tokenizer,
            )
            for mode, extra in zip(MODES, ({}, {"temperature": 1.0})):
                out.append(_decs_row(decoder, sets, answers if not extra else refs, n, extra, cfg.seed))
                out[-1].update(explorers=K, depths=list(depths), decs=decs, mode=mode)
            decoder.close()
    return out


def _decs_row(decoder: DexDecoder, sets: dict, refs, n: int, extra: dict, seed: int) -> dict:
    same = tokens = rounds = 0
    for name, prompts in sets.items():
        for i, p in enumerate(prompts):
            result = decoder.generate(p, n, **({**extra, "seed": seed + i} if extra else {}))
            ref = refs[(name, i)] if extra else refs[name][i]
            same, tokens, rounds = (
                same + (result.tokens == ref),
                tokens + len(result.tokens),
                rounds + result.stats.rounds,
            )
    K = len(decoder.depths)
    return {
        "identical": same,
        "prompts": sum(map(len, sets.values())),
        "rounds_per_token": rounds / tokens,
        "depth_speedup": K * tokens / rounds,
    }


def write_paper(data: dict, out: str | Path, log=stderr) -> tuple[Path, Path]:
    """``paper.json`` and ``paper.html`` (drawn by ``python -m visualize.paper`` in its own process) in ``out``."""
    folder = Path(out).resolve()  # the drawing process runs in the repository, not here
    folder.mkdir(parents=True, exist_ok=True)
    json_path, html_path = folder / "paper.json", folder / "paper.html"
    json_path.write_text(json.dumps(data, indent=1))
    done = subprocess.run(
        [sys.executable, "-m", "visualize.paper", str(json_path), str(html_path)],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[3],  # the folder visualize/ is in
    )
    if done.returncode:
        raise DexError(f"drawing {html_path} failed: {done.stderr.strip()[-500:]}")
    log(f"wrote {json_path} and {html_path}")
    return json_path, html_path
