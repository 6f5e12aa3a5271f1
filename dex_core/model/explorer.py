"""One depth explorer: the decoder layers of one stage, their tree KV cache, and candidate proposal.

Explorer k owns layers (d_{k-1}, d_k]. Each round it runs a batch of exploration tokens as one
sequence with an explicit additive mask: a node attends to the committed prefix, to the
entries of the slots on its own branch (its prefix inside the lattice) and to itself. Positions go to
the rotary embedding per token. Its output hidden states feed the depth children on explorer k + 1;
its candidates come from hidden -> adapter (non-final depths only) -> final norm -> LM head (at non-final
depths a light head may score only a shortlist of the vocabulary: ``dex_core.model.proposal``).

The round's device work is the *stage step* (``Explorer.step``): rows in, rows out, from a batch padded to a
bucket of rows (``dex_core.shapes``), a mask table of fixed size (``TreeMask``) and a cache of fixed capacity, so
its ops and shapes repeat from round to round: a GPU can capture it, and ``compile_step`` compiles it once per
bucket. The layers attend through ``dex_sdpa`` where the model runs SDPA (``model.attention``: no ``repeat_kv``).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from itertools import chain

import torch

from ..device import to_device
from ..shapes import bucket, capacity, padded
from .cache import EMPTY, LanesWrite, StageCache
from .compiled import CompiledStep, compile_options
from .view import ModelView

NO_SLOT = -2  # a table's path filler (never equal to a slot, nor to ``EMPTY``)


class TreeMask:
    """The additive tree masks of one stage's batches, built on the stage's device from a fixed-size table.

    Entry j is visible to node i if it is committed, or a lattice entry (existing or in this batch) whose slot
    lies on node i's path; with a sliding window w, only if position_i - position_j < w. The host writes one
    table per batch (``table``): the rows' positions, their paths (``width`` slots each), their slots (``EMPTY`` for
    padding rows), the committed length and the cache's length; the lattice's slots and positions are the cache's
    tags, already on the device (``StageCache.tags``), so the table grows with the batch, never with the lattice.
    ``rows`` reads the table's rows (their positions, the entries they write and those entries' tags); ``build``
    makes one mask (1, 1, rows, capacity) per window from them and the cache's tags, with tensor ops of fixed
    shapes: it reads the tags of ``region`` entries from the first lattice entry (those past the batch's rows,
    stale after a compaction, hidden); the committed prefix sits at positions 0, 1, ... in order, so its columns
    need no tags. ``region`` and ``width`` are buckets that only grow: after a run's first rounds a stage's tables
    keep their size, and a batch of ``rows`` (a bucket) always runs the same ops on the same shapes.
    """

    def __init__(self, windows: list, dtype: torch.dtype, device):
        self.windows, self.dtype, self.device = windows, dtype, torch.device(device)
        self.low = torch.finfo(dtype).min  # finite: a bfloat16/float16 score plus the mask never makes NaN
        self.region, self.width = REGION_LEAST, WIDTH_LEAST

    def table(
        self, cache: StageCache, rows: int, slots: list[int], paths: list, positions: list[int]
    ) -> list:
        """The host table (in ``TableLayout``'s order) of a batch of ``len(slots)`` nodes run as ``rows`` rows
        (``positions``: where each node's input token sits; ``paths``: its slots from the anchor down, itself last);
        its size depends only on ``rows`` and ``width``; ``region`` grows to cover the cache's lattice and the
        batch."""
        n = len(slots)
        self.region = max(self.region, bucket(len(cache.slots) + rows))
        width = self.width = max(self.width, bucket(max(map(len, paths), default=1)))
        fill = (NO_SLOT,) * width
        table = padded(positions, rows, positions[0] if positions else 0)  # no nodes: padding rows alone
        # the paths as tuples, iterated in C rather than item by item
        table += chain.from_iterable(tuple(p) + fill[len(p) :] for p in paths)
        table += [NO_SLOT] * ((rows - n) * width)
        table += padded(slots, rows, EMPTY)
        table += (cache.committed, len(cache))
        return table

    def rows(self, data: torch.Tensor, rows: int) -> Rows:
        """A table (``table``, on the device) -> its batch's ``rows`` rows."""
        at = TableLayout(rows, self.width)
        positions = data[at.positions]
        paths = data[at.paths].view(rows, at.width)
        committed, length = data[at.committed], data[at.length]
        tags = torch.stack([data[at.slots], positions])  # (2, rows): slots, positions
        return Rows(
            positions=positions,
            paths=paths,
            at=length + torch.arange(rows, device=self.device),
            tags=tags,
            committed=committed,
        )

    def build(self, batch: Rows, tags: torch.Tensor) -> dict:
        """The mask of each window, {window: (1, 1, rows, capacity)}, of ``batch`` over a cache whose tags
        ``tags`` (``StageCache.tags``, (2, capacity)) hold the batch's already."""
        rows, capacity, positions = batch.positions.shape[0], tags.shape[1], batch.positions
        lattice = batch.committed + torch.arange(self.region, device=self.device)  # the region's columns
        slots, keys = tags.index_select(1, lattice)  # (region,) each
        columns = torch.arange(capacity, device=self.device)
        # entries past the batch's rows hold stale tags (after a compaction): never seen
        live = (lattice <= batch.at[-1])[None, :]  # (1, region)
        on_path = (batch.paths[:, :, None] == slots[None, None, :]).any(dim=1) & live  # (rows, region)
        masks = {}
        for w in self.windows:
            prefix = (columns < batch.committed)[None, :]  # (1, capacity)
            seen = on_path
            if w is not None:
                prefix = prefix & (positions[:, None] - columns[None, :] < w)
                seen = seen & (positions[:, None] - keys[None, :] < w)
            region = torch.zeros(rows, capacity, dtype=torch.bool, device=self.device)
            # the region's columns are past the prefix
            visible = prefix | region.index_copy_(1, lattice, seen)
            mask = torch.zeros(rows, capacity, dtype=self.dtype, device=self.device)
            masks[w] = mask.masked_fill_(~visible, self.low)[None, None]
        return masks


@dataclass(frozen=True)
class TableLayout:
    """Where each part of a batch's mask table sits (``TreeMask.table`` writes them in this order, ``TreeMask.rows``
    reads them): the ``rows`` rows' positions, their paths (``width`` slots each), their slots, then the cache's
    committed length and its length."""

    rows: int
    width: int

    @property
    def positions(self) -> slice:
        return slice(0, self.rows)

    @property
    def paths(self) -> slice:
        return slice(self.rows, self.rows * (1 + self.width))

    @property
    def slots(self) -> slice:
        return slice(self.rows * (1 + self.width), self.rows * (2 + self.width))

    @property
    def committed(self) -> int:
        return self.rows * (2 + self.width)

    @property
    def length(self) -> int:
        return self.committed + 1

    @property
    def size(self) -> int:
        return self.length + 1


@dataclass(frozen=True)
class Rows:
    """A batch's rows on the device, read from its table (``TreeMask.rows``)."""

    positions: torch.Tensor  # (rows,) where each row's input token sits
    paths: torch.Tensor  # (rows, width) each row's slots from the anchor down, ``NO_SLOT`` after them
    at: torch.Tensor  # (rows,) the cache entries the rows write
    tags: torch.Tensor  # (2, rows) those entries' tags: slots (``EMPTY`` for padding rows), positions
    committed: torch.Tensor  # () the cache's committed length


REGION_LEAST, WIDTH_LEAST = 16, 8  # the least lattice region and path width of a tree mask's table


def causal_mask(start: int, count: int, window: int | None, dtype: torch.dtype, device, columns: int):
    """Additive causal mask (1, 1, count, columns) for committed tokens at start..start+count-1 over a cache of
    ``columns`` entries (those past the tokens hidden)."""
    q = torch.arange(start, start + count, device=device)[:, None]
    k = torch.arange(columns, device=device)[None, :]
    visible = k <= q
    if window is not None:
        visible &= (q - k) < window
    mask = torch.zeros(visible.shape, dtype=dtype, device=device)
    return mask.masked_fill_(~visible, torch.finfo(dtype).min)[None, None]


@dataclass(frozen=True)
class Seat:
    """One run's place on an explorer: its lane of the stage's KV buffer and its tree masks' tables."""

    cache: StageCache
    tree: TreeMask


class Explorer:
    """Explorer ``index`` of ``count``, running layers [start, stop) of ``view``; ``compile``: its stage step
    through ``torch.compile(fullgraph=True, dynamic=False)`` (one compilation per bucket of rows, region and
    capacity)."""

    def __init__(
        self, view: ModelView, index: int, count: int, start: int, stop: int, adapter=None, head=None
    ):
        self.view = view
        self.index = index
        self.final = index == count - 1
        self.layer_ids = list(range(start, stop))
        self.adapter = None if self.final else adapter
        self.head = None if self.final else head  # a ProposalHead, or None: the full LM head
        self._windows = sorted({view.windows[i] for i in self.layer_ids}, key=lambda w: (w is None, w))
        cache = StageCache(self.layer_ids, view.kv_heads, view.head_dim, view.dtype, view.device)
        self.seats = [Seat(cache, TreeMask(self._windows, view.dtype, view.device))]  # one a run in flight
        self.seat = self.seats[0]  # the run its methods work for (``seated``)
        self._rope_types = {view.rope_types[i] for i in self.layer_ids}
        self.step = self._step  # the stage step: eager, or compiled by ``compile_step``

    cache = property(lambda self: self.seat.cache, doc="the seated run's KV cache (``StageCache``)")
    tree = property(lambda self: self.seat.tree, doc="the seated run's tree masks (``TreeMask``)")

    def add_seat(self) -> Seat:
        """A seat for one more run in flight: a new lane of the stage's KV buffer, its own tree masks."""
        view, lanes = self.view, self.seats[0].cache.lanes
        cache = StageCache(self.layer_ids, view.kv_heads, view.head_dim, view.dtype, view.device, lanes=lanes)
        self.seats.append(Seat(cache, TreeMask(self._windows, view.dtype, view.device)))
        return self.seats[-1]

    def remove_seat(self, seat: Seat) -> None:
        """``seat``'s run left: its lane leaves the buffer (the last seat stays, emptied by the next run's reset)."""
        if len(self.seats) > 1:
            self.seats.remove(seat)
            seat.cache.lanes.remove(seat.cache)
        self.seat = self.seats[0]

    @contextlib.contextmanager
    def seated(self, seat: Seat):
        """Within the block the explorer's methods work on ``seat``'s run (its cache and tables)."""
        before, self.seat = self.seat, seat
        try:
            yield
        finally:
            self.seat = before

    def compile_step(self, spec=True, **options) -> None:
        """Run the stage step through ``torch.compile`` (``model.compiled``): ``spec`` is the decoder option
        ``compile`` (True: inductor, capturing CUDA graphs on CUDA; or a backend's name), ``options`` more of
        ``torch.compile``'s arguments. One compilation per bucket, within the process's ``COMPILE_BUDGET``."""
        self.cache.mark_static()
        options = compile_options(spec, self.view.device) | options
        self.step = CompiledStep(self._step, self._bucket, options)

    def _bucket(self, hidden: torch.Tensor) -> tuple:
        """What a compiled step's shapes depend on: rows, the mask table's path width and region, the capacity."""
        return hidden.shape[0], self.tree.width, self.tree.region, self.cache.capacity

    def reset(self, context: int = 0, lattice: int | None = None) -> None:
        """A fresh run of at most ``context`` tokens (prompt and new ones) and, with a row budget, at most
        ``lattice`` lattice entries and rows in one round of this stage: the cache emptied and sized for them once,
        so a compiled step keeps its buffer through the run (an unbounded lattice may still grow it)."""
        self.cache.reset()
        self.cache.reserve(context + 2 * bucket(max(lattice or 0, self.tree.region)))

    def _forward(self, h: torch.Tensor, pos: torch.Tensor, masks: dict, cache) -> torch.Tensor:
        """The stage's layers over rows (lanes, n, hidden) at positions ``pos`` (lanes, n), writing ``cache``."""
        view = self.view
        rope = view.rotary(h, pos, self._rope_types)
        for i in self.layer_ids:
            out = view.layers[i](
                h,
                attention_mask=masks[view.windows[i]],
                position_ids=pos,
                position_embeddings=rope[view.rope_types[i]],
                use_cache=True,
                **{view.cache_kwarg: cache},
                **view.layer_kwargs,
            )
            h = out[0] if isinstance(out, tuple) else out
        return h

    def _step(self, hidden: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
        """The stage step: a batch's rows (rows, hidden) and its mask table (``TreeMask.table``, on the device)
        through the stage's layers. Tensor ops of shapes fixed by the buckets alone: what a GPU captures."""
        batch = self.tree.rows(table, hidden.shape[0])
        self.cache.write_at(batch.at, batch.tags)
        masks = self.tree.build(batch, self.cache.tags)
        return self._forward(hidden[None], batch.positions[None], masks, self.cache)[0]

    @torch.no_grad()
    def prefill(self, hidden: torch.Tensor) -> torch.Tensor:
        """Run committed prompt tokens (n, hidden) at the next positions; return their outputs."""
        start, n, device = self.cache.committed, hidden.shape[0], self.view.device
        self.cache.settle()
        self.cache.reserve(start + n + 2 * self.tree.region)
        columns = self.cache.capacity
        masks = {w: causal_mask(start, n, w, self.view.dtype, device, columns) for w in self._windows}
        positions = torch.arange(start, start + n, device=device)
        self.cache.write_at(positions, torch.stack([torch.full_like(positions, EMPTY), positions]))
        out = self._forward(hidden[None], positions[None], masks, self.cache)[0]
        self.cache.extend_committed(n)
        return out

    def table(self, rows: int, slots: list[int], positions: list[int], paths: list) -> list[int]:
        """The mask table of a batch of ``len(slots)`` nodes run as ``rows`` rows, on the host (``TreeMask.table``; the
        caller moves it to the device, the tables of a round's explorers together), the cache grown first if the
        batch or the table's region would not fit."""
        host = self.tree.table(self.cache, rows, slots, paths, positions)
        self.cache.reserve(self.cache.committed + self.tree.region)
        return host

    @torch.no_grad()
    def expand(
        self,
        hidden: torch.Tensor,
        slots: list[int],
        positions: list[int],
        paths: list[tuple[int, ...]],
        table: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Run a batch of lattice nodes whose input tokens sit at ``positions``: ``hidden`` (rows, hidden) holds
        their rows first, then padding (rows >= len(slots): a bucket keeps the shapes fixed); all rows come back.
        ``table``: ``self.table(...)`` of the batch on the device, when the caller made it already."""
        if table is None:
            table = to_device(self.table(hidden.shape[0], slots, positions, paths), self.view.device)
        self.cache.settle()  # the last commit's moves, enqueued with this step
        out = self.step(hidden, table)
        if isinstance(self.step, CompiledStep):  # out of the graph's memory: its next replay may reuse it
            out = out.clone()
        self.cache.extend(slots, positions)
        return out

    @torch.no_grad()
    def propose(self, hidden: torch.Tensor) -> torch.Tensor:
        """Candidate logits at this explorer's depth: (n, vocab), or (n, N) over ``head.ids`` with a light head."""
        if self.adapter is not None:
            hidden = self.adapter(hidden)
        return self.view.head(hidden) if self.head is None else self.head(hidden)

    @torch.no_grad()
    def expand_seats(
        self, hidden: torch.Tensor, seats: list[Seat], tables: list[torch.Tensor], nodes: list
    ) -> torch.Tensor:
        """One step for several runs: ``hidden`` (lanes, rows, hidden) holds each seat's batch (its lane's rows,
        padding after its nodes), ``tables`` each batch's mask table on the device (``table`` while seated),
        ``nodes`` each batch's (slots, positions) for its cache's books. ``seats``: every seat, in lane order (an
        idle one runs padding rows alone). Each lane's rows attend to its own lane only."""
        rows, at, positions, masks = hidden.shape[1], [], [], []
        columns = seen_columns(seats)
        for seat, table in zip(seats, tables):
            seat.cache.settle()
            batch = seat.tree.rows(table, rows)
            seat.cache.write_at(batch.at, batch.tags)
            at.append(batch.at)
            positions.append(batch.positions)
            masks.append(seat.tree.build(batch, seat.cache.tags[:, :columns]))
        joined = {w: torch.cat([m[w] for m in masks]) for w in self._windows}  # (lanes, 1, rows, columns)
        write = LanesWrite(seats[0].cache.lanes, torch.stack(at), seats[0].cache._layer, columns)
        out = self._forward(hidden, torch.stack(positions), joined, write)
        for seat, (slots, inputs) in zip(seats, nodes):
            seat.cache.extend(slots, inputs)
        return out


def seen_columns(seats: list[Seat]) -> int:
    """The KV entries a shared step's rows can see: every lane's committed prefix and its tree's region (which holds
    its lattice and the step's rows), the most of them in steps of ``shapes.capacity``. The lanes share the buffer's
    capacity, which only grows (the longest context a lane held); its entries past these are empty in every lane, and
    attention need not read them."""
    lanes = seats[0].cache.lanes
    return min(lanes.capacity, capacity(max(s.cache.committed + s.tree.region for s in seats)))
