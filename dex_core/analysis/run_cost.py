"""A DEX run's cost per token, read from its trace (``run_cost``, ``trace_cost``): the weights of the model's parts
its start event records (``cost``, ``ModelCost.weights``), its depths and adapted depths, and each round's batch
sizes, counted by the cost model (``dex_core.model.cost``) in layer-equivalents two ways — on K devices
(memory-bound: a batched forward costs one row's) and with every row counted — beside AR's. A trace that records
no weights (older traces) counts decoder layers only, and says so (``RunCost.whole``)."""

from __future__ import annotations

from dataclasses import dataclass

from ..model.cost import ModelCost
from ..trace.events import RoundEvent, StartEvent


@dataclass(frozen=True)
class RunCost:
    memory: float  # layer-equivalents per token on K devices, memory-bound (the paper's view)
    rows: float  # layer-equivalents per token with every row counted (a compute-bound CPU)
    ar: float  # one AR token: every layer and the head
    whole: bool  # heads and adapters counted (False: a trace without weights, decoder layers only)


def run_cost(start: StartEvent, batch_sizes, tokens: int) -> RunCost:
    """The cost per token of a run of start event ``start`` whose rounds had ``batch_sizes`` (per round, per
    explorer: ``GenerationStats.batch_sizes``) and committed ``tokens``."""
    model = ModelCost.from_weights(start.num_layers, start.cost)
    adapted = start.adapter_depths
    return RunCost(
        memory=model.dex(start.depths, batch_sizes, tokens, "memory", adapted),
        rows=model.dex(start.depths, batch_sizes, tokens, "rows", adapted),
        ar=model.ar(),
        whole=bool(start.cost),
    )


def trace_cost(events) -> RunCost:
    """The cost per token of a DEX trace's rounds (its typed events; a run stopped before its end included)."""
    rounds = [e for e in events if isinstance(e, RoundEvent)]
    return run_cost(
        events[0], [[len(batch) for batch in e.batches] for e in rounds], sum(len(e.commits) for e in rounds)
    )
