"""What the paper claims for each figure and table of its evaluation, and what a ``dex paper`` run shows: one
sentence each, side by side in the report (``findings`` reads the run's data, ``evaluation.paper.paper``)."""

from __future__ import annotations

from ..bench.report import quick_caveat

MODES = ("greedy", "temperature 1.0")  # the DECS runs' decoding modes (Fig. 4 right-bottom)

CLAIMS = {
    "fig3": "DEX beats LayerSkip self-speculation, AdaDecode and DEL on every model and data set, and realises a "
    "larger share of the EAD oracle's headroom.",
    "fig4_resolution": "Finer exploration (more explorers) generally raises throughput, narrowing the gap to the "
    "EAD oracle.",
    "fig4_single_exit": "At coarse resolutions single exit and full exploration are close; at finer ones full "
    "exploration gains much more.",
    "fig4_decs": "DECS improves throughput over vanilla decoding in greedy decoding and at temperature 1.0.",
    "fig5": "Scaled DEX achieves the highest end-to-end throughput among speculative and parallel decoding "
    "baselines, tensor parallelism among them.",
    "fig6": "A standard model's stable EADs sit near the final layer; early-exit training (here: inducing "
    "adapters) moves many tokens earlier.",
    "table1": "Expansion dominates DEX's profiled time (89%); communication is the main other cost (8%); collapse "
    "and decode/commit are small (2% and 1%).",
    "appendix_b": "A calibrated walltime model, S_wall = T(L + δ_AR) / Σ_t(⌈EAD(t)⌉_X + δ_X(t)), explains the realised "
    "speedup: DEX's overheads δ_X keep it below the idealised depth-side one.",
}


def findings(data: dict) -> dict:
    """One sentence per figure on what this run shows (the report puts it beside the paper's claim), each led by
    the quick caveat on a ``--quick`` run (``quick_caveat``: a tiny random model's numbers are no finding)."""
    caveat = quick_caveat(data)
    shown = _findings(data)
    return shown if caveat is None else {k: f"{caveat[0].upper()}{caveat[1:]}. {v}" for k, v in shown.items()}


def _findings(data: dict) -> dict:
    """``findings`` as the run's numbers say them."""
    sets = list(data["fig3"])
    holds = {
        k: sum(bool(data["fig3"][s]["ordering_holds"][k]) for s in sets)
        for k in ("layer_forwards_per_token", "cost_per_token")
    }
    by_k: dict[int, list] = {}
    for r in (r for s in sets for r in data["fig4"][s]["rows"]):
        by_k.setdefault(r["explorers"], []).append(r)
    ks = sorted(by_k)
    plain, adapted = (_median([data["fig6"][s].get(k) for s in sets]) for k in ("plain lens", "adapters"))
    return {
        "fig3": f"DEX's best K needs fewer layer forwards per token than every selector on "
        f"{holds['layer_forwards_per_token']} of {len(sets)} sets, and less memory-bound cost per token "
        f"(heads and adapters included) on {holds['cost_per_token']} of {len(sets)}.",
        "fig4_resolution": "The measured depth-side speedup, mean over sets: "
        + ", ".join(f"{_mean(by_k[k], 'depth_speedup'):.2f}× at K={k}" for k in ks)
        + "; the uniform split through the plain lens, replayed: "
        + ", ".join(f"{_mean(by_k[k], 'uniform_replayed_depth_speedup'):.2f}×" for k in ks)
        + ". "
        + ordering({k: _mean(by_k[k], "depth_speedup") for k in ks}),
        "fig4_single_exit": f"Replayed at K={ks[-1]}, mean over sets: full exploration "
        f"{_mean(by_k[ks[-1]], 'replayed_depth_speedup'):.2f}×, single exit "
        f"{_mean(by_k[ks[-1]], 'single_exit_replayed_depth_speedup'):.2f}×.",
        "fig4_decs": _decs_finding(data["decs"]),
        "fig5": _fig5_finding(data["fig5"]),
        "table1": _table1_finding(data["table1"]),
        "appendix_b": _appendix_b_finding(data["appendix_b"]),
        "fig6": f"Median stable EAD over all sets: layer {plain} of {data['num_layers']} with the plain lens"
        + (f", {adapted} with the adapters." if adapted is not None else " (no adapters)."),
    }


