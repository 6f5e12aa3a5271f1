"""The cost model's seconds view: a profile of this machine, timed on the loaded model.

``measure_profile`` times, at n = 1, 2, 4, 8, 16 rows (median of ``repeats``):

- ``layer[n]``: one decoder layer over n new rows after a 64-token context (the mean of layers 0 and
  L/2);
- ``head[n]``: final norm + the full LM head; ``proposal[n]``: a light head of ``proposal_rows`` rows;
- ``exchange[n]``: one round of the distributed link between two explorer processes over the link
  the explorers use: n hidden rows point-to-point (NCCL between two GPUs when the model is on a GPU and
  two are visible, else gloo on CPU tensors), then the all-gather of a small int64 candidates tensor on
  gloo — what ``DistLink`` does each round, spawned once, as fresh interpreters.

Every block is timed by ``device.Clock`` (CUDA events read after the device passed them; ``perf_counter``
on CPU), and the blocks run one after another in a decode's order (each repeat runs every block once), so
that no block is timed from the caches its own previous call warmed. Profiles are cached as JSON in
``~/.cache/dex/profiles`` per model (embedding fingerprint), dtype, device (the GPU's name on CUDA),
exchange backend, torch threads and torch version. ``exchange_seconds`` interpolates the table; a projected
K-device round then lasts its slowest explorer's measured expansion + bookkeeping + decode (the round
event's ``projected``) + exchange(largest batch), as ``dex bench`` (``bench_report``), the app's Race
(``projected_round_seconds``) and ``benchmarks/distributed_vs_ar.py`` count it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from ..config import DEFAULT_PROPOSAL_VOCAB
from ..device import dtype_name
from ..log import stderr
from ..model.adapters import model_identity
from ..model.explorer import Explorer
from ..model.proposal import ProposalHead
from ..model.view import model_view
from ..runtime.clock import Clock, decode_order_seconds
from ..trace.events import RoundEvent
from .collectives import link_seconds

ROWS = (1, 2, 4, 8, 16)
TABLES = ("layer", "head", "proposal", "exchange")  # {rows: seconds} each
CACHE = Path(os.environ.get("DEX_CACHE", Path.home() / ".cache" / "dex")) / "profiles"


@torch.inference_mode()
def row_blocks(model, n: int, proposal_rows: int, context: int = 64) -> dict:
    """What a decode runs at n rows, as callables (time them with ``decode_order_seconds``, which runs them
    under ``torch.inference_mode``): one decoder layer over n new rows after a ``context``-token context
    (``layer 0`` and ``layer L/2``), the final norm + full LM head (``head``) and a light head of
    ``proposal_rows`` rows (``proposal``)."""
    view = model_view(model)
    light = ProposalHead(view, torch.arange(min(proposal_rows, view.vocab), device=view.device))
    hidden_size, blocks = model.config.hidden_size, {}
    for index in sorted({0, view.num_layers // 2}):
        e = Explorer(view, 0, 2, index, index + 1)
        e.prefill(torch.randn(context, hidden_size, dtype=view.dtype, device=view.device))
        h = torch.randn(n, hidden_size, dtype=view.dtype, device=view.device)  # (n, hidden)
        # each call adds n rows to the cache: a context of `context` to `context` + (repeats + 1) n
        blocks[f"layer {index}"] = lambda e=e, h=h: e.expand(
            h, list(range(n)), [context] * n, [(i,) for i in range(n)]
        )
    h = torch.randn(n, hidden_size, dtype=view.dtype, device=view.device)  # (n, hidden)
    blocks.update(head=lambda: view.head(h), proposal=lambda: light(h))
    return blocks


@torch.inference_mode()
def stage_curve(model, explorers: int, rows=range(1, 17), repeats: int = 15, context: int = 256) -> tuple:
    """{rows: seconds} of a non-final stage step at every count in ``rows``, in a decode's order: the model split into
    ``explorers`` uniform stages, each with its light head (the last with the full head), each repeat running every
    stage once at n new rows after a ``context``-token prefix, so every stage streams its weights as it does in a
    round. ``{rows: seconds}`` of a stage (the mean of the non-final stages' medians, ``decode_order_seconds``) and of
    the round (every stage's, the final one's full head too), as ``(stage, round)``."""
    view = model_view(model)
    bounds = [round(view.num_layers * k / explorers) for k in range(explorers + 1)]
    light = ProposalHead(view, torch.arange(min(DEFAULT_PROPOSAL_VOCAB, view.vocab), device=view.device))
    stages, width = [], model.config.hidden_size
    for k in range(explorers):
        e = Explorer(view, k, explorers, bounds[k], bounds[k + 1])
        e.prefill(torch.randn(context, width, dtype=view.dtype, device=view.device))
        stages.append(e)
    stage, whole = {}, {}
    for n in rows:
        hidden = torch.randn(n, width, dtype=view.dtype, device=view.device)  # (n, hidden)
        blocks = {
            k: lambda e=e: (view.head if e.final else light)(
                e.expand(hidden, list(range(n)), [context] * n, [(i,) for i in range(n)])
            )
            for k, e in enumerate(stages)
        }
        seconds = decode_order_seconds(blocks, repeats, Clock(view.device))
        for e in stages:  # each call added n lattice entries: back to the prefix alone
            e.cache.retain([])
        stage[n] = sum(seconds[k] for k in range(explorers - 1)) / max(1, explorers - 1)
        whole[n] = sum(seconds.values())
    return stage, whole


def _compute_profile(model, proposal_rows: int, repeats: int) -> dict:
    out: dict = {"layer": {}, "head": {}, "proposal": {}}
    for n in ROWS:
        seconds = decode_order_seconds(row_blocks(model, n, proposal_rows), repeats, Clock(model.device))
        layers = [v for k, v in seconds.items() if k.startswith("layer")]
        out["layer"][n] = sum(layers) / len(layers)
        out["head"][n], out["proposal"][n] = seconds["head"], seconds["proposal"]
    return out


def one_row_seconds(model, proposal_rows: int, repeats: int = 5) -> dict:
    """Seconds of a decoder layer, the full head and a light head at one row: a fraction of a second, what the
    app's first estimate of a run reads (the full profile takes half a minute)."""
    seconds = decode_order_seconds(row_blocks(model, 1, proposal_rows), repeats, Clock(model.device))
    layers = [v for k, v in seconds.items() if k.startswith("layer")]
    return {"layer": sum(layers) / len(layers), "head": seconds["head"], "proposal": seconds["proposal"]}


def one_row(profile: dict) -> dict:
    """The one-row column of a measured profile (``measure_profile``): what ``one_row_seconds`` times alone."""
    return {part: profile[part][1] for part in ("layer", "head", "proposal")}


def link_devices(device) -> tuple[str, str]:
    """The two explorer devices whose link the exchange profile times: ``cuda:0`` and ``cuda:1`` (NCCL) when
    the model is on a GPU and two are visible, else two CPU processes (gloo). Explorers sharing one GPU
    stage their rows through the host over gloo: the CPU pair times that link without the two copies
    between the GPU and the host."""
    if torch.device(device).type == "cuda" and torch.cuda.device_count() >= 2:
        return "cuda:0", "cuda:1"
    return "cpu", "cpu"


def exchange_profile(
    hidden: int, dtype: torch.dtype, repeats: int, devices: tuple[str, str], rows=ROWS
) -> dict:
    """{rows: seconds} of one round's exchange between two fresh processes on ``devices``
    (``collectives.link_seconds``)."""
    return link_seconds([hidden], dtype, repeats, devices, rows)[hidden]["exchange"]


def _device_name(device: torch.device) -> str:
    """``cpu``, or ``cuda-`` and the GPU's name (profiles of different GPUs must not share a cache entry)."""
    if device.type != "cuda":
        return device.type
    return "cuda-" + "".join(c if c.isalnum() else "_" for c in torch.cuda.get_device_name(device))


def measure_profile(
    model,
    proposal_rows: int = 8192,
    repeats: int = 20,
    cache: bool = True,
    log=stderr,
    link: tuple[str, str] | None = None,
) -> dict:
    """The seconds profile of ``model`` on its device with this process's torch threads (cached);
    ``link``: the two explorer devices whose exchange to time (default ``link_devices`` of the model's)."""

    ident = model_identity(model)
    dtype, device = model.model.norm.weight.dtype, model.model.norm.weight.device
    link = tuple(link or link_devices(device))
    backend = "nccl" if torch.device(link[0]).type == "cuda" else "gloo"
    key = (
        f"{ident['model_type']}-{ident['num_layers']}x{ident['hidden_size']}-{ident['fingerprint']:.4f}-"
        f"{dtype_name(dtype)}-{_device_name(device)}-x{backend}-t{torch.get_num_threads()}-"
        f"n{proposal_rows}-{torch.__version__}"
    )
    path = CACHE / f"{key}.json"
    if cache and path.is_file():
        profile = json.loads(path.read_text())
        return {k: ({int(n): s for n, s in v.items()} if k in TABLES else v) for k, v in profile.items()}
    log(
        f"profiling layers and heads on {device} and the exchange over {backend} ({link[0]} to {link[1]}) at "
        f"{list(ROWS)} rows (cached in {path.parent})"
    )
    profile = _compute_profile(model, proposal_rows, repeats)
    profile["exchange"] = exchange_profile(model.config.hidden_size, dtype, repeats, link)
    profile.update(
        key=key,
        threads=torch.get_num_threads(),
        proposal_rows=proposal_rows,
        exchange_link={"backend": backend, "devices": list(link)},
    )
    if cache:
        CACHE.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(profile, indent=1))
    return profile


