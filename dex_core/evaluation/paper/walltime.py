"""The paper's Appendix B on this machine: Table 1's per-round profile of the distributed schedule, and the
calibrated walltime model, fitted on the tune split and checked against the eval split's measured speedups.

The model (App. B):

    S_wall = T (L + δ_AR) / Σ_t (W_X(t) + δ_X(t))

in layer-times τ (this machine's seconds of one decoder layer at one row, ``profile.one_row_seconds``).
The paper's W_X(t) is ⌈EAD(t)⌉_X, the layer-times a token costs on K devices. What this machine measures is the
sequential schedule on one device, so here W_X is the layer work it runs per token, counted from the run: every
stage that works in a round, each of its rows (``layer_work_per_token`` of a dex bench row). δ_AR (AR's time per
token beyond its L layers: the head, sampling, the loop) and δ_X (the same for DEX at set X: heads, adapters,
lattice bookkeeping), constant per token, are fitted on the tune split's measured clocks:

    δ_AR = t_AR / τ - L          δ_X = t_X / τ - W_X            (tune split)

and the eval split's measured W_X then predicts its speedup, S = (L + δ_AR) / (W_X + δ_X), printed beside the
measured one, t_AR / t_X on the same prompts, with the error. Table 1: the profiled time per rank-round of
distributed runs and each part's share, from their round events' timings (the paper's four parts, and the
tree masks and round plan, which this implementation times apart).
"""

from __future__ import annotations

from ...trace.events import Event, RoundEvent


def fit(rows: list[dict], L: int, tau: float) -> dict:
    """δ_AR and each DEX row's δ_X (by its depths) from one set's tune-split bench rows."""
    ar = next(r for r in rows if r["method"] == "ar-hf")
    t_ar = ar["seconds"] / ar["tokens"]
    deltas = {
        tuple(r["depths"]): r["seconds"] / r["tokens"] / tau - r["layer_work_per_token"]
        for r in rows
        if r["method"] == "dex"
    }
    return {"tau_seconds": tau, "delta_ar": t_ar / tau - L, "delta_x": deltas}


def predict(rows: list[dict], fitted: dict, L: int) -> list[dict]:
    """Per eval-split DEX row: the model's speedup, the measured one and the relative error."""
    ar = next(r for r in rows if r["method"] == "ar-hf")
    out = []
    for r in (r for r in rows if r["method"] == "dex" and tuple(r["depths"]) in fitted["delta_x"]):
        delta = fitted["delta_x"][tuple(r["depths"])]
        predicted = (L + fitted["delta_ar"]) / (r["layer_work_per_token"] + delta)
        measured = (ar["seconds"] / ar["tokens"]) / (r["seconds"] / r["tokens"])
        out.append(
            {
                "explorers": r["explorers"],
                "depths": r["depths"],
                "layer_work_per_token": r["layer_work_per_token"],
                "delta_x": delta,
                "predicted_speedup": predicted,
                "measured_speedup": measured,
                "error": predicted / measured - 1,
            }
        )
    return out


TABLE1 = {  # Table 1's parts: the round timings (trace events) each sums
    "expansion": ("expand",),
    "communication": ("communication",),
    "collapse": ("collapse",),
    "decode/commit": ("decode", "commit"),
    "masks and plan": ("masks", "plan"),
}


def table1(traces: list[list[Event]]) -> dict:
    """Table 1 from the traces of distributed runs: per part, milliseconds per rank-round (expansion: the mean
    over the explorers of each one's own) and share of the profiled time."""
    rounds = [e.timings for trace in traces for e in trace if isinstance(e, RoundEvent)]
    ranks = len(rounds[0]["expand"])
    seconds = {
        part: sum(sum(t[k]) / ranks if k == "expand" else t[k] for t in rounds for k in keys)
        for part, keys in TABLE1.items()
    }
    total = sum(seconds.values())
    return {
        "rounds": len(rounds),
        "ranks": ranks,
        "rows": [
            {"part": k, "ms_per_round": 1e3 * v / len(rounds), "share": v / total if total else 0.0}
            for k, v in seconds.items()
        ],
    }
