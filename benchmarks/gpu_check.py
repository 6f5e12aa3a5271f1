"""One prepared GPU check: is DEX exact, certified and timed right on this machine's accelerator?

    python benchmarks/gpu_check.py --out runs/gpu.json --markdown runs/gpu.md     # a CUDA machine, < 8 min
    python benchmarks/gpu_check.py --device cpu --quick                          # the same code, tiny model

Sections, each on ``--device`` (all times from ``dex_core.device.Clock``: CUDA events on a GPU):

1. exactness: sequential DEX (K explorers, adapters, light proposal heads, DECS) in float32 — tokens
   identical to the AR reference ``ar_generate`` and to HF greedy ``generate``; in bfloat16 — every
   committed token certified by ``dex_core.evaluation.verify`` (teacher-forced, unmodified model), identical counts
   beside it; seeded sampling in bfloat16 the same way.
2. speed (``--speed-dtype``): HF greedy (AR) and DEX for each K, tokens/s measured on one device, the
   projected K-device tokens/s (each round's slowest explorer + bookkeeping + decode; the exchange
   between devices is left out and said so) and rounds/token.
3. profile: seconds of one decoder layer, the full LM head and a light head at 1..64 rows (this model).
4. real size (``dex_core.evaluation.bench.real_size``): one decoder layer, the LM head, a light head and an
   adapter of the shapes of Llama-2-70B, CodeLlama-34B and Qwen3-32B (bfloat16, random weights made on the
   device, nothing downloaded) at 1..64 rows after a 2,048-token context, the exchange of one round's rows
   between two ranks, and from them a **projection**: DEX-1/K per token (the speed section's measured rounds
   replayed on the real-size timings) against pipeline AR on the same K devices. ``--quick``: shapes scaled
   down for a CPU.
5. distributed: the distributed schedule with one explorer per visible GPU (NCCL) when two or more are
   visible, tokens compared with the sequential schedule; with one GPU two explorers share it (shared
   mode: rows staged through the host over gloo, as NCCL refuses two ranks on one GPU); on the CPU
   (``--quick``) two gloo processes.
6. host reads: reads of tensor values into Python a round (at most one), with where each was made.
7. compiled: the stage step eager and through ``torch.compile`` (default, and ``reduce-overhead``: CUDA graphs),
   tokens identical, tokens/s after a warm-up, compilations made, new (op, shape) pairs after warm-up (eager).
8. training: distributed adapter training (``dex train-adapters --backend distributed``) on the devices of
   section 5, beside training in one process: the adapters' largest difference after the same steps, tokens/s.

``--model default`` is SmolLM2-135M-Instruct with its shipped adapters; ``--model random`` the same
architecture with seeded random weights and fresh adapters (for a machine that cannot fetch the model:
exactness, certification and timings mean the same; rounds/token do not, the weights are untrained).
Every section states the precision its weights are in: sections in bfloat16 run on a bfloat16 copy, so the
float32 sections always use the float32 weights as loaded. Writes one JSON (``--out``) and one markdown table
(``--markdown``; always printed), creating their folders.
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch

from dex_core import DexDecoder, ar_generate, hf_greedy
from dex_core.analysis.profile import decode_order_seconds, row_blocks, row_budget
from dex_core.config import DEVICE_HELP, GenerationOptions, resolve_depths
from dex_core.device import exact_float32_matmuls
from dex_core.evaluation.bench.real_size import SHAPES, project, scaled, time_shapes
from dex_core.evaluation.verify import Certificate, certify_tokens
from dex_core.host_reads import reads_per_event
from dex_core.model.adapters import new_adapters, save_adapters
from dex_core.model.load import load_model, resolve_device
from dex_core.runtime.clock import Clock
from dex_core.runtime.request import encode_prompt
from dex_core.shapes import OpShapes, after_first_round
from dex_core.testing import tiny_model
from dex_core.trace.events import RoundEvent

ROWS = (1, 2, 4, 8, 16, 32, 64)
PROMPTS = (
    "Give three tips for staying focused while studying.",
    "Write a Python function that reverses a list.",
    "Rewrite this sentence in the past tense: The committee meets every Tuesday in the old library and votes "
    "on new projects.",  # an answer that repeats its input: draft chains commit several tokens a round
    "Explain what a hash table is in two sentences.",
    "Summarize why the sky is blue.",
)


def random_model(device):
    """SmolLM2-135M's architecture (30 layers, hidden 576, vocab 49152, tied head) with seeded random weights."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        max_position_embeddings=2048,
        rope_theta=100000.0,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=None,
    )
    torch.manual_seed(0)
    with torch.device(device):
        return LlamaForCausalLM(config).eval()


