"""``dex bench``'s result rows: one per method and prompt set, from the methods' outputs and what the set's
references give (``SetContext``): exactness, critical-path layer forwards, the cost model's cost per token in both
views, and each method's own fields. The report built from them: ``report``."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...analysis.ead import longest_stage, matches, set_cost
from ...analysis.profile import exchange_seconds
from ...model.cost import ModelCost
from ..baselines.selectors import selector_row
from ..baselines.speculation import self_spec_layer_forwards


@dataclass
class SetContext:
    """What the result rows of one prompt set are computed from."""

    refs: list[list[int]]  # HF greedy's tokens per prompt (the reference)
    flat: torch.Tensor  # all of them, in one (T,) tensor
    L: int
    tuning: dict  # self-spec and hf-early-exit: their tuned exit and draft
    lookup: int  # prompt lookup's drafts per step
    cost: ModelCost  # full heads, with the adapters
    dex_cost: dict  # per DEX configuration, its cost model (light heads)
    proposal_vocab: dict  # per DEX configuration, its light heads' rows
    cands: dict  # adapters used (bool) -> every layer's candidate per reference token
    adapters: dict
    profile: dict | None  # the seconds profile, for the exchange's share


def result_row(key, outs: list, ctx: SetContext) -> dict:
    """One results row (without timings) for a method's outputs over a prompt set."""
    method, T = key if isinstance(key, str) else key[0], len(ctx.flat)
    row = {
        "method": method,
        "prompts": len(ctx.refs),
        "tokens": T,
        "identical": sum(o[0] == r for o, r in zip(outs, ctx.refs)),
        "layer_forwards_per_token": float(ctx.L),
        "devices": 1,
        "cost_per_token": ctx.cost.ar(),
        "cost_per_token_rows": ctx.cost.ar(),
    }
    if method in ("dex", "dex-distributed"):
        row.update(_dex_row(key, [o[1] for o in outs], ctx))
    elif method == "ar-pipeline":  # AR's weights per token, over K devices in K rounds
        K, rounds = len(key[1]), sum(o[1].rounds for o in outs)
        row.update(explorers=K, depths=list(key[1]), devices=K, rounds_per_token=rounds / T)
        row["schedule"] = f"distributed ({K} processes): AR through the stages"
    elif method == "self-spec":
        row.update(_self_spec_row(outs, ctx))
    elif method == "hf-early-exit":
        row.update(_early_exit_row(ctx))
    elif method in ("adadecode", "del"):
        tuned = {k: v for k, v in ctx.tuning[method].items() if k != "grid"}
        row.update(selector_row(outs, ctx.cost, T), **tuned, adapters=bool(ctx.adapters))
    elif method == "hf-prompt-lookup":
        # a forward of n rows: AR's weights once (memory-bound), n times (rows)
        steps, rows = sum(o[1]["steps"] for o in outs), sum(o[1]["rows"] for o in outs)
        row.update(
            draft=ctx.lookup,
            steps_per_token=steps / T,
            rows_per_step=rows / steps,
            layer_forwards_per_token=steps * ctx.L / T,
            cost_per_token=steps * ctx.cost.ar() / T,
            cost_per_token_rows=rows * ctx.cost.ar() / T,
        )
    return row


def _dex_row(key, stats: list, ctx: SetContext) -> dict:
    method, depths, use, decs, prune, draft = key
    T, rounds = len(ctx.flat), sum(s.rounds for s in stats)
    covered = [d for d in ctx.adapters if use and d in depths[:-1]]
    batches, cost = [b for s in stats for b in s.batch_sizes], ctx.dex_cost[key]
    row = dict(
        explorers=len(depths),
        depths=list(depths),
        adapters=use,
        decs=decs,
        prune=prune,
        draft=draft,
        drafted_share=sum(s.drafted for s in stats) / T,
        tokens_per_round=T / rounds,
        rows_per_round=sum(map(sum, batches)) / rounds,
        rounds_per_token=rounds / T,
        proposal_vocab=ctx.proposal_vocab[key],
        cost_per_token_full_heads=cost.full_heads().dex(depths, batches, T, "memory", covered),
        depth_speedup=len(depths) * T / rounds,
        devices=len(depths),
        layer_forwards_per_token=rounds * longest_stage(depths) / T,
        cost_per_token=cost.dex(depths, batches, T, "memory", covered),
        cost_per_token_rows=cost.dex(depths, batches, T, "rows", covered),
        layer_work_per_token=cost.layers_only().dex(depths, batches, T, "rows", covered, devices="1"),
    )
    if method != "dex":
        return {**row, "schedule": f"distributed ({len(depths)} processes)"}
    predicted = (
        set_cost(ctx.cands[use], ctx.flat, depths, decs, [len(r) for r in ctx.refs])
        if draft == "none"
        else {"depth_speedup": None}
    )  # EAD predicts pure depth exploration: chains' lookups are not in it
    projected = sum(s.projected_seconds for s in stats)
    comm = sum(exchange_seconds(ctx.profile, b) for b in batches) if ctx.profile else 0.0
    return {
        **row,
        "schedule": "sequential (one device)",
        "predicted_depth_speedup": predicted["depth_speedup"],
        "projected_tokens_per_second": T / (projected + comm),
        "projected_communication_share": comm / (projected + comm),
        "projected_includes_communication": bool(ctx.profile),
    }


def _self_spec_row(outs: list, ctx: SetContext) -> dict:
    ss, T = ctx.tuning["self-spec"], len(ctx.flat)
    steps, E, n = sum(o[1]["steps"] for o in outs), ss["exit"], ss["draft"]
    row = dict(
        exit=E,
        draft=n,
        adapters=E in ctx.adapters,
        steps_per_token=steps / T,
        layer_forwards_per_token=sum(o[1]["layer_forwards"] for o in outs) / T,
    )
    if E:
        row.update(
            {
                f"cost_per_token{suffix}": steps * ctx.cost.self_spec_step(E, n, view, E in ctx.adapters) / T
                for suffix, view in (("", "memory"), ("_rows", "rows"))
            }
        )
    return row


def _early_exit_row(ctx: SetContext) -> dict:
    """HF's early exit, counted by replaying its acceptance rule on the plain lens."""
    hf, T = ctx.tuning["hf-early-exit"], len(ctx.flat)
    hits = matches(ctx.cands[False], ctx.flat)[:, hf["exit"] - 1]
    bounds = torch.cumsum(torch.tensor([0] + [len(r) for r in ctx.refs], device="cpu"), 0).tolist()
    replays = [
        self_spec_layer_forwards(hits[a:b], hf["draft"], hf["exit"], ctx.L)
        for a, b in zip(bounds, bounds[1:])
    ]
    steps, forwards = sum(r[0] for r in replays), sum(r[1] for r in replays)
    plain = ModelCost(ctx.L, ctx.cost.head, 0.0)
    return dict(
        exit=hf["exit"],
        draft=hf["draft"],
        adapters=False,
        layer_forwards_per_token=forwards / T,
        layer_forwards_note="counted by replaying the acceptance rule on the plain lens",
        **{
            f"cost_per_token{suffix}": steps * plain.self_spec_step(hf["exit"], hf["draft"], view) / T
            for suffix, view in (("", "memory"), ("_rows", "rows"))
        },
    )
