"""Links between explorers: how hidden states and candidates travel; the round loop is the same for every link.

``Link`` is the contract the round loop relies on; two links meet it:

- ``LocalLink``: the sequential schedule. Every explorer lives in this process; a stage's output rows
  wait in a dict for the depth children that the next explorer computes in the next round.
- ``distributed.link.DistLink``: one explorer per process on torch.distributed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from ..device import to_device


@dataclass
class StageOutput:
    """What one explorer produced in one round, for a batch of n nodes (host values: read from the
    device in one transfer)."""

    tokens: list[int]  # chosen candidate per node
    top: list[list[tuple[int, float]]]  # per node, the best candidates at this depth: (token, probability)
    hidden: torch.Tensor | None  # (n, hidden) stage output, for the depth children (None at the last stage)
    seconds: float  # expansion time (layers + LM head), masks excluded
    probs: list[float] | None = None  # each chosen candidate's probability (for lattice pruning)
    margins: list[float] | None = None  # final stage: each node's top-1 minus top-2 score
    tie_gaps: list[float] | None = None  # final stage: the dtype's tie gap at each node's top logit


class Link(Protocol):
    """What the round loop (``runtime.engine``, ``runtime.stage``) asks of the link between explorers.

    A round on one process: its explorers take their inputs (``inputs``), post their output rows as soon as their
    layers are done (``post``), and ``exchange`` then gives every stage's choices to every process; the lattice's
    cuts and collapses tell the link which rows to ``keep``.
    """

    comm_seconds: float  # seconds spent waiting on other explorers since ``reset`` (0 in one process)
    cancelled: bool  # a participant asked to stop early; read after each ``exchange``

    def reset(self) -> None:
        """A fresh run: no rows held, no waiting counted, not cancelled."""

    def prefill(self, explorers, view, tokens: list[int]) -> None:
        """The prompt's ``tokens`` (all but its last) through every stage this process runs, in order."""

    def inputs(self, parents: list[int]) -> torch.Tensor:
        """(n, hidden): the rows the previous stage produced for depth parents ``parents`` (node ids)."""

    def post(self, plan, rank: int, hidden: torch.Tensor) -> None:
        """Explorer ``rank``'s output rows ``hidden`` (n, hidden) of ``plan`` are ready, before its head runs."""

    def exchange(self, plan, outputs: dict[int, StageOutput]) -> dict[int, StageOutput]:
        """This process's stages' ``outputs`` in, every stage of ``plan`` with a batch out (stage index -> output);
        the rows the next stage needs are held for its ``inputs``."""

    def keep(self, node_ids) -> None:
        """Drop every held row whose node is not in ``node_ids`` (after a cut or a collapse)."""


class LocalLink:
    """All explorers in one process (deterministic; tests, debugger, CPU demos)."""

    def __init__(self):
        self.hidden: dict[int, torch.Tensor] = {}  # node id -> stage output awaiting its depth child
        self.comm_seconds = 0.0
        self.cancelled = False  # set when a participant asked to stop early

    def reset(self) -> None:
        self.hidden = {}
        self.comm_seconds = 0.0
        self.cancelled = False

    def prefill(self, explorers, view, tokens: list[int]) -> None:
        h = view.embed(to_device(tokens, view.device))
        for e in explorers:
            h = e.prefill(h)

    def inputs(self, parents: list[int]) -> torch.Tensor:
        return torch.stack([self.hidden.pop(p) for p in parents])

    def post(self, plan, rank: int, hidden: torch.Tensor) -> None:
        """Explorer ``rank``'s output rows are ready (before its head); the local link keeps them in
        ``exchange``."""

    def exchange(self, plan, outputs: dict[int, StageOutput]) -> dict[int, StageOutput]:
        for k, out in outputs.items():
            if out.hidden is not None:
                self.hidden.update(zip((n.id for n in plan.batches[k]), out.hidden))
        return outputs

    def keep(self, node_ids) -> None:
        self.hidden = {i: h for i, h in self.hidden.items() if i in node_ids}