def interpolate(table: dict, rows: int) -> float:
    """Seconds at ``rows`` from a {rows: seconds} table: linear between points, extrapolated past the last."""
    if rows <= 0:
        return 0.0
    points = sorted(table.items())
    for (a, sa), (b, sb) in zip(points, points[1:]):
        if rows <= b:
            return sa + (sb - sa) * (max(rows, a) - a) / (b - a)
    (a, sa), (b, sb) = points[-2], points[-1]
    return sb + (sb - sa) * (rows - b) / (b - a)


def stage_seconds(profile: dict, layers: float) -> dict:
    """{rows: seconds} of a non-final stage of ``layers`` layers on ``profile``'s tables: layers x layer(n) + the
    light head(n)."""
    return {n: layers * profile["layer"][n] + profile["proposal"][n] for n in sorted(profile["layer"])}


def row_budget(curve: dict, rounds: dict | None = None, slack: float = 0.10) -> int:
    """``prune="auto"``'s rule on a stage's or a round's row curve ({rows: seconds}: ``stage_curve``,
    ``stage_seconds``).

    With ``rounds`` ({budget: rounds per token}, measured on prompts of the tune split): rows priced by what they
    buy, the budget whose predicted speed 1 / (rounds[B] x curve(B)) is highest (a tie: the fewer rows). Without it
    (a device whose rounds were not measured), the most rows B such that the step at every measured count from 2 to
    B costs at most ``slack`` over the 2-row step, the fewest that explore: on a flat curve rows cost nothing."""
    if rounds:
        return min(rounds, key=lambda b: (rounds[b] * interpolate(curve, b), b))
    base, budget = interpolate(curve, 2), 2
    for n, seconds in sorted(curve.items()):
        if n <= 2:
            continue
        if seconds > (1 + slack) * base:
            break
        budget = n
    return budget


def exchange_seconds(profile: dict, batch_sizes) -> float:
    """A round's communication on K devices: the largest batch's rows sent, and the candidates gathered."""
    return interpolate(profile["exchange"], max(1, max(batch_sizes)))


def projected_round_seconds(profile: dict, event: RoundEvent) -> float:
    """Round ``event`` on K devices: its slowest explorer's measured share (its ``projected`` timing) and the
    exchange of its largest batch (``exchange_seconds``)."""
    return event.timings["projected"] + exchange_seconds(profile, [len(b) for b in event.batches])
