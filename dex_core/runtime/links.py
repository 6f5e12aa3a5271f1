"""Links between explorers: how hidden states and candidates travel; the round loop is the same for every link.

``Link`` is the contract the round loop relies on; two links meet it:

- ``LocalLink``: the sequential schedule. Every explorer lives in this process; a stage's output rows
  wait in a dict for the depth children that the next explorer computes in the next round.
- ``distributed.link.DistLink``: one explorer per process on torch.distributed.
"""

from __future__ import annotations

from typing import Protocol

import torch

from ..device import to_device
from .readback import Choice, StageOutput, read_round, top_of, unpack


class Link(Protocol):
    """What the round loop (``runtime.engine``, ``runtime.stage``) asks of the link between explorers.

    A round on one process: its explorers take their inputs (``inputs``), post their output rows as soon as their
    layers are done (``post``), and ``exchange`` then gives every stage's choices to every process, read to
    the host once (the round's one sync on a GPU); the lattice's
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

    def exchange(self, plan, choices: dict[int, Choice]) -> dict[int, StageOutput]:
        """This process's stages' ``choices`` (on their devices) in, every stage of ``plan`` with a batch out
        (stage index -> output, host values: read in one transfer a round); the rows the next stage needs are
        held for its ``inputs``."""

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

    def exchange(self, plan, choices: dict[int, Choice]) -> dict[int, StageOutput]:
        rows = dict(zip(choices, read_round([c.pack for c in choices.values()])))
        outputs = {}
        for k, c in choices.items():
            if c.hidden is not None:
                self.hidden.update(zip((n.id for n in plan.batches[k]), c.hidden))
            outputs[k] = unpack(rows[k], top_of(c.pack.shape[1]), c.hidden, c.seconds(True))
        return outputs

    def keep(self, node_ids) -> None:
        self.hidden = {i: h for i, h in self.hidden.items() if i in node_ids}
