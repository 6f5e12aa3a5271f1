"""Real-size layers on the device at hand: what DEX's rounds, pipeline AR's tokens and tensor parallelism's tokens
would take at 34B-70B.

A 135M model's layers say nothing about a 70B model's rounds, and a 70B model does not fit the machines this
project is checked on. So ``time_shapes`` builds, for each of ``SHAPES`` (the published shapes of
Llama-2-70B, CodeLlama-34B and Qwen3-32B), one decoder layer with the model's embedding, final norm and LM head
— random weights created on the device in bfloat16, nothing downloaded — and times with ``Clock`` (CUDA
events on a GPU), at 1..64 rows after a ``context``-token context, in a decode's order
(``decode_order_seconds``, under ``torch.inference_mode``):

- ``step``: the layer's **stage step alone** (``stage_step``: ``Explorer.step`` with its mask table already on the
  device), ``eager`` at every row count and, for the shapes a ``Plan`` names, ``compiled`` and ``captured`` (CUDA
  graphs) at ``Plan.step_rows``; ``host``: making and sending that table on the host, timed apart;
- ``layer``: the step the projection reads: ``captured`` where it ran, else ``eager`` (``layer_mode`` says which);
- ``head`` (final norm + the full LM head), ``proposal`` (a light head of ``PROPOSAL_ROWS`` rows) and ``adapter``
  (an inducing adapter, m = 2h);
- ``tp``: one row through a tensor-parallel rank's shard (``shard``: heads, MLP width and vocabulary / T) for each
  T: its stage step in the same mode as ``layer``, and its head;
- ``bytes``: the weights each part reads (bfloat16), and one hidden row's: what the bandwidth-bound and priced
  columns of the projection divide (``projection``).

The links are timed among the first W of fresh processes for each W, every W in one launch (``timed_links``,
``analysis.collectives.links_at``: NCCL when W GPUs are visible, else gloo through the host, the link of explorers
sharing a GPU): a round's exchange of n rows, one row's point-to-point send, one row's all-reduce.
``projection.columns`` then replays measured runs' rounds on these tables (the formulas are in ``projection``'s
docstring). ``scaled`` shrinks every shape for a CPU (the suite runs the section so that it cannot rot before a
GPU runs it).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...analysis.collectives import links_at
from ...model.adapters import InducingAdapter
from ...model.proposal import ProposalHead
from ...model.view import model_view
from ...runtime.clock import Clock, decode_order_seconds
from .stage_step import host_seconds, skips, stages, step_blocks, step_modes

ROWS = (1, 2, 4, 8, 16, 32, 64)
STEP_ROWS = (1, 8, 32, 64)  # the rows at which the compiled and captured stage steps are timed
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
    # the default config's head size is its own hidden / heads, not this shape's (a scaled shape's was 4x too wide)
    config.head_dim = shape.get("head_dim", shape["hidden_size"] // shape["num_attention_heads"])
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


@dataclass(frozen=True)
class Plan:
    """What ``time_shapes`` times: every part at ``rows`` after a ``context``-token context, the median of ``repeats``
    (the stage step eager); tensor-parallel shards and links at each of ``ranks``; for the shapes named in
    ``compiled``, the stage step compiled and captured (``stage_step.step_modes``) at ``step_rows`` too."""

    context: int = 2048
    repeats: int = 20
    rows: tuple[int, ...] = ROWS
    ranks: tuple[int, ...] = (2, 4, 8)
    compiled: tuple[str, ...] = ("Llama-2-70B",)
    step_rows: tuple[int, ...] = STEP_ROWS


def weight_bytes(*parts) -> int:
    """Bytes of ``parts`` (modules: their parameters; or tensors)."""
    tensors = [t for p in parts for t in (p.parameters() if isinstance(p, torch.nn.Module) else [p])]
    return sum(t.numel() * t.element_size() for t in tensors)


def projected_mode(explorers: dict) -> str:
    """The stage step the projection reads: ``captured`` where it ran (``compile=True`` on a GPU), else ``eager``."""
    return "captured" if "captured" in explorers else "eager"


def time_shape(shape: dict, device, plan: Plan, modes: dict) -> dict:
    """{table: {rows: seconds}} of ``shape`` on ``device`` in bfloat16 (module docstring): ``step`` {mode: table}
    (eager at ``plan.rows``, each of ``modes`` — {mode: compile options} — at ``plan.step_rows``), ``host``,
    ``layer`` (with ``layer_mode``), ``head``, ``proposal``, ``adapter``; ``tp`` {T: shard}; ``bytes``."""
    tables = time_parts(one_layer_model(shape, device), plan, modes)
    modes = {m: options for m, options in modes.items() if m == tables["layer_mode"]}
    shards = {T: time_shard(shard(shape, T), device, plan, modes) for T in plan.ranks}
    tables["tp"] = {T: s["seconds"] for T, s in shards.items()}
    tables["bytes"]["tp"] = {T: s["bytes"] for T, s in shards.items()}
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()
    return tables


def time_parts(model, plan: Plan, modes: dict) -> dict:
    """The parts of ``time_shape`` but the shards, timed on one-layer ``model``."""
    view, hidden = model_view(model), model.config.hidden_size
    light = ProposalHead(view, torch.arange(min(PROPOSAL_ROWS, view.vocab), device=view.device))
    adapter = InducingAdapter(hidden, 2 * hidden, device=model.device, dtype=model.dtype).eval()
    explorers, declined = stages(model, plan.context, max(plan.rows), modes), skips()
    tables = {"step": {mode: {} for mode in explorers}, "host": {}, "head": {}, "proposal": {}, "adapter": {}}
    for n in plan.rows:
        h = torch.randn(n, hidden, dtype=model.dtype, device=model.device)  # (n, hidden)
        steps = {m: e for m, e in explorers.items() if m == "eager" or n in plan.step_rows}
        blocks = step_blocks(steps, h, plan.context)
        blocks.update(
            head=lambda h=h: view.head(h), proposal=lambda h=h: light(h), adapter=lambda h=h: adapter(h)
        )
        for name, seconds in decode_order_seconds(blocks, plan.repeats, Clock(model.device)).items():
            (tables["step"][name] if name in explorers else tables[name])[n] = seconds
        tables["host"][n] = host_seconds(explorers["eager"], n, plan.context, plan.repeats)
    mode = projected_mode(explorers)
    tables.update(layer=tables["step"][mode], layer_mode=mode, cudagraph_skips=skips() - declined)
    tables["bytes"] = {
        "layer": weight_bytes(model.model.layers[0]),
        "head": weight_bytes(model.model.norm, model.lm_head),
        "proposal": weight_bytes(model.model.norm, light.weight),
        "adapter": weight_bytes(adapter),
        "row": hidden * model.dtype.itemsize,
    }
    return tables


def time_shard(part: dict, device, plan: Plan, modes: dict) -> dict:
    """One row through a tensor-parallel shard ``part``: {"seconds": {"layer": its stage step in the projected mode,
    "head": its head, "step": {mode: seconds}}, "bytes": {"layer", "head"}}."""
    model = one_layer_model(part, device)
    view, explorers = model_view(model), stages(model, plan.context, 1, modes)
    h = torch.randn(1, part["hidden_size"], dtype=model.dtype, device=model.device)  # (1, hidden)
    blocks = step_blocks(explorers, h, plan.context) | {"head": lambda: view.head(h)}
    seconds = decode_order_seconds(blocks, plan.repeats, Clock(model.device))
    step = {mode: seconds[mode] for mode in explorers}
    return {
        "seconds": {"layer": step[projected_mode(explorers)], "head": seconds["head"], "step": step},
        "bytes": {
            "layer": weight_bytes(model.model.layers[0]),
            "head": weight_bytes(model.model.norm, model.lm_head),
        },
    }


def rank_devices(device, ranks: int) -> list[str]:
    """Where ``ranks`` explorers (or tensor-parallel ranks) would run from ``device``: one GPU each when that many
    are visible, else CPU processes (gloo: the rows staged through the host, as explorers sharing a GPU do)."""
    if torch.device(device).type == "cuda" and torch.cuda.device_count() >= ranks:
        return [f"cuda:{r}" for r in range(ranks)]
    return ["cpu"] * ranks


def timed_links(hiddens: list[int], device, plan: Plan) -> dict:
    """{W: {hidden: links}} at each W of ``plan.ranks`` (``collectives.links_at``): one launch for the worlds on GPUs
    of their own, one for those on CPU processes (``rank_devices``)."""
    on_cpu = [W for W in plan.ranks if rank_devices(device, W)[0] == "cpu"]
    links = {}
    for worlds in (on_cpu, [W for W in plan.ranks if W not in on_cpu]):
        if worlds:
            devices = rank_devices(device, max(worlds))
            links.update(links_at(hiddens, torch.bfloat16, plan.repeats, devices, plan.rows, worlds))
    return links


def time_shapes(shapes: dict, device, plan: Plan = Plan()) -> dict:
    """Every shape timed (``time_shape``, with a tensor-parallel shard per rank count, its stage step compiled and
    captured where ``plan.compiled`` names it; the first shape twice, the first pass eager and unrecorded), and the
    links at each of ``plan.ranks`` (``timed_links``) per hidden size."""
    first = next(iter(shapes.values()))
    time_shape(first, device, plan, {})  # unrecorded: the first shape a process times
    # ran 30-50x slow on the H200 (43-70 ms a layer against 1.4; docs/BENCHMARKS.md, "The GPU check")
    options = step_modes(device)
    out = {
        name: time_shape(shape, device, plan, options if name in plan.compiled else {})
        for name, shape in shapes.items()
    }
    links = timed_links(sorted({s["hidden_size"] for s in shapes.values()}), device, plan)
    for name, shape in shapes.items():
        out[name]["links"] = {W: links[W][shape["hidden_size"]] for W in plan.ranks}
    return {
        "tables": out,
        "context": plan.context,
        "rows": list(plan.rows),
        "ranks": list(plan.ranks),
        "step_rows": [n for n in plan.step_rows if n in plan.rows],
        "compiled_modes": list(options),
    }
