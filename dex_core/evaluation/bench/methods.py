"""The methods ``dex bench`` compares, as runners of one shape: ``runner(prompt, max_new_tokens) -> (tokens,
stats)``; the DEX decoders of every configuration asked for; ar-tp's tensor-parallel ranks and their row's fields;
and the tuning of the depth-selection baselines on the tune split.
"""

from __future__ import annotations

import itertools
from functools import partial

from ...analysis.ead import layer_matches
from ...decoder import DexDecoder
from ...model.checkpoint import locate
from ...model.cost import ModelCost
from ...runtime.reference import hf_greedy
from ..baselines.selectors import Confidence, Running, select_generate, tune_confidence, uniform_exits
from ..baselines.speculation import (
    hf_early_exit_generate,
    hf_prompt_lookup_generate,
    self_spec_generate,
    self_spec_layer_forwards,
)
from ..baselines.tensor_parallel import TensorParallelAR


def tune_self_spec(
    model, answers: list[tuple[list[int], list[int]]], adapters: dict, drafts, allow_ar: bool = True
) -> dict:
    """Grid search of greedy self-speculation on (prompt, greedy answer) pairs under the cost model
    (memory-bound layer-equivalents, heads and adapters included): exit E over every layer 1..L-1 and n
    over ``drafts``, plus (``allow_ar``) "no speculation" (plain AR, exit None). The acceptance rule is replayed exactly
    on each layer's matches (``baselines.self_spec_layer_forwards``)."""
    L = model.config.num_hidden_layers
    cost = ModelCost.of(model, adapters)
    omegas = [layer_matches(model, prompt, out, adapters) for prompt, out in answers]
    T = sum(len(om) for om in omegas)
    grid = [{"exit": None, "draft": 0, "layer_forwards_per_token": float(L), "cost_per_token": cost.ar()}][
        :allow_ar
    ]
    for exit_layer in range(1, L):
        for n in drafts:
            steps = forwards = 0
            for om in omegas:
                s, f = self_spec_layer_forwards(om[:, exit_layer - 1], n, exit_layer, L)
                steps, forwards = steps + s, forwards + f
            step_cost = cost.self_spec_step(exit_layer, n, "memory", exit_layer in adapters)
            grid.append(
                {
                    "exit": exit_layer,
                    "draft": n,
                    "layer_forwards_per_token": forwards / T,
                    "cost_per_token": steps * step_cost / T,
                }
            )
    best = min(grid, key=lambda g: (g["cost_per_token"], g["exit"] or 0, g["draft"]))
    return {
        "exit": best["exit"],
        "draft": best["draft"],
        "tune_cost_per_token": best["cost_per_token"],
        "adapters": sorted(adapters),
        "grid": grid,
    }


def tune(bench) -> dict:
    """Self-speculation (with the adapters), HF's early exit (the plain lens) and AdaDecode tuned on the tune
    split; DEL's candidate exits."""
    cfg, lenses = bench.cfg, {"self-spec": bench.adapters, "hf-early-exit": {}}
    tuned = (*lenses, "adadecode", "del")
    if not any(m in cfg.methods for m in tuned):
        return {}
    tune = [p for name in cfg.sets for p in bench.prompts(name, cfg.tune_prompts, "tune")]
    tuning = _tune_selectors(bench, tune)
    bench.log(
        f"tuning self-speculation on {len(tune)} tune-split prompts (exit 1..{bench.L - 1} x draft "
        f"{list(cfg.drafts)})"
    )
    answers = [(p, hf_greedy(bench.model, p, cfg.max_new_tokens)) for p in tune]
    for name, lens in lenses.items():
        if name in cfg.methods:
            t = tuning[name] = tune_self_spec(bench.model, answers, lens, cfg.drafts, name == "self-spec")
            bench.log(
                f"{name}: exit {t['exit']}, draft {t['draft']} ({t['tune_cost_per_token']:.2f} "
                f"layer-equivalents/token on the tune split, heads included)"
            )
    return tuning


def _tune_selectors(bench, tune: list) -> dict:
    """AdaDecode's threshold and draft length (real runs on the tune prompts); DEL's exits (it tunes itself)."""
    cfg, exits = bench.cfg, uniform_exits(bench.L, bench.cfg.exits)
    tuning = {"del": {"exits": list(exits)}} if "del" in cfg.methods else {}
    if "adadecode" in cfg.methods:
        bench.log(f"tuning adadecode on {len(tune)} tune-split prompts (exits {list(exits)})")
        t = tuning["adadecode"] = tune_confidence(
            bench.model, tune, cfg.max_new_tokens, exits, bench.adapters, bench.log
        )
        bench.log(
            f"adadecode: threshold {t['threshold']}, draft {t['draft']} ({t['tune_cost_per_token']:.2f} LE/token)"
        )
    return tuning