def setup(args, device, folder: Path):
    """(model in float32, prompts as token ids, adapters option): the real or the random model."""
    if args.quick:
        model, tokenizer = tiny_model(layers=6, vocab=96).float().to(device), None
    elif args.model == "random":
        model, tokenizer = random_model(device), None
    else:
        model, tokenizer = load_model(args.model, dtype="float32", device=device)
    if tokenizer is not None:
        return model, [encode_prompt(tokenizer, p, True) for p in PROMPTS[: args.prompts]], "auto"
    gen = torch.Generator().manual_seed(1)
    vocab = model.config.vocab_size
    prompts = [torch.randint(vocab, (12 + 4 * i,), generator=gen).tolist() for i in range(args.prompts)]
    adapters = folder / "adapters.safetensors"  # fresh adapters and a ranking: the load path and light heads
    depths = sorted({d for K in args.explorers for d in _depths(model, K)[:-1]})
    save_adapters(
        adapters,
        new_adapters(model, depths),
        model,
        {"note": "gpu_check: untrained"},
        ranking=torch.randperm(vocab, generator=gen),
    )
    return model, prompts, str(adapters)


def _depths(model, K: int) -> tuple[int, ...]:
    return resolve_depths(model.config.num_hidden_layers, explorers=K)  # the uniform split


