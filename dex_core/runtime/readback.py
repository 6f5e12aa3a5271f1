"""A round's read-back: what each explorer chose, packed on its device, and read to the host once a round.

A stage's choices (``Choice.pack``) are rows of float64 on its device, one per lattice node, in one fixed layout:
token, probability, margin, tie gap, then ``top`` candidate ids and their probabilities (``PackLayout``); NaN
where a value is not made (no pruning: no probability; non-final stages: no margin), -1 for an absent candidate.
Every stage's rows of a round are read to the host in one transfer (``read_round``: one sync on a GPU, not one
per explorer) and become ``StageOutput``s, the host values the lattice and the trace take in. The distributed
link all-gathers the same layout across ranks (``distributed.link``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..shapes import bucket

PACK_FIXED = 4  # token, probability, margin, tie gap; then ``top`` candidate ids and their probabilities
TOKEN, PROB, MARGIN, GAP = range(PACK_FIXED)  # a row's fixed columns, in ``pack``'s order


@dataclass(frozen=True)
class PackLayout:
    """The columns of a packed row (``pack``) with ``top`` trace candidates: the fixed ones (``TOKEN``, ``PROB``,
    ``MARGIN``, ``GAP``), then the candidates' ids, then their probabilities."""

    top: int

    @property
    def columns(self) -> int:
        return PACK_FIXED + 2 * self.top

    @property
    def ids(self) -> slice:
        return slice(PACK_FIXED, PACK_FIXED + self.top)

    @property
    def probs(self) -> slice:
        return slice(PACK_FIXED + self.top, PACK_FIXED + 2 * self.top)


@dataclass
class StageOutput:
    """What one explorer produced in one round, for a batch of n nodes (host values, read in the round's one
    transfer)."""

    tokens: list[int]  # chosen candidate per node
    top: list[list[tuple[int, float]]]  # per node, the best candidates at this depth: (token, probability)
    hidden: torch.Tensor | None  # (n, hidden) stage output, for the depth children (None at the last stage)
    seconds: float  # expansion time (layers + LM head), masks excluded
    probs: list[float] | None = None  # each chosen candidate's probability (for lattice pruning)
    margins: list[float] | None = None  # final stage (and those that chose with it): top-1 minus top-2 score
    tie_gaps: list[float] | None = None  # as margins: the dtype's tie gap at each node's top logit
    logprobs: list[tuple[float, list[tuple[int, float]]]] | None = (
        None  # final stage, when asked: each chosen
    )
    # token's log-probability and the likeliest (token, log-probability) pairs (``Choice.logprobs``)


@dataclass(frozen=True)
class Choice:
    """One explorer's choices of a round, still on its device: ``rows`` rows from row ``at`` of ``block`` (the
    packed rows of every explorer that chose with it: ``pack``'s layout), its output rows ``hidden`` for the next
    stage (None at the last), and ``seconds(wait)``, the clock's reading of its expansion
    (``runtime.clock.Clock.seconds``), taken once the round has been read."""

    block: torch.Tensor
    at: int
    rows: int
    hidden: torch.Tensor | None
    seconds: Callable[[bool], float]
    logprobs: torch.Tensor | None = None  # the final stage's, when a request asks: (rows of block, 1 + 2 k)

    @property
    def pack(self) -> torch.Tensor:
        """(rows, columns): this explorer's own rows (a view)."""
        return self.block[self.at : self.at + self.rows]


def pack_columns(top: int) -> int:
    """Columns of one node's row for ``top`` trace candidates."""
    return PackLayout(top).columns


def top_of(columns: int) -> int:
    """The trace candidates a row of ``columns`` holds."""
    return (columns - PACK_FIXED) // 2


def pack(n: int, top: int, device, tokens, values=(None, None, None), candidates=None) -> torch.Tensor:
    """(n, ``PackLayout(top).columns``) float64 on ``device``, in that layout's order: ``tokens`` ((n,) or one
    value), ``values`` (probability, margin, tie gap: each (n,) or None) and ``candidates`` ((n, t) ids, (n, t)
    probabilities, t <= top, or None); NaN or -1 elsewhere. One stack of columns: few ops, as each costs the host a
    dispatch."""
    absent = torch.full((n,), float("nan"), dtype=torch.float64, device=device)
    if not isinstance(tokens, torch.Tensor):
        tokens = absent.new_full((n,), tokens)
    out = torch.stack([tokens, *(absent if v is None else v for v in values)], dim=1).to(torch.float64)
    if not top:
        return out
    ids, probs = candidates if candidates is not None else (out[:, :0], out[:, :0])
    missing = top - ids.shape[1]  # no candidate there: id -1, probability NaN
    none = absent.new_full((n, missing), -1.0)
    return torch.cat(
        [out, ids.to(torch.float64), none, probs.to(torch.float64), absent[:, None].expand(n, missing)], 1
    )


def read_round(choices: list[Choice]) -> list[list[list[float]]]:
    """Every choice's rows on the host, in one transfer: their blocks (``Choice.block``, each once) copied one after
    the other into a buffer of a bucket of rows on the last block's device (the same shapes whichever explorers
    ran), then read at once."""
    if not choices:
        return []
    starts, at = {}, 0  # id(block) -> its first row in the buffer
    for c in choices:
        if id(c.block) not in starts:
            starts[id(c.block)], at = at, at + len(c.block)
    blocks = {id(c.block): c.block for c in choices}
    source = choices[0].block  # one block: every explorer chose together, and it is a bucket of rows already
    if len(blocks) > 1:
        source = source.new_empty(bucket(at), source.shape[1], device=choices[-1].block.device)
        for key, block in blocks.items():
            source[starts[key] : starts[key] + len(block)].copy_(block, non_blocking=True)
    values = source.tolist()  # the round's one read
    return [values[starts[id(c.block)] + c.at : starts[id(c.block)] + c.at + c.rows] for c in choices]


def read_logprobs(choice: Choice, n: int) -> list[tuple[float, list[tuple[int, float]]]] | None:
    """The log-probabilities of ``choice``'s first ``n`` rows (``Choice.logprobs``: the chosen token's, then k
    ids and k values), read to the host (a second read, made only for a request that asks)."""
    if choice.logprobs is None:
        return None
    k = (choice.logprobs.shape[1] - 1) // 2
    rows = choice.logprobs[choice.at : choice.at + n].tolist()
    return [(r[0], [(int(t), v) for t, v in zip(r[1 : 1 + k], r[1 + k :])]) for r in rows]


def unpack(rows: list[list[float]], top: int, hidden, seconds: float) -> StageOutput:
    """A stage's ``StageOutput`` from its rows (``pack``'s layout, ``PackLayout``, read to the host)."""
    layout = PackLayout(top)

    def column(c: int):
        return None if not rows or math.isnan(rows[0][c]) else [r[c] for r in rows]

    return StageOutput(
        tokens=[int(r[TOKEN]) for r in rows],
        top=[[(int(t), p) for t, p in zip(r[layout.ids], r[layout.probs]) if t >= 0] for r in rows],
        hidden=hidden,
        seconds=seconds,
        probs=column(PROB),
        margins=column(MARGIN),
        tie_gaps=column(GAP),
    )
