"""DEX-1/K against pipeline AR and tensor parallelism per token, projected from a run's rounds onto a real-size
layer's parts (``real_size``): the formulas, a bandwidth-bound compute, and the links priced by class.

``project(tables, layers, run)`` replays a measured run's rounds (``batch_sizes``: rows per explorer per round, and
its measured host work per round) on per-part seconds, explorer k holding L_k = L/K of the real model's L layers — a
**projection**, labelled as one, term by term:

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
pipeline AR.

``columns`` projects each run once per (link, compute) pair:

- compute ``measured``: the parts as timed; ``bandwidth_bound``: each part's weight bytes / (fraction x the device's
  peak memory bandwidth), the same at every row count (``bandwidth_tables``; the KV cache read is left out: at 2,048
  tokens 8 MB against a 70B layer's 1.7 GB);
- link ``measured``: the links as timed among W processes (``analysis.collectives``); ``nvlink``, ``pcie``,
  ``network``: priced from a ``Link`` (``priced_links``), latency a a message step and bandwidth b one way:

      send(bytes)             = a + bytes / b
      all_reduce_T(bytes)     = 2 (T - 1) a + 2 (T - 1) / T x bytes / b       (a ring: reduce-scatter, all-gather)
      all_gather_T(bytes)     = (T - 1) a + (T - 1) x bytes / b                (bytes: each rank's share)
      p2p = send(row); all_reduce = all_reduce_T(row)                          (row: one hidden row, bfloat16)
      exchange_K(n) = send(n rows) + all_gather_K((n + 1) x CONTROL_COLUMNS x 8)
                      (DistLink's round: every stage's rows to the next at once, then the choices gathered)

Every default here is a *stated assumption* (``LINKS``, ``FRACTION``, ``CPU_BANDWIDTH``) or a published figure
(``PEAK_BANDWIDTH``), overridable from ``benchmarks/gpu_check.py``'s command line and listed in docs/GPU.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ...analysis.collectives import CONTROL_COLUMNS
from ...analysis.profile import interpolate
from ...config import resolve_depths

PARTS = ("layer", "head", "proposal", "adapter")  # a shape's timed parts, {rows: seconds} each


@dataclass(frozen=True)
class Link:
    """A link class: ``latency`` seconds a message step, ``bandwidth`` bytes a second one way (module docstring)."""

    latency: float
    bandwidth: float

    def send(self, nbytes: float) -> float:
        return self.latency + nbytes / self.bandwidth

    def all_reduce(self, nbytes: float, ranks: int) -> float:
        steps = 2 * (ranks - 1)
        return steps * self.latency + steps / ranks * nbytes / self.bandwidth

    def all_gather(self, nbytes: float, ranks: int) -> float:
        return (ranks - 1) * (self.latency + nbytes / self.bandwidth)


# assumed (docs/GPU.md, "The projection's parameters"): a ring step's latency from nccl-tests on a DGX-A100 (one-row
# all-reduce 10 us at 2 GPUs, 33.7 us at 8 = 14 steps: 2.4 us a step; NVIDIA/nccl-tests#123), NVLink 4's 450 GB/s a
# direction; PCIe 4.0 x16 (an L4's bus) at 25 of its 32 GB/s, a step twice NVLink's (NCCL's tuning table has 1.7x:
# src/graph/tuning.cc, 1.0 against 0.6 us); a 100 Gb/s network, 10 us a step
LINKS = {
    "nvlink": Link(latency=2.5e-6, bandwidth=450e9),
    "pcie": Link(latency=5e-6, bandwidth=25e9),
    "network": Link(latency=10e-6, bandwidth=12.5e9),
}
# assumed: the fraction of the peak memory bandwidth a decode's weight reads reach (issue 59: 3.8 of 4.8 TB/s)
FRACTION = 0.8
# published peak memory bandwidth (bytes/s) by a part of torch.cuda.get_device_name, the first that matches
PEAK_BANDWIDTH = (
    ("H200", 4.8e12),
    ("H100 NVL", 3.9e12),
    ("H100 PCIe", 2.0e12),
    ("H100", 3.35e12),  # SXM: "NVIDIA H100 80GB HBM3"
    ("A100 80GB PCIe", 1.935e12),
    ("A100-SXM4-80GB", 2.039e12),
    ("A100", 1.555e12),  # the 40 GB cards
    ("L40S", 864e9),
    ("A10G", 600e9),
    ("L4", 300e9),
)
CPU_BANDWIDTH = 20e9  # assumed: a CPU's memory (the suite's --quick run only)


@dataclass(frozen=True)
class Pricing:
    """What the priced columns assume: the device's ``peak`` memory bandwidth (bytes/s) and its ``source``, the
    ``fraction`` of it a weight read reaches, the link classes, and which of them the command line gave (``given``:
    "peak", "fraction", link class names; the rest are this module's defaults)."""

    peak: float
    source: str
    fraction: float = FRACTION
    links: dict[str, Link] = field(default_factory=lambda: dict(LINKS))
    given: frozenset[str] = frozenset()

    @property
    def bandwidth(self) -> float:
        return self.fraction * self.peak

    def describe(self) -> dict:
        """The assumptions as the report states them, each labelled with where it came from."""

        def source(name: str) -> str:
            return "given" if name in self.given else "assumed"

        return {
            "peak_bytes_per_second": self.peak,
            "peak_source": self.source,
            "fraction": self.fraction,
            "fraction_source": source("fraction"),
            "bandwidth_bytes_per_second": self.bandwidth,
            "links": {
                name: {
                    "latency_seconds": link.latency,
                    "bytes_per_second": link.bandwidth,
                    "source": source(name),
                }
                for name, link in self.links.items()
            },
        }


def peak_bandwidth(device_name: str) -> tuple[float, str] | None:
    """(bytes/s, source) of a device's memory: ``PEAK_BANDWIDTH`` by its name, ``CPU_BANDWIDTH`` on a CPU; None for a
    GPU the table does not know (give it on the command line)."""
    if device_name.startswith("cpu"):
        return CPU_BANDWIDTH, "assumed (a CPU)"
    for part, peak in PEAK_BANDWIDTH:
        if part in device_name:
            return peak, f"published ({part})"
    return None


def parse_link(text: str) -> tuple[str, Link]:
    """``CLASS=LATENCY,BANDWIDTH`` (seconds, bytes/s) -> (class, Link), e.g. ``nvlink=2.5e-6,450e9``."""
    name, _, values = text.partition("=")
    try:
        latency, bandwidth = (float(v) for v in values.split(","))
    except ValueError:
        raise ValueError(
            f"a link is CLASS=LATENCY,BANDWIDTH (seconds, bytes/s), e.g. nvlink=2.5e-6,450e9; got {text!r}"
        ) from None
    if name not in LINKS or latency < 0 or bandwidth <= 0:
        raise ValueError(
            f"a link class is one of {', '.join(LINKS)} with latency >= 0 and bandwidth > 0; got {text!r}"
        )
    return name, Link(latency=latency, bandwidth=bandwidth)


def measured(table: dict, rows: int) -> float:
    """Seconds at ``rows`` from a {rows: seconds} table, between measured points only (never extrapolated)."""
    if rows > max(table):
        raise ValueError(f"{rows} rows is past the {max(table)} measured; measure more rows")
    return interpolate(table, rows)


def bandwidth_tables(tables: dict, bandwidth: float) -> dict:
    """``tables`` with every part's seconds its weight bytes (``tables["bytes"]``) / ``bandwidth``, at every row count
    the measured tables have (the links left as they are)."""
    size, rows = tables["bytes"], sorted(tables["layer"])
    out = {part: {n: size[part] / bandwidth for n in rows} for part in PARTS}
    out["tp"] = {T: {part: s / bandwidth for part, s in shard.items()} for T, shard in size["tp"].items()}
    return out | {"links": tables["links"]}


def priced_links(link: Link, row_bytes: int, ranks: int, rows) -> dict:
    """The links at ``ranks`` as ``link`` prices them, in the measured links' layout: {"exchange": {n: s}, "p2p": s,
    "all_reduce": s} for hidden rows of ``row_bytes`` (module docstring)."""
    control = CONTROL_COLUMNS * 8  # a row of the round's choices, float64
    return {
        "exchange": {n: link.send(n * row_bytes) + link.all_gather((n + 1) * control, ranks) for n in rows},
        "p2p": link.send(row_bytes),
        "all_reduce": link.all_reduce(row_bytes, ranks),
    }


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


def columns(tables: dict, layers: int, run: dict, pricing: Pricing | None) -> dict:
    """{link: {compute: ``project(...)``}}: link ``measured`` and each of ``pricing.links``, compute ``measured`` and
    ``bandwidth_bound`` (module docstring); with no ``pricing`` (a device of unknown peak) the measured pair only."""
    K = len(run["batch_sizes"][0])
    computes = {"measured": tables}
    links = {"measured": tables["links"][K]}
    if pricing is not None:
        computes["bandwidth_bound"] = bandwidth_tables(tables, pricing.bandwidth)
        rows = sorted(tables["layer"])
        for name, link in pricing.links.items():
            links[name] = priced_links(link, tables["bytes"]["row"], K, rows)
    return {
        link: {name: project(dict(t, links={K: at}), layers, run) for name, t in computes.items()}
        for link, at in links.items()
    }
