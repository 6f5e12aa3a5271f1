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
from ..shapes import padded
from .readback import Choice, StageOutput, read_logprobs, read_round, top_of, unpack


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

    def inputs(self, parents: list[int], rows: int) -> torch.Tensor:
        """(rows, hidden): the rows the previous stage produced for depth parents ``parents`` (node ids), padded to
        ``rows`` (the batch's bucket)."""

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
        self.held: dict[int, tuple[torch.Tensor, int]] = {}  # node id -> (its stage's output rows, its row)
        self.comm_seconds = 0.0
        self.cancelled = False  # set when a participant asked to stop early

    def reset(self) -> None:
        self.held = {}
        self.comm_seconds = 0.0
        self.cancelled = False

    def prefill(self, explorers, view, tokens: list[int]) -> None:
        h = view.embed(to_device(tokens, view.device))
        for e in explorers:
            h = e.prefill(h)

    def hold(self, node_ids, hidden: torch.Tensor) -> None:
        """A stage's output rows ``hidden`` (rows, hidden), the first ``len(node_ids)`` of them those nodes'."""
        self.held.update((i, (hidden, row)) for row, i in enumerate(node_ids))

    def inputs(self, parents: list[int], rows: int) -> torch.Tensor:
        """(rows, hidden): the parents' rows, then copies of the first up to ``rows`` (a bucket). The parents of a
        stage's batch are the previous stage's nodes of the round before: one gather from its rows."""
        held = [self.held.pop(p) for p in parents]
        (source, first), picked = held[0], [r for _, r in held]
        if any(h is not source for h, _ in held):  # not one stage's rows: row by row (no fixed shapes)
            return torch.stack(padded([h[r] for h, r in held], rows, source[first]))
        return source.index_select(0, to_device(padded(picked, rows, first), source.device))

    def post(self, plan, rank: int, hidden: torch.Tensor) -> None:
        """Explorer ``rank``'s output rows are ready (before its head); the local link keeps them in
        ``exchange``."""

    def exchange(self, plan, choices: dict[int, Choice]) -> dict[int, StageOutput]:
        rows = dict(zip(choices, read_round(list(choices.values()))))
        outputs = {}
        for k, c in choices.items():
            batch = plan.batches[k]
            if c.hidden is not None:
                self.hold([n.id for n in batch], c.hidden)
            outputs[k] = unpack(rows[k][: len(batch)], top_of(c.block.shape[1]), c.hidden, c.seconds(True))
            outputs[k].logprobs = read_logprobs(c, len(batch))
        return outputs

    def keep(self, node_ids) -> None:
        self.held = {i: h for i, h in self.held.items() if i in node_ids}
