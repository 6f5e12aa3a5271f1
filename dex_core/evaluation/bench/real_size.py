"""Real-size layers on the device at hand: what DEX's rounds, pipeline AR's tokens and tensor parallelism's tokens
would take at 34B-70B.

A 135M model's layers say nothing about a 70B model's rounds, and a 70B model does not fit the machines this
project is checked on. So ``time_shapes`` builds, for each of ``SHAPES`` (the published shapes of
Llama-2-70B, CodeLlama-34B and Qwen3-32B), one decoder layer with the model's embedding, final norm and LM head
— random weights created on the device in bfloat16, nothing downloaded — and times with ``Clock`` (CUDA
events on a GPU), at 1..64 rows after a ``context``-token context, in a decode's order
(``decode_order_seconds``, under ``torch.inference_mode``): the layer, the full head, a light proposal head of
``PROPOSAL_ROWS`` rows and an inducing adapter (m = 2h); then one row through a tensor-parallel rank's shard of the
layer and of the head (``shard``: heads, MLP width and vocabulary / T) for each T. The links are timed among W
fresh processes for each W (``analysis.collectives.link_seconds``: NCCL when W GPUs are visible, else gloo through
the host, the link of explorers sharing a GPU): a round's exchange of n rows, one row's point-to-point send, one
row's all-reduce.

``project`` replays a measured run's rounds (``batch_sizes``: rows per explorer per round, and its measured host
work per round) on those timings, explorer k holding L_k = L/K of the real model's L layers — a **projection**,
labelled as one, term by term:

    DEX-1/K per token = [ sum over rounds of max_k stage_k(n_k)                     (compute)
                          + rounds x host                                          (host: measured per round)
                          + sum over rounds of exchange_K(max_k n_k) ] / tokens     (link: at K ranks)
        stage_k(n) = L_k layer(n) + head_k(n) + adapter(n)   (head_k: the full head at the last stage, else the
                     light head; no adapter at the last stage)
    pipeline AR per token = L layer(1) + head(1)  +  (K - 1) p2p(1)
    tensor parallel (T = K) per token = L layer_T(1) + head_T(1)  +  (2 L + 1) all_reduce_T(1)
        (two all-reduces a layer, after attention and after the MLP; one more gathers the head shards' choice)

Rows are read between measured points only: a run with a round past the measured rows is not projected. The
baselines' host work is left out (which favours them), and so is the token's way back to the first stage in
pipeline AR. ``scaled`` shrinks every shape for a CPU (the suite runs the section so that it cannot rot before a
GPU runs it).
"""

from __future__ import annotations

import torch

from ...analysis.collectives import link_seconds
from ...analysis.profile import decode_order_seconds, interpolate, row_blocks
from ...config import resolve_depths
from ...model.adapters import InducingAdapter
from ...runtime.clock import Clock

ROWS = (1, 2, 4, 8, 16, 32, 64)
PROPOSAL_ROWS = 8192
# the published configs' shapes (config.json of meta-llama/Llama-2-70b-hf, codellama/CodeLlama-34b-hf,
# Qwen/Qwen3-32B); layers is the real model's depth, the check builds one of them
SHAPES = {
    "Llama-2-70B": dict(
        model_type="llama", layers=80, hidden_size=8192, intermediate_size=28672, num_attention_heads=64,
        num_key_value_heads=8, vocab_size=32000, rope_theta=10000.0,
    ),
    "CodeLlama-34B": dict(
        model_type="llama", layers=48, hidden_size=8192, intermediate_size=22016, num_attention_heads=64,
        num_key_value_heads=8, vocab_size=32000, rope_theta=1000000.0,
    ),
    "Qwen3-32B": dict(
        model_type="qwen3", layers=64, hidden_size=5120, intermediate_size=25600, num_attention_heads=64,
        num_key_value_heads=8, head_dim=128, vocab_size=151936, rope_theta=1000000.0,
    ),
}  # fmt: skip