ORDER_SLACK = 0.02  # a finer K may measure this much below the coarser one and still count as no worse


def ordering(speedups: dict[int, float]) -> str:
    """Whether the measured depth-side speedup ({K: speedup}) keeps the paper's ordering: each K at least the
    previous K's minus ``ORDER_SLACK``; where it does not, which K falls below which."""
    ks = sorted(speedups)
    breaks = [(a, b) for a, b in zip(ks, ks[1:]) if speedups[b] < speedups[a] - ORDER_SLACK]
    if not breaks:
        return f"The ordering holds: every K is at least the previous K's speedup minus {ORDER_SLACK}."
    return (
        "The ordering breaks: "
        + ", ".join(f"K={b} ({speedups[b]:.2f}×) falls below K={a} ({speedups[a]:.2f}×)" for a, b in breaks)
        + "."
    )


def _mean(rows: list[dict], key: str) -> float:
    return sum(r[key] for r in rows) / len(rows)


def _fig5_finding(fig5: dict) -> str:
    rows = [r for panel in fig5.values() for r in panel]
    tp = [r for r in rows if r["method"] == "ar-tp"]
    dex = max((r for r in rows if r["method"] == "dex"), key=lambda r: r["speedup_vs_ar"], default=None)
    text = (
        f"On this machine's one device the fastest DEX row ran at {dex['speedup_vs_ar']:.2f}× AR (measured)"
    )
    if not tp:
        return text + "; tensor parallelism was not run (--quick)."
    certified = sum(r["certified"] for r in tp), sum(r["tokens"] for r in tp)
    return (
        text + f"; tensor-parallel AR ({tp[0]['devices']} ranks on the same CPU) certified {certified[0]} of "
        f"{certified[1]} tokens at {tp[0]['speedup_vs_ar']:.2f}× AR: a correctness check here, a speed claim on GPUs."
    )


def _table1_finding(table: dict | None) -> str:
    if not table:
        return "Not run (--quick runs no explorer processes; tests/evaluation/test_paper.py checks Table 1 on its own)."
    parts = ", ".join(f"{r['part']} {r['share']:.0%}" for r in table["rows"])
    return f"K={table['explorers']}, {table['rounds']} rounds on this machine: {parts} of the profiled time."


def _appendix_b_finding(appendix: dict) -> str:
    errors = [abs(r["error"]) for panel in appendix.values() for r in panel["rows"]]
    if not errors:
        return "No DEX rows to predict."
    return (
        f"Fitted on the tune split, the model predicts the eval split's measured speedup of {len(errors)} DEX rows "
        f"(one device, the sequential schedule) within {max(errors):.0%} "
        f"(mean |error| {sum(errors) / len(errors):.0%})."
    )


def _decs_finding(rows: list[dict]) -> str:
    if not rows:
        return "No DECS runs."
    decs = {
        (r["mode"], r["decs"]): r["depth_speedup"] for r in rows if r["explorers"] == rows[0]["explorers"]
    }
    parts = [f"{m}: {decs[(m, True)]:.2f}× with DECS, {decs[(m, False)]:.2f}× without" for m in MODES]
    return f"Depth-side speedup at K={rows[0]['explorers']}, " + "; ".join(parts) + "."


def _median(histograms: list) -> int | None:
    """The median layer of summed histograms (counts of layers 1..L), or None without any."""
    histograms = [h for h in histograms if h]
    if not histograms:
        return None
    total = [sum(c) for c in zip(*histograms)]
    seen, half = 0, sum(total) / 2
    for layer, count in enumerate(total, start=1):
        seen += count
        if seen >= half:
            return layer
    return len(total)