def decoder(model, K: int, adapters: str, **more) -> DexDecoder:
    rows = min(2048, model.config.vocab_size // 2)
    return DexDecoder(
        model,
        explorers=K,
        depths=_depths(model, K) if adapters != "auto" else None,
        adapters=adapters,
        proposal_vocab=rows,
        **more,
    )


def exactness(model, prompts, K, adapters, tokens) -> dict:
    """float32: identical counts; bfloat16: certified counts (greedy and seeded sampling) and identical counts."""
    out, original = {}, model
    for dtype in ("float32", "bfloat16"):
        model = in_dtype(original, dtype)
        dex = decoder(model, K, adapters)
        for mode, sampling in (("greedy", {}), ("sampled", {"temperature": 0.8, "top_p": 0.95})):
            if dtype == "float32" and mode == "sampled":
                continue
            rows = {"prompts": len(prompts), "dex_eq_ar": 0, "dex_eq_hf": 0, "ar_eq_hf": 0}
            certs = []
            for i, prompt in enumerate(prompts):
                seed = {"seed": i} if sampling else {}
                got = dex.generate(prompt, tokens, **sampling, **seed).tokens
                ref = ar_generate(model, prompt, tokens, **sampling, **seed).tokens
                hf = hf_greedy(model, prompt, tokens) if not sampling else None
                rows["dex_eq_ar"] += got == ref
                rows["dex_eq_hf"] += hf is not None and got == hf
                rows["ar_eq_hf"] += hf is not None and ref == hf
                certs.append(certify_tokens(model, prompt, got, GenerationOptions(**sampling, **seed)))
            cert = Certificate.combine(certs)
            rows.update(certified=cert.certified, tokens=cert.total, worst_gap=cert.worst_gap)
            out[f"{dtype} {mode}"] = rows | {"weights": weights_label(dtype)}
    return out


def in_dtype(model, dtype: str):
    """``model`` itself in float32, else a copy in ``dtype`` (rounding the model would round every later section)."""
    return model if dtype == "float32" else copy.deepcopy(model).to(getattr(torch, dtype))


def weights_label(dtype: str) -> str:
    return "float32 (as loaded)" if dtype == "float32" else f"{dtype} (a copy rounded from float32)"


def speed(model, prompts, Ks, adapters, tokens, dtype: str, prune="auto") -> list[dict]:
    """HF greedy and DEX per K, after one warm-up each, timed on the device's clock; each DEX row keeps its runs'
    rows per explorer per round (``batch_sizes``) for the real-size projection."""
    model = in_dtype(model, dtype)
    clock, rows = Clock(model.device), []

    def timed(run):
        run(prompts[0])  # warm-up
        start = clock.stamp()
        results = [run(p) for p in prompts]
        return results, clock.since(start)

    hf, ar_seconds = timed(lambda p: hf_greedy(model, p, tokens))
    ar_tokens = sum(len(t) for t in hf)
    rows.append({"method": "AR (HF generate)", "tokens_per_second": ar_tokens / ar_seconds, "vs_ar": 1.0})
    for K in Ks:
        dex = decoder(model, K, adapters, prune=prune)
        results, seconds = timed(lambda p: dex.generate(p, tokens))
        n = sum(len(r.tokens) for r in results)
        projected = sum(r.stats.projected_seconds + r.stats.prefill_seconds for r in results)
        rounds = sum(r.stats.rounds for r in results)
        rows.append(
            {
                "method": f"DEX K={K} (sequential, one device)",
                "tokens_per_second": n / seconds,
                "vs_ar": (n / seconds) / (ar_tokens / ar_seconds),
                "rounds_per_token": rounds / n,
                "drafted_share": sum(r.stats.drafted for r in results) / n,
                "projected_tokens_per_second": n / projected,
                "projected_vs_ar": (n / projected) / (ar_tokens / ar_seconds),
                "identical_to_ar": [r.tokens for r in results] == hf,
                "batch_sizes": [b for r in results for b in r.stats.batch_sizes],
                "host_seconds_per_round": sum(r.stats.bookkeeping_seconds for r in results) / max(1, rounds),
                "tokens": n,
            }
        )
    return rows


def profile(model, repeats: int, rows_counts) -> dict:
    """Seconds of one layer, the full head and a light head per row count, in a decode's order."""
    table = {}
    for n in rows_counts:
        blocks = row_blocks(model, n, proposal_rows=min(8192, model.config.vocab_size // 2))
        table[n] = decode_order_seconds(blocks, repeats, Clock(model.device))
    return table


def real_size(runs: list[dict], device, quick: bool, repeats: int) -> dict:
    """The real-size shapes timed on ``device`` and DEX-1/K projected against pipeline AR and tensor parallelism
    from measured runs' rounds (``runs``: speed rows with ``batch_sizes``; ``dex_core.evaluation.bench.real_size``);
    ``quick``: shapes scaled down, a shorter context."""
    shapes = {name: scaled(s) if quick else s for name, s in SHAPES.items()}
    ranks = sorted({len(r["batch_sizes"][0]) for r in runs})
    timed = time_shapes(
        shapes,
        device,
        context=256 if quick else 2048,
        repeats=repeats,
        rows=ROWS[:4] if quick else ROWS,
        ranks=ranks,
    )
    projections = {
        name: [
            project(timed["tables"][name], shape["layers"], r) | {"run": r["method"], "source": r["source"]}
            for r in runs
        ]
        for name, shape in shapes.items()
    }
    budgets = {  # prune="auto"'s rule on this device: the most rows a K = 8 stage runs for <= 10% over one row
        name: row_budget(timed["tables"][name], shape["layers"] / 8) for name, shape in shapes.items()
    }
    return timed | {
        "weights": "bfloat16, random (shapes only)" + (", scaled down for a CPU" if quick else ""),
        "row_budget_k8": budgets,
        "projection": projections,
        "label": "projection: measured rounds (rows per explorer per round, host work per round) replayed on these "
        "timings (formulas: dex_core/evaluation/bench/real_size.py)",
    }


def replayed_runs(report: dict, label: str, others: list[str]) -> list[dict]:
    """The DEX speed rows of ``report`` and of each earlier report in ``others`` (``--rounds-from``), each named
    by where its rounds were measured."""
    runs = [r | {"source": label} for r in report.get("speed", [])[1:]]
    for path in others:
        old = json.loads(Path(path).read_text())
        where = f"{old['model']} on {old['device']}, {old['speed_dtype']} ({Path(path).name})"
        runs += [r | {"source": where} for r in old["speed"][1:]]
    return runs


def distributed(model, prompts, adapters, tokens, quick: bool) -> dict:
    """The distributed schedule's tokens against the sequential schedule's: one explorer per GPU (NCCL, up to 4)
    with two or more GPUs, K=2 in shared mode on one GPU (rows through the host over gloo), on CPU two gloo
    processes (``--quick``)."""
    gpus = torch.cuda.device_count() if torch.cuda.is_available() and model.device.type == "cuda" else 0
    devices = [f"cuda:{k}" for k in range(min(gpus, 4))] if gpus >= 2 else ["cuda:0" if gpus else "cpu"] * 2
    K = len(devices)
    reference = decoder(model, K, adapters)
    want = [reference.generate(p, tokens).tokens for p in prompts]
    tic = time.perf_counter()
    with decoder(model, K, adapters, backend="distributed", devices=devices, threads=1) as dex:
        got = [dex.generate(p, tokens) for p in prompts]
        link = dex.group.data_link
    return {
        "devices": devices,
        "backend": link.backend,
        "rows_staged_through_host": link.staged,
        "identical_to_sequential": sum(g.tokens == w for g, w in zip(got, want)),
        "prompts": len(prompts),
        "tokens_per_second": sum(len(g.tokens) for g in got) / sum(g.stats.wall_seconds for g in got),
        "seconds_with_start": time.perf_counter() - tic,
    }


def training(model, quick: bool) -> dict:
    """Distributed adapter training (``dex_core.training.group``: NCCL between GPUs, gloo staged through the
    host on one GPU, gloo on CPU) against training in one process, on the devices ``distributed`` takes: the same
    steps on the same random windows, the adapters' largest difference, each one's tokens/s (every step timed to
    its end: the loss is read on the host at each step)."""
    import itertools
    import tempfile

    from dex_core.training.group import train_distributed
    from dex_core.training.train import TrainConfig, train_adapters

    gpus = torch.cuda.device_count() if torch.cuda.is_available() and model.device.type == "cuda" else 0
    devices = [f"cuda:{k}" for k in range(min(gpus, 4))] if gpus >= 2 else ["cuda:0" if gpus else "cpu"] * 2
    K, L, seq = len(devices), model.config.num_hidden_layers, 32 if quick else 192
    steps = 3 if quick else 12
    inner = tuple(-(-(k + 1) * L // K) for k in range(K - 1))  # the K split's inner depths
    cfg = TrainConfig(depths=inner, tokens=steps * seq, seq_len=seq, bf16=False, checkpoint_every=steps)
    windows = torch.randint(
        0, model.config.vocab_size, (steps, seq), generator=torch.Generator().manual_seed(0)
    )
    with tempfile.TemporaryDirectory() as folder:
        one = train_adapters(
            model,
            None,
            cfg,
            f"{folder}/one.safetensors",
            f"{folder}/one.ckpt",
            False,
            itertools.cycle(list(windows)),
        )
        ranks = train_distributed(
            model,
            cfg,
            f"{folder}/k.safetensors",
            f"{folder}/k",
            explorers=K,
            devices=devices,
            windows=windows,
            progress=False,
        )
        want = torch.load(f"{folder}/one.ckpt", weights_only=True)["adapters"]
        got = {}
        for path in Path(folder, "k").glob("rank-*.pt"):
            got |= torch.load(path, weights_only=True, map_location="cpu")["adapters"]
    return {
        "devices": devices,
        "depths": list(inner),
        "steps": steps,
        "max_abs_difference": max(
            (got[d][k].cpu() - want[d][k].cpu()).abs().max().item() for d in want for k in want[d]
        ),
        "single_tokens_per_second": one["tokens"] / max(one["seconds"], 1e-9),
        "distributed_tokens_per_second": ranks["tokens"] / max(ranks["seconds"], 1e-9),
    }


def host_reads(model, prompts, K: int, adapters, tokens) -> dict:
    """Host reads a round (``dex_core.host_reads``: tensor reads into Python and CUDA event syncs) of the
    sequential schedule at K on this device, greedy with the row budget and draft chains on; the distributed
    schedule's are counted per rank on CPU by tests/runtime/test_host_reads.py, on the same code path."""
    dex, per_round, places = decoder(model, K, adapters), [], {}
    for prompt in prompts:
        for event, counted in reads_per_event(dex.stream(prompt, tokens)):
            if isinstance(event, RoundEvent):
                per_round.append(counted.count)
                for (name, place), n in counted.by_place().items():
                    places[f"{name} at {place}"] = places.get(f"{name} at {place}", 0) + n
    return {
        "explorers": K,
        "rounds": len(per_round),
        "most_reads_a_round": max(per_round),
        "mean_reads_a_round": sum(per_round) / len(per_round),
        "where": places,
    }


def ran(dex, prompt, tokens: int, shapes: OpShapes | None = None) -> list[int]:
    """The tokens of one run, and with ``shapes`` the (op, shape) pairs of its rounds after the first (the prefill's
    follow the prompt's length) recorded in it."""
    events = dex.stream(prompt, tokens)
    if shapes is not None:
        events = after_first_round(events, shapes)
    return list(events)[-1].tokens


def compiled(model, prompts, K: int, adapters, tokens, modes=("default", "reduce-overhead")) -> dict:
    """The stage step eager and through ``torch.compile`` in each of ``modes`` (``reduce-overhead``: CUDA graphs)
    at K with the row budget, greedy: tokens against HF greedy, tokens/s on the device's clock after a warm-up run
    (the compilations), the compilations each mode made, CUDA graphs skipped, and (eager, in runs of their own: a
    dispatch mode slows what it watches and does not run beside a compiled frame) the (op, shape) pairs that
    runs of every prompt took which the warm-up had not, each run's first round left out (``shapes.OpShapes``)."""
    clock, rows, reference = Clock(model.device), [], [hf_greedy(model, p, tokens) for p in prompts]
    counters = torch._dynamo.utils.counters
    for mode in ("eager", *modes):
        dex, graphs = decoder(model, K, adapters), counters["stats"]["unique_graphs"]
        skips = counters["inductor"]["cudagraph_skips"]
        if mode != "eager":
            for e in dex.explorers:
                e.compile_step(mode=mode)
        tic = clock.stamp()
        ran(dex, prompts[0], tokens)
        warm_seconds, start = clock.since(tic), clock.stamp()
        results = [ran(dex, p, tokens) for p in prompts]
        seconds, new_shapes = clock.since(start), None
        if mode == "eager":
            warm, shapes = OpShapes(), OpShapes()
            ran(dex, prompts[0], tokens, warm)
            for p in prompts:
                ran(dex, p, tokens, shapes)
            new_shapes = len(shapes.seen - warm.seen)
        rows.append(
            {
                "mode": mode,
                "identical_to_ar": results == reference,
                "tokens_per_second": sum(map(len, results)) / seconds,
                "warm_up_seconds": warm_seconds,
                "compilations": counters["stats"]["unique_graphs"] - graphs,
                "cudagraph_skips": counters["inductor"]["cudagraph_skips"] - skips,
                "new_op_shapes_after_warm_up": new_shapes,
            }
        )
    return {"explorers": K, "runs": rows}


def markdown(report: dict) -> str:
    """The report's sections as markdown tables, the failed ones with their errors."""
    lines = [f"# GPU check: {report['device']} ({report['model']}, torch {report['torch']})"]
    parts = {
        "exactness": exactness_markdown,
        "speed": lambda r: speed_markdown(r, report["speed_dtype"]),
        "profile": profile_markdown,
        "real_size": lambda r: real_size_markdown(r, report["device"]),
        "distributed": lambda r: ["", f"distributed: {json.dumps(r)}"],
        "host_reads": lambda r: ["", f"host reads a round: {json.dumps(r)}"],
        "compiled": lambda r: ["", f"compiled stage step: {json.dumps(r)}"],
        "training": lambda r: ["", f"distributed adapter training beside one process: {json.dumps(r)}"],
    }
    for name, part in parts.items():
        if name in report:
            lines += part(report[name])
    for name, error in report.get("errors", {}).items():
        lines += ["", f"section {name} FAILED:", "", "```", error.rstrip(), "```"]
    return "\n".join(lines)


def exactness_markdown(section: dict) -> list[str]:
    lines = [
        "",
        "| exactness | weights | prompts | DEX = AR ref | DEX = HF | AR ref = HF | certified | worst gap |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, r in section.items():
        hf = ("n/a (sampled)",) * 2 if "sampled" in name else (r["dex_eq_hf"], r["ar_eq_hf"])
        lines.append(
            f"| {name} | {r['weights']} | {r['prompts']} | {r['dex_eq_ar']} | {hf[0]} | {hf[1]} | "
            f"{r['certified']} of {r['tokens']} | {r['worst_gap']:.3g} |"
        )
    return lines


def speed_markdown(section: list[dict], dtype: str) -> list[str]:
    lines = [
        "",
        f"| speed ({weights_label(dtype)}) | tokens/s | vs AR | rounds/token | drafted | projected "
        "tokens/s (exchange left out) | projected vs AR |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in section:
        projected = (
            f"{r['projected_tokens_per_second']:.1f} | {r['projected_vs_ar']:.2f}"
            if "projected_vs_ar" in r
            else "– | –"
        )
        lines.append(
            f"| {r['method']} | {r['tokens_per_second']:.1f} | {r['vs_ar']:.2f} | "
            f"{r.get('rounds_per_token', 1.0):.2f} | {r.get('drafted_share', 0.0):.0%} | {projected} |"
        )
    return lines


def profile_markdown(section: dict) -> list[str]:
    names = list(next(iter(section.values())))
    lines = [
        "",
        f"profile of this model ({weights_label('float32')}):",
        "",
        "| rows | " + " | ".join(f"{n} (ms)" for n in names) + " |",
        "|---" * (len(names) + 1) + "|",
    ]
    for n, r in section.items():
        lines.append(f"| {n} | " + " | ".join(f"{1000 * r[k]:.3f}" for k in names) + " |")
    return lines


def real_size_markdown(section: dict, device: str) -> list[str]:
    """The real-size timings (ms at 1 row, and the layer at the most rows) and the projection, labelled as one."""
    where = " — on a CPU: not yet measured on a GPU" if device.startswith("cpu") else ""
    big = max(section["rows"])
    lines = [
        "",
        f"real size ({section['weights']}; context {section['context']} tokens){where}:",
        "",
        f"| shape | layer 1 row (ms) | layer {big} rows | head 1 | light head 1 | adapter 1 | "
        + " | ".join(f"TP={T} layer shard 1" for T in section["ranks"])
        + " | links (exchange 1 row / p2p / all-reduce, ms) |",
        "|---" * (7 + len(section["ranks"])) + "|",
    ]
    for name, t in section["tables"].items():
        ms = [
            1000 * t[k][n]
            for k, n in (("layer", 1), ("layer", big), ("head", 1), ("proposal", 1), ("adapter", 1))
        ]
        ms += [1000 * t["tp"][T]["layer"] for T in section["ranks"]]
        links = "; ".join(
            f"{W} ranks ({v['backend']}): {1000 * v['exchange'][1]:.3f} / {1000 * v['p2p']:.3f} / "
            f"{1000 * v['all_reduce']:.3f}"
            for W, v in t["links"].items()
        )
        lines.append(f"| {name} | " + " | ".join(f"{v:.3f}" for v in ms) + f" | {links} |")
    budgets = ", ".join(f"{name} {b}" for name, b in section["row_budget_k8"].items())
    lines += [
        "",
        f"row budget (prune=auto's rule: the most rows a K = 8 stage runs for at most 10% over one row): {budgets}",
        "",
        f"{section['label']}; ms per token, compute + host + link:",
        "",
        "| shape | rounds of | K | widest stage | DEX-1/K | pipeline AR | TP=K | DEX vs AR | DEX vs TP | "
        "vs AR, vs TP (compute only) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, rows in section["projection"].items():
        for p in rows:
            lines.append(projection_line(name, p))
    return lines


def projection_line(name: str, p: dict) -> str:
    """One projection row: each method's terms in ms per token and DEX's speedups."""

    def terms(t):
        parts = " + ".join(f"{1000 * t[k]:.2f}" for k in ("compute", "host", "link") if k in t)
        return f"{1000 * t['total']:.2f} ({parts})"

    if p["dex"] is None:
        dex = speedups = "not projected: a round ran more rows than measured"
    else:
        dex = terms(p["dex"])
        speedups = (
            f"{p['speedup_over_pipeline_ar']:.2f} | {p['speedup_over_tensor_parallel']:.2f} | "
            f"{p['speedup_over_pipeline_ar_compute_only']:.2f}, {p['speedup_over_tensor_parallel_compute_only']:.2f}"
        )
    return (
        f"| {name} | {p['run']} ({p['source']}) | {p['K']} | {p['widest_stage_rows']} | {dex} | "
        f"{terms(p['pipeline_ar'])} | {terms(p['tensor_parallel'])} | {speedups} |"
    )


SECTIONS = ("exactness", "speed", "profile", "real_size", "distributed", "host_reads", "compiled", "training")


def arguments(argv):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cuda", help=DEVICE_HELP)
    parser.add_argument(
        "--model", default="default", help="default, random, or a model spec as for dex generate"
    )
    parser.add_argument(
        "--quick", action="store_true", help="a tiny random model, few tokens (the test suite)"
    )
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--explorers", default="2,4,8", help="values of K")
    parser.add_argument(
        "--prune", default="auto", help="the speed section's row budget: auto, a number, none"
    )
    parser.add_argument(
        "--speed-dtype",
        default=None,
        help="dtype of the speed section (default: bfloat16 on CUDA, float32 on the CPU)",
    )
    parser.add_argument("--repeats", type=int, default=20, help="profile repeats per block")
    parser.add_argument(
        "--sections", default=",".join(SECTIONS), help="which sections to run, comma-separated"
    )
    parser.add_argument(
        "--rounds-from",
        action="append",
        default=[],
        help="an earlier report (--out) whose speed rows' rounds the real-size section replays too (a GPU machine "
        "that cannot fetch the default model replays its rounds measured elsewhere)",
    )
    parser.add_argument("--out")
    parser.add_argument("--markdown")
    args = parser.parse_args(argv)
    args.explorers = [int(k) for k in args.explorers.split(",")]
    args.prune = None if args.prune == "none" else args.prune if args.prune == "auto" else int(args.prune)
    args.sections = args.sections.split(",")
    if unknown := set(args.sections) - set(SECTIONS):
        parser.error(f"unknown sections {sorted(unknown)}; the sections are {', '.join(SECTIONS)}")
    if args.quick:
        args.prompts, args.max_new_tokens, args.explorers, args.repeats = 2, 8, [2, 3], 2
    return args


def run_sections(args, report: dict, model, prompts, adapters, device, save) -> None:
    """Each asked-for section into ``report``, saved after each; a section that fails is recorded (its error's
    last lines) and the next one runs, so that one broken section on a lent GPU loses nothing else."""
    K = max(args.explorers)
    work = {
        "exactness": lambda: exactness(model, prompts, K, adapters, args.max_new_tokens),
        "speed": lambda: speed(
            model, prompts, args.explorers, adapters, args.max_new_tokens, report["speed_dtype"], args.prune
        ),
        "profile": lambda: profile(model, args.repeats, ROWS[:3] if args.quick else ROWS),
        "real_size": lambda: real_size(
            replayed_runs(report, f"{report['model']} here", args.rounds_from),
            device,
            args.quick,
            args.repeats,
        ),
        "distributed": lambda: distributed(model, prompts, adapters, args.max_new_tokens, args.quick),
        "host_reads": lambda: host_reads(model, prompts, K, adapters, args.max_new_tokens),
        "compiled": lambda: compiled(model, prompts, K, adapters, args.max_new_tokens),
        "training": lambda: training(model, args.quick),
    }
    for name in args.sections:  # in the order asked
        tic = time.perf_counter()
        try:
            report[name] = work[name]()
        except Exception:  # noqa: BLE001 - recorded in the report, which says the check failed
            report.setdefault("errors", {})[name] = traceback.format_exc(limit=-6)
        report.setdefault("section_seconds", {})[name] = time.perf_counter() - tic
        save()


def main(argv=None) -> int:
    args = arguments(argv)
    exact_float32_matmuls()  # once per process: float32 stays float32 (dex_core/device.py)
    device = resolve_device(args.device)
    tic = time.perf_counter()
    report = {
        "device": torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)",
        "model": "tiny random" if args.quick else args.model,
        "torch": torch.__version__,
        "speed_dtype": args.speed_dtype or ("bfloat16" if device.type == "cuda" else "float32"),
        "max_new_tokens": args.max_new_tokens,
        "explorers": args.explorers,
        "prune": args.prune,
    }

    def save():
        report["seconds"] = time.perf_counter() - tic
        if args.out:
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(json.dumps(report, indent=1))

    with tempfile.TemporaryDirectory(prefix="dex-gpu-check-") as folder:
        model, prompts, adapters = setup(args, device, Path(folder))
        run_sections(args, report, model, prompts, adapters, device, save)
    text = markdown(report)
    print(text)
    if args.markdown:
        Path(args.markdown).parent.mkdir(parents=True, exist_ok=True)
        Path(args.markdown).write_text(text + "\n")
    exact = report.get("exactness")
    ok = "errors" not in report and (
        exact is None
        or all(r["certified"] == r["tokens"] for r in exact.values())
        and exact["float32 greedy"]["dex_eq_ar"] == len(prompts)
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
