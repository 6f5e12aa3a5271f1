"""One prompt set of a ``dex bench`` run: every method on its prompts, interleaved prompt by prompt, then its result
rows (exact, certified, timed), the EAD oracle and HF greedy's answers; or, when an earlier stopped run finished the
set (``Finished``), those read back."""

from __future__ import annotations

import json

import torch

from ...analysis.ead import matches
from ...model.cost import ModelCost
from ...model.lens import layer_candidates
from ...runtime.clock import Clock
from ..verify import Certificate, certify_tokens
from .methods import tp_row
from .rows import SetContext, result_row


def finished_set(bench, report: dict, name: str, prompts: list, methods, decoders, finished) -> dict:
    """Set ``name``'s results: read back when ``finished`` (a ``Finished`` or None) has them, else run and kept."""
    piece = f"{bench.cfg.split}:{name}"
    if finished is not None and piece in finished:
        bench.log(f"{name}: finished by an earlier run ({finished.path}), read back")
        return finished.get(piece)
    done = _run_set(bench, report, name, prompts, methods, decoders)
    if finished is not None:
        finished.put(piece, done)
    return done


def add_set(report: dict, name: str, done: dict) -> None:
    """One set's rows, EAD oracle and HF greedy answers (``_run_set``'s) into ``report``."""
    report["results"].extend(done["results"])
    report["oracle"][name], report["answers"][name] = done["oracle"], done["answers"]


def _run_set(bench, report: dict, name: str, prompts: list, methods: dict, decoders: dict) -> dict:
    """Every method on the set's prompts, interleaved prompt by prompt: the set's rows, EAD oracle and answers
    (``report`` read for its tuning and profile), as plain JSON values (what a resumed run reads back is what
    this run hands on)."""
    cfg, model = bench.cfg, bench.model
    bench.log(f"{name}: {len(prompts)} prompts x {cfg.max_new_tokens} new tokens")
    clock, outs = Clock(model.device), {k: [] for k in methods}
    for i, prompt in enumerate(prompts):
        for key, run in methods.items():
            with clock.span(key):  # on CUDA: device time, read once the device has passed it
                outs[key].append(run(prompt, cfg.max_new_tokens))
        bench.log(f"  {name} {i + 1}/{len(prompts)}: {len(outs['ar-hf'][-1][0])} tokens")
    seconds = clock.read()
    ctx = _context(bench, report, prompts, [o[0] for o in outs["ar-hf"]], decoders)
    omega = matches(ctx.cands[bool(bench.adapters)], ctx.flat)
    stable = float(
        (torch.where(~omega, torch.arange(1, bench.L + 1, device="cpu"), 0).max(dim=1).values + 1)
        .double()
        .mean()
    )
    rows = []
    for key in methods:
        row = result_row(key, outs[key], ctx)
        cert = Certificate.combine(certify_tokens(model, p, o[0]) for p, o in zip(prompts, outs[key]))
        row.update(
            set=name,
            seconds=seconds[key],
            certified=cert.certified,
            certified_worst_gap=cert.worst_gap,
            tokens_per_second=row["tokens"] / seconds[key],
            tokens_per_second_kind="measured",
            speedup_vs_ar=seconds["ar-hf"] / seconds[key],
            layer_speedup=bench.L / row["layer_forwards_per_token"],
            cost_share_of_ar=row["cost_per_token"] / ctx.cost.ar(),
        )
        if key == "ar-tp":
            row.update(tp_row(outs[key]))
        rows.append(row)
    oracle = {"layer_forwards_per_token": stable, "speedup": bench.L / stable}
    return json.loads(json.dumps({"results": rows, "oracle": oracle, "answers": ctx.refs}))


def _context(bench, report: dict, prompts: list, refs: list, decoders: dict) -> SetContext:
    """What the rows of one prompt set are computed from: the references, every layer's candidates, the costs."""
    model, adapters = bench.model, bench.adapters
    shortlist = next((d.shortlist for d in decoders.values()), None)
    lens = {
        use: [
            layer_candidates(model, p, r, adapters if use else {}, shortlist=shortlist)
            for p, r in zip(prompts, refs)
        ]
        for use in {False, bool(adapters)}
    }
    return SetContext(
        refs=refs,
        flat=torch.tensor([t for r in refs for t in r], device="cpu"),
        L=bench.L,
        tuning=report["tuning"],
        lookup=bench.cfg.prompt_lookup_num_tokens,
        cost=ModelCost.of(model, adapters),
        dex_cost={k: ModelCost.of(model, adapters, d.proposal_vocab) for k, d in decoders.items()},
        proposal_vocab={k: d.proposal_vocab for k, d in decoders.items()},
        cands={use: torch.cat(c) for use, c in lens.items()},
        adapters=adapters,
        profile=report["profile"],
    )
