"""One prepared GPU check: is DEX exact, certified and timed right on this machine's accelerator?

    python benchmarks/gpu_check.py --model random --prompts 2 --max-new-tokens 48 --time-limit 420 \
        --out runs/gpu.json --markdown runs/gpu.md                               # one lent GPU, < 8 min (docs/GPU.md)
    python benchmarks/gpu_check.py --device cpu --quick                          # the same code, tiny model

Sections, each on ``--device`` (all times from ``dex_core.runtime.clock.Clock``: CUDA events on a GPU), in this
order (``--sections`` picks; ``--time-limit`` starts none past its seconds and lists those left as skipped):

1. host reads: reads of tensor values into Python a round (at most one), with where each was made.
2. compiled: the stage step eager and through ``torch.compile`` (default, and ``reduce-overhead``: CUDA graphs) at
   K = ``--compiled-explorers`` (the least K by default), tokens identical, tokens/s after a warm-up,
   compilations made, CUDA graphs skipped, new (op, shape) pairs after warm-up (eager).
3. speed (``--speed-dtype``): HF greedy (AR) and DEX for each K, tokens/s measured on one device, the
   projected K-device tokens/s (each round's slowest explorer + bookkeeping + decode; the exchange
   between devices is left out and said so) and rounds/token.
4. real size (``dex_core.evaluation.bench.real_size``): one decoder layer, the LM head, a light head and an
   adapter of the shapes of Llama-2-70B, CodeLlama-34B and Qwen3-32B (bfloat16, random weights made on the
   device, nothing downloaded) after a 2,048-token context: the layer's stage step alone (its table on the device;
   eager at 1..64 rows, and for ``--compile-shapes`` compiled and captured at 1, 8, 32, 64; ms and GB/s of its
   weights), its host table timed apart, TP shards, the links at each K; then a **projection**
   (``dex_core.evaluation.bench.projection``): the replayed rounds (``--rounds-from``: by default the default
   model's at K = 2, 4, 8; this run's own when its model is trained) of DEX-1/K against pipeline AR and TP = K,
   in columns of measured or bandwidth-bound compute (``--peak-bandwidth``, ``--bandwidth-fraction``) by measured
   or priced links (``--link`` for NVLink, PCIe and a network). ``--quick``: shapes scaled down for a CPU.
5. exactness: sequential DEX (K explorers, adapters, light proposal heads, DECS) in float32 — tokens
   identical to the AR reference ``ar_generate`` and to HF greedy ``generate``; in bfloat16 — every
   committed token certified by ``dex_core.evaluation.verify`` (teacher-forced, unmodified model), identical counts
   beside it; seeded sampling in bfloat16 the same way.
6. distributed: the distributed schedule with one explorer per visible GPU (NCCL) when two or more are
   visible, tokens compared with the sequential schedule; with one GPU two explorers share it (shared
   mode: rows staged through the host over gloo, as NCCL refuses two ranks on one GPU); on the CPU
   (``--quick``) two gloo processes.
7. shared: four requests sharing rounds (``DexDecoder.share``) against the same one at a time, on the sequential
   schedule and on the distributed one (section 6's devices): each one's tokens against its own alone, and the
   aggregate tokens/s of both ways.
8. profile: seconds of one decoder layer, the full LM head and a light head at 1..64 rows (this model).
9. training: distributed adapter training (``dex train-adapters --backend distributed``) on the devices of
   section 6, beside training in one process: the adapters' largest difference after the same steps, tokens/s.

``--model default`` is SmolLM2-135M-Instruct with its shipped adapters; ``--model random`` the same
architecture with seeded random weights and fresh adapters (for a machine that cannot fetch the model:
exactness, certification and timings mean the same; rounds/token do not, the weights are untrained).
Every section states the precision its weights are in: sections in bfloat16 run on a bfloat16 copy, so the
float32 sections always use the float32 weights as loaded. Writes one JSON (``--out``, after every section) and one
markdown table (``--markdown``; always printed), creating their folders.
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
from dex_core.analysis.profile import decode_order_seconds, row_blocks, row_budget, stage_seconds
from dex_core.config import DEVICE_HELP, GenerationOptions, resolve_depths
from dex_core.device import exact_float32_matmuls
from dex_core.evaluation.bench.projection import FRACTION, LINKS, Pricing, columns, parse_link, peak_bandwidth
from dex_core.evaluation.bench.real_size import ROWS, SHAPES, STEP_ROWS, Plan, scaled, time_shapes
from dex_core.evaluation.verify import Certificate, certify_tokens
from dex_core.host_reads import reads_per_event
from dex_core.model.adapters import new_adapters, save_adapters
from dex_core.model.load import load_model, resolve_device
from dex_core.runtime.clock import Clock
from dex_core.runtime.request import encode_prompt
from dex_core.shapes import OpShapes, after_first_round
from dex_core.testing import tiny_model
from dex_core.trace.events import EndEvent, RoundEvent

ROUNDS = Path(__file__).resolve().parents[1] / "docs" / "results" / "gpu-check-rounds-default-cpu-b32.json"
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


def real_size(runs: list[dict], device, plan: Plan, pricing: Pricing | None, quick: bool) -> dict:
    """The real-size shapes timed on ``device`` (``plan``: ``dex_core.evaluation.bench.real_size``) and DEX-1/K
    projected against pipeline AR and tensor parallelism from measured runs' rounds (``runs``: speed rows with
    ``batch_sizes``), one projection per (link, compute) column (``projection.columns``; ``pricing``: the
    bandwidth-bound compute and the priced link classes, None where the device's peak is unknown); ``quick``:
    shapes scaled down for a CPU."""
    shapes = {name: scaled(s) if quick else s for name, s in SHAPES.items()}
    timed = time_shapes(shapes, device, plan)
    projections = {
        name: [
            {"run": r["method"], "source": r["source"], "K": len(r["batch_sizes"][0])}
            | {"columns": columns(timed["tables"][name], shape["layers"], r, pricing)}
            for r in runs
        ]
        for name, shape in shapes.items()
    }
    # prune="auto"'s rule on this device: the most rows a K = 8 stage runs with every step within 10% of its 2-row step
    budgets = {
        name: row_budget(stage_seconds(timed["tables"][name], shape["layers"] / 8))
        for name, shape in shapes.items()
    }
    return timed | {
        "weights": "bfloat16, random (shapes only)" + (", scaled down for a CPU" if quick else ""),
        "row_budget_k8": budgets,
        "projection": projections,
        "pricing": None if pricing is None else pricing.describe(),
        "label": "projection: measured rounds (rows per explorer per round, host work per round) replayed on these "
        "timings (formulas: dex_core/evaluation/bench/projection.py)",
    }


def pricing_of(args, device_name: str) -> Pricing | None:
    """The priced columns' assumptions: the device's peak memory bandwidth (``--peak-bandwidth``, else
    ``projection.peak_bandwidth`` of its name; None when neither knows it), ``--bandwidth-fraction`` and the link
    classes (``projection.LINKS``, each ``--link`` replacing one)."""
    given = {"peak"} if args.peak_bandwidth else set()
    peak = (args.peak_bandwidth, "given") if args.peak_bandwidth else peak_bandwidth(device_name)
    if peak is None:
        return None
    links = dict(LINKS)
    for text in args.link:
        name, link = parse_link(text)
        links[name] = link
        given.add(name)
    if args.bandwidth_fraction != FRACTION:
        given.add("fraction")
    return Pricing(
        peak=peak[0], source=peak[1], fraction=args.bandwidth_fraction, links=links, given=frozenset(given)
    )


def replayed_runs(report: dict, label: str, others: list[str]) -> list[dict]:
    """The DEX speed rows of ``report`` (a trained model's only: an untrained one's rounds mean nothing) and of each
    earlier report in ``others`` (``--rounds-from``), each named by where its rounds were measured."""
    untrained = report["model"] in ("tiny random", "random")
    runs = [] if untrained else [r | {"source": label} for r in report.get("speed", [])[1:]]
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


def shared(model, prompts, adapters, tokens) -> dict:
    """Requests sharing rounds (``DexDecoder.share``) against the same requests one at a time, on the sequential
    schedule on this device and on the distributed one (``distributed``'s devices): each request's tokens against its
    own alone, and the aggregate tokens/s of all at once over one at a time (wall seconds, ended by each run's end
    event, which waits for the device)."""
    requests = [(p, max(1, tokens * (4 - i) // 4)) for i, p in enumerate((list(prompts) * 4)[:4])]  # unequal
    gpus = torch.cuda.device_count() if torch.cuda.is_available() and model.device.type == "cuda" else 0
    devices = [f"cuda:{k}" for k in range(min(gpus, 4))] if gpus >= 2 else ["cuda:0" if gpus else "cpu"] * 2
    section = {"requests": len(requests), "new_tokens": [n for _, n in requests]}
    for name, options in (
        ("sequential", {}),
        ("distributed", {"backend": "distributed", "devices": devices, "threads": 1}),
    ):
        with decoder(model, len(devices), adapters, **options) as dex:
            dex.generate(requests[0][0], 4)  # warm-up
            tic = time.perf_counter()
            alone = [dex.generate(p, n).tokens for p, n in requests]
            one_at_a_time = time.perf_counter() - tic
            dex.share(len(requests))
            tic = time.perf_counter()
            together = interleaved(dex, requests)
            at_once = time.perf_counter() - tic
            dex.share(1)
        made = sum(len(t) for t in alone)
        section[name] = {
            "devices": options.get("devices", [str(model.device)] * len(devices)),
            "identical_to_alone": sum(a == t for a, t in zip(alone, together)),
            "one_at_a_time_tokens_per_second": made / one_at_a_time,
            "shared_tokens_per_second": made / at_once,
            "shared_vs_one_at_a_time": one_at_a_time / at_once,
        }
    return section


def interleaved(dex, requests) -> list[list[int]]:
    """Every request streamed at once, an event of each in turn; each one's tokens."""
    streams = [dex.stream(p, n) for p, n in requests]
    ends = [None] * len(streams)
    while None in ends:
        for i, stream in enumerate(streams):
            if ends[i] is None and isinstance(event := next(stream), EndEvent):
                ends[i] = event.tokens
    return ends


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
        "shared": lambda r: ["", f"requests sharing rounds against one at a time: {json.dumps(r)}"],
        "host_reads": lambda r: ["", f"host reads a round: {json.dumps(r)}"],
        "compiled": lambda r: ["", f"compiled stage step: {json.dumps(r)}"],
        "training": lambda r: ["", f"distributed adapter training beside one process: {json.dumps(r)}"],
    }
    for name, part in parts.items():
        if name in report:
            lines += part(report[name])
    for name, error in report.get("errors", {}).items():
        lines += ["", f"section {name} FAILED:", "", "```", error.rstrip(), "```"]
    if report.get("skipped"):
        lines += ["", f"sections SKIPPED (past --time-limit): {', '.join(report['skipped'])}"]
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
    """The stage step alone, the real-size parts (ms at 1 row, and the layer at the most rows) and the projection,
    labelled as one."""
    where = " — on a CPU: not yet measured on a GPU" if device.startswith("cpu") else ""
    big = max(section["rows"])
    lines = ["", f"real size ({section['weights']}; context {section['context']} tokens){where}:"]
    lines += step_markdown(section)
    lines += [
        "",
        f"| shape (layer: its step's mode) | layer 1 row (ms) | layer {big} rows | head 1 | light head 1 | adapter 1 | "
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
        cells = " | ".join(f"{v:.3f}" for v in ms)
        lines.append(f"| {name} ({t['layer_mode']}) | {cells} | {links} |")
    budgets = ", ".join(f"{name} {b}" for name, b in section["row_budget_k8"].items())
    lines += [
        "",
        "row budget (prune=auto's rule: the most rows a K = 8 stage runs with every step within 10% of its 2-row"
        f" step): {budgets}",
    ]
    return lines + projection_markdown(section)


def step_markdown(section: dict) -> list[str]:
    """The stage step alone per mode (ms, and GB/s of the layer's weights read), and its host table apart (ms)."""
    rows = section["rows"]
    lines = [
        "",
        "stage step alone, its mask table on the device (ms, GB/s of the layer's weights read); host table: made on "
        "the host and sent (ms):",
        "",
        "| shape | mode | " + " | ".join(f"{n} row{'s' * (n > 1)}" for n in rows) + " |",
        "|---" * (2 + len(rows)) + "|",
    ]
    for name, t in section["tables"].items():
        size = t["bytes"]["layer"]
        for mode, table in t["step"].items():
            cells = [
                f"{1000 * table[n]:.3f} ({size / table[n] / 1e9:.0f})" if n in table else "–" for n in rows
            ]
            if mode == "captured" and t["cudagraph_skips"]:  # inductor declined a graph: only compiled
                mode = f"captured ({t['cudagraph_skips']} CUDA graphs skipped)"
            lines.append(f"| {name} | {mode} | " + " | ".join(cells) + " |")
        lines.append(
            f"| {name} | host table | " + " | ".join(f"{1000 * t['host'][n]:.3f}" for n in rows) + " |"
        )
    return lines


def projection_markdown(section: dict) -> list[str]:
    """The measured column term by term, then every column's speedups (module docstring of ``projection``)."""
    lines = [
        "",
        f"{section['label']}; measured compute and links, ms per token, compute + host + link:",
        "",
        "| shape | rounds of | K | widest stage | DEX-1/K | pipeline AR | TP=K | DEX vs AR | DEX vs TP | "
        "vs AR, vs TP (compute only) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, rows in section["projection"].items():
        lines += [projection_line(name, p) for p in rows]
    pricing = section["pricing"]
    if pricing is None:
        return lines + [
            "",
            "bandwidth-bound and priced links: the device's peak bandwidth is unknown (--peak-bandwidth)",
        ]
    links = "; ".join(
        f"{name} {1e6 * v['latency_seconds']:g} us a step, {v['bytes_per_second'] / 1e9:g} GB/s ({v['source']})"
        for name, v in pricing["links"].items()
    )
    lines += [
        "",
        f"DEX-1/K's speedup over pipeline AR and over TP = K in each column, compute measured / bandwidth-bound "
        f"(weights / ({pricing['fraction']:g} ({pricing['fraction_source']}) x "
        f"{pricing['peak_bytes_per_second'] / 1e12:g} TB/s ({pricing['peak_source']}))); links: {links}:",
        "",
        "| shape | rounds of | K | "
        + " | ".join(f"{link} links" for link in ("measured", *pricing["links"]))
        + " |",
        "|---" * (4 + len(pricing["links"])) + "|",
    ]
    for name, rows in section["projection"].items():
        for p in rows:
            cells = [column_cell(by_compute) for by_compute in p["columns"].values()]
            lines.append(f"| {name} | {p['run']} | {p['K']} | " + " | ".join(cells) + " |")
    return lines


def column_cell(by_compute: dict) -> str:
    """'AR a / b, TP c / d': DEX's speedups with the measured compute / the bandwidth-bound one."""

    def ratio(p, over):
        return "–" if p["dex"] is None else f"{p[f'speedup_over_{over}']:.2f}"

    return ", ".join(
        f"{label} " + " / ".join(ratio(p, over) for p in by_compute.values())
        for label, over in (("AR", "pipeline_ar"), ("TP", "tensor_parallel"))
    )


def projection_line(name: str, row: dict) -> str:
    """One projection row's measured column: each method's terms in ms per token and DEX's speedups."""
    p = row["columns"]["measured"]["measured"]

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
        f"| {name} | {row['run']} ({row['source']}) | {p['K']} | {p['widest_stage_rows']} | {dex} | "
        f"{terms(p['pipeline_ar'])} | {terms(p['tensor_parallel'])} | {speedups} |"
    )


# issue 59's first (a time limit skips the last), then the rest; real_size after speed, whose rounds it replays
SECTIONS = (
    "host_reads",
    "compiled",
    "speed",
    "real_size",
    "exactness",
    "distributed",
    "shared",
    "profile",
    "training",
)


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
        default=None,
        help="an earlier report (--out) whose speed rows' rounds the real-size section replays (repeatable; default: "
        f"{ROUNDS.relative_to(ROUNDS.parents[2])}, the default model's rounds at K = 2, 4, 8; none: only this run's)",
    )
    parser.add_argument(
        "--compile-shapes",
        default=next(iter(SHAPES)),
        help="real-size shapes whose stage step also runs compiled and captured (comma-separated, all, none)",
    )
    parser.add_argument(
        "--peak-bandwidth",
        type=float,
        help="the device's peak memory bandwidth, bytes/s (default: by its name, evaluation/bench/projection.py)",
    )
    parser.add_argument(
        "--bandwidth-fraction",
        type=float,
        default=FRACTION,
        help=f"of the peak a weight read reaches, for the bandwidth-bound column (default {FRACTION}: assumed)",
    )
    parser.add_argument(
        "--link",
        action="append",
        default=[],
        help="a link class's price, CLASS=LATENCY,BANDWIDTH (seconds a step, bytes/s one way), e.g. "
        "pcie=5e-6,25e9 (repeatable; defaults: "
        + ", ".join(f"{n}={v.latency:g},{v.bandwidth:g}" for n, v in LINKS.items())
        + ", assumed: docs/GPU.md)",
    )
    parser.add_argument(
        "--compiled-explorers", type=int, help="K of the compiled section (default: the least of --explorers)"
    )
    parser.add_argument(
        "--time-limit",
        type=float,
        default=0,
        help="seconds after which no further section starts (each is recorded as skipped); 0: none",
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
    args.compiled_explorers = args.compiled_explorers or min(args.explorers)
    rounds = args.rounds_from or [str(ROUNDS)]
    args.rounds_from = [] if rounds == ["none"] else rounds
    names = {"all": ",".join(SHAPES), "none": ""}.get(args.compile_shapes, args.compile_shapes)
    args.compile_shapes = tuple(n for n in names.split(",") if n)
    if unknown := set(args.compile_shapes) - set(SHAPES):
        parser.error(f"unknown shapes {sorted(unknown)}; the shapes are {', '.join(SHAPES)}")
    for text in args.link:
        try:
            parse_link(text)
        except ValueError as e:
            parser.error(str(e))
    return args


def real_size_of(args, report: dict, device) -> dict:
    """The real-size section on the runs replayed so far (``replayed_runs``), with ``args``' plan and pricing."""
    runs = replayed_runs(report, f"{report['model']} here", args.rounds_from)
    return real_size(runs, device, real_size_plan(args, runs), pricing_of(args, report["device"]), args.quick)


def real_size_plan(args, runs: list[dict]) -> Plan:
    """What the real-size section times: TP shards and links at the replayed runs' K; ``--quick``: rows up to 32
    (the replayed rounds' widest at budget 32), a 256-token context, compiled steps at 1 and 8 rows."""
    ranks = tuple(sorted({len(r["batch_sizes"][0]) for r in runs} or set(args.explorers)))
    if args.quick:
        return Plan(
            context=256,
            repeats=args.repeats,
            rows=ROWS[:6],
            ranks=ranks,
            compiled=args.compile_shapes,
            step_rows=(1, 8),
        )
    return Plan(repeats=args.repeats, ranks=ranks, compiled=args.compile_shapes, step_rows=STEP_ROWS)


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
        "real_size": lambda: real_size_of(args, report, device),
        "distributed": lambda: distributed(model, prompts, adapters, args.max_new_tokens, args.quick),
        "shared": lambda: shared(model, prompts, adapters, args.max_new_tokens),
        "host_reads": lambda: host_reads(model, prompts, K, adapters, args.max_new_tokens),
        "compiled": lambda: compiled(model, prompts, args.compiled_explorers, adapters, args.max_new_tokens),
        "training": lambda: training(model, args.quick),
    }
    for name in args.sections:  # in the order asked
        if args.time_limit and report.get("seconds", 0.0) > args.time_limit:
            report.setdefault("skipped", []).append(name)
            save()
            continue
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