def dex_decoders(bench, explorations) -> dict:
    """One DexDecoder per configuration: (method, depths, adapters used, DECS, row budget, draft) -> decoder."""
    cfg, adapters = bench.cfg, bench.adapters
    variants = (
        [(bool(adapters), True)]
        if cfg.variants == "shipped"
        else [(a, d) for a in ([True, False] if adapters else [False]) for d in (True, False)]
    )
    decoders = {}
    for depths in explorations:
        covered = {d: a for d, a in adapters.items() if d in depths[:-1]}
        runs = [("dex", use, decs, {}) for use, decs in variants]
        devices = None if bench.device.type == "cuda" else ("cpu",) * len(depths)
        distributed = {"backend": "distributed", "threads": cfg.threads, "devices": devices}
        if "dex-distributed" in cfg.methods:
            runs.append(("dex-distributed", bool(adapters), True, distributed))
        if "ar-pipeline" in cfg.methods:  # AR through these stages on the distributed schedule's devices
            runs.append(("ar-pipeline", False, False, distributed))
        for (method, use, decs, more), prune, draft in itertools.product(runs, cfg.prune, cfg.draft):
            if method == "ar-pipeline":  # nothing proposes: one decoder, whatever the bounds
                prune, draft = cfg.prune[0], cfg.draft[0]
            d = DexDecoder(
                bench.model,
                depths=depths,
                decs=decs,
                adapters=covered if use else {},
                tokenizer=bench.tokenizer,
                prune=prune,
                draft=draft,
                proposal_vocab=cfg.proposal_vocab,
                **more,
            )
            key = (
                method,
                depths,
                use,
                decs,
                d.prune,
                draft,
            )  # keyed by the bound it resolved to ('auto' may equal 1)
            if key in decoders:
                d.close()
            else:
                decoders[key] = d
    return decoders


def _hf(model, prompt, n):
    return hf_greedy(model, prompt, n), {}


def _stages(stage_ar, prompt, n):
    return stage_ar.generate(prompt, n).tokens, {}


def _dex(decoder, prompt, n):
    result = decoder.generate(prompt, n)
    return result.tokens, result.stats


def _pipeline(decoder, prompt, n):
    result = decoder.generate(prompt, n, pipeline=True)
    return result.tokens, result.stats


def _self_spec(model, stage_ar, tuned, adapter, prompt, n):
    if not tuned["exit"]:  # the grid search found plain AR cheapest: AR on the stage runner
        tokens = stage_ar.generate(prompt, n).tokens
        return tokens, {"steps": len(tokens), "layer_forwards": model.config.num_hidden_layers * len(tokens)}
    result = self_spec_generate(model, prompt, n, tuned["exit"], tuned["draft"], adapter)
    return result["tokens"], result


def _select(model, policy, tuned, adapters, prompt, n):
    result = select_generate(
        model, prompt, n, policy(), tuned["exits"], adapters
    )  # a fresh policy per prompt
    return result["tokens"], result


def _early_exit(model, tuned, prompt, n):
    return hf_early_exit_generate(model, prompt, n, tuned["exit"], tuned["draft"]), {}


def _prompt_lookup(model, drafts, prompt, n):
    result = hf_prompt_lookup_generate(model, prompt, n, drafts)
    return result["tokens"], result


def tensor_parallel(bench, size: int) -> TensorParallelAR:
    """ar-tp's ranks: the model's checkpoint folder (--quick: the tiny model, saved) in bench's dtype and device."""
    bench.log(f"ar-tp: starting {size} tensor-parallel ranks (transformers' tp_plan='auto')")
    source = bench.model if bench.cfg.quick else locate(bench.cfg.model, bench.log)
    return TensorParallelAR(source, size, bench.model.dtype, bench.device, bench.cfg.threads)


def _tp(group, prompt, n):
    answer = group.generate(prompt, n)
    stats = {"tp_size": group.size, "device": group.devices[0], "rank0_seconds": answer.seconds}
    return answer.tokens, {**stats, "rank0_prefill_seconds": answer.prefill_seconds}


def tp_row(outs: list) -> dict:
    """ar-tp's fields of a results row: its ranks, and rank 0's own seconds with the prefill apart."""
    size, device = outs[0][1]["tp_size"], outs[0][1]["device"]
    decode = sum(o[1]["rank0_seconds"] - o[1]["rank0_prefill_seconds"] for o in outs)
    on_cpu = "; on CPU: a correctness check, its speed here is no headline" if device == "cpu" else ""
    return dict(
        devices=size,
        tp_size=size,
        schedule=f"tensor parallel ({size} processes, transformers' tp_plan='auto'){on_cpu}",
        rank0_seconds=sum(o[1]["rank0_seconds"] for o in outs),
        rank0_decode_tokens_per_second=sum(len(o[0]) - 1 for o in outs) / decode if decode else None,
    )


def runners(bench, decoders: dict, stage_ar, tuning: dict, tp_group=None) -> dict:
    """The methods asked for, by key: ``runner(prompt, max_new_tokens) -> (tokens, stats)``."""
    model, ss, hf = bench.model, tuning.get("self-spec"), tuning.get("hf-early-exit")
    out = {
        "ar-hf": partial(_hf, model),
        "ar-stages": partial(_stages, stage_ar),
        **{key: partial(_pipeline if key[0] == "ar-pipeline" else _dex, d) for key, d in decoders.items()},
    }
    if ss:
        out["self-spec"] = partial(_self_spec, model, stage_ar, ss, bench.adapters.get(ss["exit"]))
    if hf:
        out["hf-early-exit"] = partial(_early_exit, model, hf)
    if "adadecode" in tuning:
        confident = partial(Confidence, tuning["adadecode"]["threshold"], tuning["adadecode"]["draft"])
        out["adadecode"] = partial(_select, model, confident, tuning["adadecode"], bench.adapters)
    if "del" in tuning:
        running = partial(Running, ModelCost.of(model, bench.adapters), frozenset(bench.adapters))
        out["del"] = partial(_select, model, running, tuning["del"], bench.adapters)
    out["hf-prompt-lookup"] = partial(_prompt_lookup, model, bench.cfg.prompt_lookup_num_tokens)
    if tp_group:
        out["ar-tp"] = partial(_tp, tp_group)
    return {k: v for k, v in out.items() if (k if isinstance(k, str) else k[0]) in bench.cfg.methods}
