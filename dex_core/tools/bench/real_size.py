"""Real-size layers on the device at hand: what DEX's rounds and pipeline AR's tokens would take at 34B-70B.

A 135M model's layers say nothing about a 70B model's rounds, and a 70B model does not fit the machines this
project is checked on. So ``time_shapes`` builds, for each of ``SHAPES`` (the published shapes of
Llama-2-70B, CodeLlama-34B and Qwen3-32B), one decoder layer with the model's embedding, final norm and LM head
— random weights created on the device in bfloat16, nothing downloaded — and times with ``Clock`` (CUDA
events on a GPU), at 1..64 rows after a ``context``-token context, in a decode's order
(``profile.decode_order_seconds``, under ``torch.inference_mode``): the layer, the full head, a light
proposal head of ``PROPOSAL_ROWS`` rows and an inducing adapter (m = 2h). ``profile`` times the exchange of
one round's hidden rows between two ranks on the link the device has.

``project`` then replays a measured run's rounds (``GenerationStats.batch_sizes``: rows per explorer per
round, of the default model on this machine) on those timings, explorer k holding L/K of the real model's
L layers — a **projection**, labelled as one:

    DEX-1/K per token = sum over rounds of [max_k (L_k layer(n_k) + head_k(n_k) + adapter(n_k)) + exchange(max_k n_k)]
                        / tokens          (head_k: the full head at the final stage, else the light head)
    pipeline AR per token = L layer(1) + head(1) + (K - 1) exchange(1)
                        (one token walks the K stages on the same K devices; the token's way back is left out)

Bookkeeping (host work per round) is left out of both and said so. ``scaled`` shrinks every shape for a CPU
(the suite runs the section so that it cannot rot before a GPU runs it).
"""

from __future__ import annotations

import torch

from ...analysis.profile import decode_order_seconds, exchange_profile, interpolate, link_devices, row_blocks
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

    fields = {k: v for k, v in shape.items() if k not in ("model_type", "layers")}
    config = AutoConfig.for_model(
        shape["model_type"],
        num_hidden_layers=1,
        max_position_embeddings=8192,
        tie_word_embeddings=False,
        **fields,
    )
    torch.manual_seed(0)
    with torch.device(device):
        return AutoModelForCausalLM.from_config(config, dtype=dtype).eval()


def time_shape(shape: dict, device, context: int, repeats: int, rows=ROWS) -> dict:
    """{table: {rows: seconds}} of one layer (``layer``), the full head (``head``), a light head (``proposal``)
    and an adapter (``adapter``) of ``shape`` on ``device`` in bfloat16."""
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
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()
    return tables


def time_shapes(shapes: dict, device, context: int = 2048, repeats: int = 20, rows=ROWS) -> dict:
    """Every shape timed (``time_shape``), and the exchange of one round's rows per hidden size."""
    out = {name: time_shape(shape, device, context, repeats, rows) for name, shape in shapes.items()}
    link = link_devices(device)
    exchanges = {
        h: exchange_profile(h, torch.bfloat16, repeats, link, rows)
        for h in {s["hidden_size"] for s in shapes.values()}
    }
    for name, shape in shapes.items():
        out[name]["exchange"] = exchanges[shape["hidden_size"]]
    return {"tables": out, "link": list(link), "context": context, "rows": list(rows)}


def project(tables: dict, layers: int, rounds_batch_sizes: list[list[int]], tokens: int) -> dict:
    """Per-token seconds of DEX-1/K (the measured rounds replayed) and pipeline AR on K devices (module docstring)."""
    K = len(rounds_batch_sizes[0])
    depths = resolve_depths(layers, explorers=K)  # the uniform split, as DEX's default
    counts = [d - p for d, p in zip(depths, (0, *depths[:-1]))]

    def stage(k: int, n: int) -> float:
        if n == 0:
            return 0.0
        final = k == K - 1
        head = interpolate(tables["head" if final else "proposal"], n)
        return (
            counts[k] * interpolate(tables["layer"], n)
            + head
            + (0.0 if final else interpolate(tables["adapter"], n))
        )

    dex = sum(
        max(stage(k, n) for k, n in enumerate(b)) + interpolate(tables["exchange"], max(1, max(b)))
        for b in rounds_batch_sizes
    ) / max(1, tokens)
    ar = layers * tables["layer"][1] + tables["head"][1] + (K - 1) * tables["exchange"][1]
    return {"K": K, "dex_seconds_per_token": dex, "pipeline_ar_seconds_per_token": ar, "speedup": ar / dex}