def scaled(shape: dict, factor: int = 32) -> dict:
    """``shape`` shrunk for a CPU: widths / ``factor``, heads / 8 (head_dim / 4), vocabulary / 16, same depth."""
    small = dict(shape, hidden_size=shape["hidden_size"] // factor)
    small["intermediate_size"] = shape["intermediate_size"] // factor
    small["num_attention_heads"] = shape["num_attention_heads"] // 8
    small["num_key_value_heads"] = max(1, shape["num_key_value_heads"] // 8)
    small["vocab_size"] = shape["vocab_size"] // 16
    if "head_dim" in shape:
        small["head_dim"] = shape["head_dim"] // 4
    return small


def one_layer_model(shape: dict, device, dtype=torch.bfloat16):
    """A model of ``shape`` with one decoder layer, random weights made on ``device`` in ``dtype``."""
    # deferred: transformers takes seconds to import (docs/ARCHITECTURE.md, Imports)
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(
        shape["model_type"], num_hidden_layers=1, max_position_embeddings=8192, tie_word_embeddings=False
    )
    for key, value in shape.items():  # set after the check of a whole model's shape: a shard's heads need not
        if key not in ("model_type", "layers"):  # divide its hidden size
            setattr(config, key, value)
    if isinstance(
        getattr(config, "rope_parameters", None), dict
    ):  # transformers 5 reads rope_theta from there
        config.rope_parameters = dict(config.rope_parameters, rope_theta=shape["rope_theta"])
    torch.manual_seed(0)
    with torch.device(device):
        return AutoModelForCausalLM.from_config(config, dtype=dtype).eval()


def shard(shape: dict, ranks: int) -> dict:
    """One tensor-parallel rank's share of a layer of ``shape`` over ``ranks`` devices (Megatron's split): query
    and key/value heads, the MLP's width and the vocabulary divided (rounded up: the largest shard sets the pace; at
    least one key/value head, whole query groups), the hidden size and head size kept."""
    part = dict(shape, head_dim=shape.get("head_dim", shape["hidden_size"] // shape["num_attention_heads"]))
    for field in ("num_attention_heads", "num_key_value_heads", "intermediate_size", "vocab_size"):
        part[field] = max(1, -(-shape[field] // ranks))
    groups = part["num_key_value_heads"]  # whole query groups per key/value head
    part["num_attention_heads"] = -(-part["num_attention_heads"] // groups) * groups
    return part


def time_shape(shape: dict, device, context: int, repeats: int, rows=ROWS, tp=()) -> dict:
    """{table: {rows: seconds}} of one layer (``layer``), the full head (``head``), a light head (``proposal``)
    and an adapter (``adapter``) of ``shape`` on ``device`` in bfloat16; and ``tp``: {T: {"layer": s, "head": s}},
    one row through a tensor-parallel rank's shard of the layer and of the head (``shard``) for each T."""
    model = one_layer_model(shape, device)
    hidden = shape["hidden_size"]
    adapter = InducingAdapter(hidden, 2 * hidden, device=model.device, dtype=model.dtype).eval()
    clock, tables = Clock(model.device), {"layer": {}, "head": {}, "proposal": {}, "adapter": {}}
    for n in rows:
        blocks = row_blocks(model, n, min(PROPOSAL_ROWS, shape["vocab_size"]), context=context)
        h = torch.randn(n, hidden, dtype=model.dtype, device=model.device)  # (n, hidden)
        blocks["adapter"] = lambda h=h: adapter(h)
        seconds = decode_order_seconds(blocks, repeats, clock)
        for name in tables:
            tables[name][n] = seconds["layer 0" if name == "layer" else name]
    del model
    tables["tp"] = {}
    for T in tp:
        part = one_layer_model(shard(shape, T), device)
        seconds = decode_order_seconds(row_blocks(part, 1, 1, context=context), repeats, clock)
        tables["tp"][T] = {"layer": seconds["layer 0"], "head": seconds["head"]}
        del part
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()
    return tables


def rank_devices(device, ranks: int) -> list[str]:
    """Where ``ranks`` explorers (or tensor-parallel ranks) would run from ``device``: one GPU each when that many
    are visible, else CPU processes (gloo: the rows staged through the host, as explorers sharing a GPU do)."""
    if torch.device(device).type == "cuda" and torch.cuda.device_count() >= ranks:
        return [f"cuda:{r}" for r in range(ranks)]
    return ["cpu"] * ranks


def time_shapes(
    shapes: dict, device, context: int = 2048, repeats: int = 20, rows=ROWS, ranks=(2, 4, 8)
) -> dict:
    """Every shape timed (``time_shape``, with a tensor-parallel shard per rank count; the first one twice, the
    first pass a warm-up), and the links at each of ``ranks`` (``collectives.link_seconds``) per hidden size."""
    first = next(iter(shapes.values()))
    time_shape(first, device, context, repeats, rows, tp=ranks)  # unrecorded: the first shape a process times
    # ran 30-50x slow on the H200 (43-70 ms a layer against 1.4; docs/BENCHMARKS.md, "The GPU check")
    out = {
        name: time_shape(shape, device, context, repeats, rows, tp=ranks) for name, shape in shapes.items()
    }
    hiddens = sorted({s["hidden_size"] for s in shapes.values()})
    links = {W: link_seconds(hiddens, torch.bfloat16, repeats, rank_devices(device, W), rows) for W in ranks}
    for name, shape in shapes.items():
        out[name]["links"] = {W: links[W][shape["hidden_size"]] for W in ranks}
    return {"tables": out, "context": context, "rows": list(rows), "ranks": list(ranks)}


def measured(table: dict, rows: int) -> float:
    """Seconds at ``rows`` from a {rows: seconds} table, between measured points only (never extrapolated)."""
    if rows > max(table):
        raise ValueError(f"{rows} rows is past the {max(table)} measured; measure more rows")
    return interpolate(table, rows)


def project(tables: dict, layers: int, run: dict) -> dict:
    """Per-token seconds of DEX-1/K (``run``'s measured rounds replayed), pipeline AR and tensor parallelism on
    the same K devices, term by term (module docstring); None for DEX when a round ran more rows than measured."""
    rounds, K = run["batch_sizes"], len(run["batch_sizes"][0])
    links, tokens = tables["links"][K], max(1, run["tokens"])
    depths = resolve_depths(layers, explorers=K)  # the uniform split, as DEX's default
    counts = [d - p for d, p in zip(depths, (0, *depths[:-1]))]

    def stage(k: int, n: int) -> float:
        if n == 0:
            return 0.0
        final = k == K - 1
        extra = 0.0 if final else measured(tables["adapter"], n)
        return (
            counts[k] * measured(tables["layer"], n)
            + measured(tables["head" if final else "proposal"], n)
            + extra
        )

    widest = max(max(b) for b in rounds)
    ar = {"compute": layers * tables["layer"][1] + tables["head"][1], "link": (K - 1) * links["p2p"]}
    tp_shard = tables["tp"][K]
    tp = {
        "compute": layers * tp_shard["layer"] + tp_shard["head"],
        "link": (2 * layers + 1) * links["all_reduce"],
    }
    out = {"K": K, "widest_stage_rows": widest, "pipeline_ar": ar, "tensor_parallel": tp, "dex": None}
    if widest <= max(tables["layer"]):
        out["dex"] = {
            "compute": sum(max(stage(k, n) for k, n in enumerate(b)) for b in rounds) / tokens,
            "host": run["host_seconds_per_round"] * len(rounds) / tokens,
            "link": sum(measured(links["exchange"], max(1, max(b))) for b in rounds) / tokens,
        }
    for name in ("dex", "pipeline_ar", "tensor_parallel"):
        if out[name] is not None:
            out[name]["total"] = sum(out[name].values())
    if out["dex"] is not None:
        for name in ("pipeline_ar", "tensor_parallel"):
            out[f"speedup_over_{name}"] = out[name]["total"] / out["dex"]["total"]
            out[f"speedup_over_{name}_compute_only"] = out[name]["compute"] / out["dex"]["compute"]
    return out
