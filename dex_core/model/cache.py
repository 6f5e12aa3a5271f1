"""Per-stage tree KV cache: committed entries first, then lattice entries tagged by slot.

A stage owns only some decoder layers, so it keeps its own small cache object that Hugging Face
attention calls through ``update(key, value, layer_idx, ...)`` with the layer's *global* index.
Entries live in preallocated buffers of a fixed capacity (``shapes.capacity``, set at a run's start, grown only by
``reserve`` when a lattice outgrows its bound), in buffers whose addresses a compiled step keeps (``mark_static``):
``update`` writes the batch at the entries ``write_at`` named, on the device (``index_copy_``, so the indices
are tensor values, not shapes), and returns the whole buffers: attention runs over every entry of the capacity and
the caller's mask hides those that are not visible, so a round's shapes do not change as the context grows.
Beside the buffers, every entry's *tag* (its slot id and position, ``tags``) lives on the device too, written with
the batch (``write_at``) and moved with the entries: a round's tree masks read the lattice's tags there, so the host
never sends them. ``extend``/``extend_committed`` then account for the batch once every layer of the stage has run.
``retain(lattice, promote)`` compacts after a collapse: the committed prefix stays where it is and only lattice
entries are named and moved (a gather and an ``index_copy_`` of a bucket of entries), so a commit costs
O(lattice entries), not O(context). ``keep(indices)`` is the general form (any order of any entries) and costs
O(len(indices)). The entries' host bookkeeping changes at once (the next round's plan and tables read it); their
move on the device waits for ``settle``, which the explorer calls before its next step runs: the device moves them
with that step's work, and the host's commit does not wait for them.
"""

from __future__ import annotations

import torch

from ..device import to_device
from ..log import stderr
from ..shapes import bucket, capacity

MOVE_LEAST = 16  # the least bucket of entries a compaction moves
EMPTY = -1  # the slot tag of an entry no node sees (a batch's padding rows, the committed prompt)


class Lanes:
    """One stage's KV buffer, shared by the runs in flight on it: (2, layers, lanes, kv_heads, capacity, head_dim),
    and each entry's tags (lanes, 2, capacity). Lane b, the buffer's batch index b, is one run's ``StageCache``; a
    step of several runs reads and writes every lane at once (``LanesWrite``). Lanes join and leave between rounds
    (``add``, ``remove``: the buffer laid out anew, O(lanes x capacity) once), and share one capacity, which only
    grows (``reserve``)."""

    def __init__(self, layers: int, kv_heads: int, head_dim: int, dtype, device, capacity: int):
        # zeros, not empty: attention reads every entry of the capacity (masked ones too, and 0 x NaN is NaN)
        self.kv = torch.zeros((2, layers, 1, kv_heads, capacity, head_dim), dtype=dtype, device=device)
        self.tags = torch.full((1, 2, capacity), EMPTY, dtype=torch.long, device=device)
        self.caches: list[StageCache] = []  # lane b's cache at b
        self.grown = 0  # times the buffer grew mid-run (an unbounded lattice): a compiled step re-records
        self.static = False  # a compiled step's: the buffer's address marked static (``mark_static``)

    @property
    def capacity(self) -> int:
        return self.kv.shape[4]

    def mark_static(self) -> None:
        self.static = True
        torch._dynamo.mark_static_address(self.kv)
        torch._dynamo.mark_static_address(self.tags)

    def add(self, cache: StageCache) -> None:
        """``cache`` takes a new lane, after the others (empty: its run resets it)."""
        if self.caches:
            self._lay(self.kv.shape[2] + 1, list(range(self.kv.shape[2])), self.capacity)
        cache.lane = len(self.caches)
        self.caches.append(cache)

    def remove(self, cache: StageCache) -> None:
        """``cache``'s lane leaves the buffer (the last lane stays: it is the stage's own)."""
        if len(self.caches) == 1:
            return
        self.caches.remove(cache)
        self._lay(len(self.caches), [c.lane for c in self.caches], self.capacity)
        for lane, c in enumerate(self.caches):
            c.lane = lane

    def reserve(self, needed: int, busy: bool) -> None:
        """Room for ``needed`` entries in every lane: the capacity grows to ``shapes.capacity(needed)`` (entries
        copied), never shrinks. ``busy``: a run is under way in it (a compiled step then records its graphs again)."""
        if needed <= self.capacity:
            return
        if self.static and busy and not self.grown:
            stderr(
                f"a stage's KV cache grew mid-run to {capacity(needed)} entries (a lattice past the row budget's "
                "bound): its compiled step compiles anew"
            )
        self.grown += busy
        self._lay(self.kv.shape[2], list(range(self.kv.shape[2])), capacity(needed))

    def _lay(self, lanes: int, old: list[int], size: int) -> None:
        """The buffer anew with ``lanes`` lanes of ``size`` entries; lanes ``old`` copied into the first ones."""
        kv, tags = self.kv, self.tags
        self.kv = kv.new_zeros((*kv.shape[:2], lanes, kv.shape[3], size, kv.shape[5]))
        self.tags = tags.new_full((lanes, 2, size), EMPTY)
        n = len(old)
        if old == list(
            range(n)
        ):  # the first lanes, in order (a lane added, the capacity grown): no gathered copy
            self.kv[:, :, :n, :, : kv.shape[4]] = kv[:, :, :n]
            self.tags[:n, :, : tags.shape[2]] = tags[:n]
        else:
            keep = torch.tensor(old, device=kv.device)
            self.kv[:, :, :n, :, : kv.shape[4]] = kv.index_select(2, keep)
            self.tags[:n, :, : tags.shape[2]] = tags.index_select(0, keep)
        if self.static:
            self.mark_static()


class LanesWrite:
    """What a step of several lanes' rows hands the layers as their cache: ``update`` writes each lane's keys and
    values (lanes, kv_heads, rows, head_dim) at its entries ``at`` (lanes, rows) and gives every lane's first
    ``columns`` entries back, the most any of its rows sees (each lane's tree mask hides what its rows do not)."""

    def __init__(self, lanes: Lanes, at: torch.Tensor, layer: dict[int, int], columns: int):
        self.lanes, self.layer, self.columns = lanes, layer, columns
        self.at = at[:, None, :, None]  # (lanes, 1, rows, 1): expanded to each layer's shape

    def update(self, key: torch.Tensor, value: torch.Tensor, layer_idx: int, *args, **kwargs):
        j, at = self.layer[layer_idx], self.at.expand(*key.shape)
        keys, values = self.lanes.kv[0, j], self.lanes.kv[1, j]
        keys.scatter_(2, at, key)
        values.scatter_(2, at, value)
        return keys[:, :, : self.columns], values[:, :, : self.columns]


class StageCache:
    def __init__(
        self,
        layer_ids: list[int],
        kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str = "cpu",
        capacity: int = 256,
        lanes: Lanes | None = None,
    ):
        """A run's cache of layers ``layer_ids``: a lane of ``lanes`` (a stage's buffer its runs share), or of a
        buffer of its own."""
        self.layer_ids = list(layer_ids)
        self.lanes = lanes or Lanes(len(layer_ids), kv_heads, head_dim, dtype, device, capacity)
        self.lane = 0  # its index in the buffer's lanes (``Lanes.add``)
        self.lanes.add(self)
        # a layer's global index -> its place in the buffer
        self._layer = {i: j for j, i in enumerate(self.layer_ids)}
        self.committed = 0  # entries [0, committed) are the committed prefix, in position order
        self.slots: list[int] = []  # slot id of each lattice entry (index committed + i)
        self.positions: list[int] = []  # absolute token position of each lattice entry
        self.at: torch.Tensor | None = None  # (q,) the entries the next ``update`` writes, on the device
        self._moves: list[list[int]] = []  # moves the device has not made yet, in order (``settle``)

    @property
    def _kv(self) -> torch.Tensor:
        """Its lane of every layer's keys and values (2, layers, 1, kv_heads, capacity, head_dim)."""
        kv = self.lanes.kv
        return kv if kv.shape[2] == 1 else kv[:, :, self.lane : self.lane + 1]

    @property
    def tags(self) -> torch.Tensor:
        """Each entry's tag (2, capacity): its slot id, then its position."""
        return self.lanes.tags[self.lane]

    @property
    def grown(self) -> int:
        return self.lanes.grown

    @property
    def static(self) -> bool:
        return self.lanes.static

    def __len__(self) -> int:
        return self.committed + len(self.slots)

    @property
    def capacity(self) -> int:
        return self.lanes.capacity

    def mark_static(self) -> None:
        """Tell ``torch.compile`` the buffers (entries and tags) keep their addresses (until ``reserve`` grows them,
        which marks the new ones): CUDA graphs (``mode="reduce-overhead"``) then write them in place instead of
        skipping a graph that mutates one of its inputs."""
        self.lanes.mark_static()

    def keys(self, layer: int) -> torch.Tensor:
        """Layer ``layer``'s (global index) keys (1, kv_heads, capacity, head_dim): a view of the one buffer, made
        when asked (a compiled step then mutates the buffer, its one static input, not a view kept between steps)."""
        return self._kv[0, self._layer[layer]]

    def values(self, layer: int) -> torch.Tensor:
        """Layer ``layer``'s values, as ``keys``."""
        return self._kv[1, self._layer[layer]]

    def reserve(self, needed: int) -> None:
        """Room for ``needed`` entries: the capacity (every lane's) grows to ``shapes.capacity(needed)`` (entries
        copied), never shrinks."""
        self.lanes.reserve(needed, bool(len(self)))

    def write_at(self, at: torch.Tensor, tags: torch.Tensor | None = None) -> None:
        """The next batch's entries: ``at`` (q,) indices on the cache's device, below the capacity; ``tags`` (2, q),
        the entries' slots and positions, written there now."""
        self.at = at
        if tags is not None:
            self.tags.index_copy_(1, at, tags)

    def update(self, key: torch.Tensor, value: torch.Tensor, layer_idx: int, *args, **kwargs):
        """Write a batch's keys/values (1, kv_heads, q, head_dim) at the entries ``write_at`` named; every entry
        of the capacity back (the mask says which are visible)."""
        # views made here, not kept: a compiled step mutates the one (static) buffer
        keys, values = self.keys(layer_idx), self.values(layer_idx)
        keys.index_copy_(2, self.at, key)
        values.index_copy_(2, self.at, value)
        return keys, values

    def extend_committed(self, count: int) -> None:
        """Account for a batch of committed-prefix tokens (prefill); needs an empty lattice."""
        if self.slots:
            raise RuntimeError("committed entries can only be appended while the lattice is empty")
        self.committed += count

    def extend(self, slots: list[int], positions: list[int]) -> None:
        """Account for a batch of lattice entries, one per computed node."""
        self.slots.extend(slots)
        self.positions.extend(positions)

    def _move(self, start: int, src: list[int]) -> None:
        """Entries ``src`` (in that order) become entries ``start``, ``start + 1``, ... of every layer: one gather
        and one ``index_copy_`` of a bucket of entries, the padding moving entries past the last onto themselves
        (distinct from every destination, and read before anything is written)."""
        if not src:
            return
        size = bucket(len(src), MOVE_LEAST)
        self.reserve(start + size)
        stay = list(range(start + len(src), start + size))
        self._moves.append(src + stay + list(range(start, start + size)))  # sources, then destinations

    def settle(self) -> None:
        """Make on the device the moves compactions named (``_move``), in order: before anything reads the
        entries (an explorer's step, its prefill)."""
        kv, tags = self._kv, self.tags
        for move in self._moves:
            size, index = len(move) // 2, to_device(move, kv.device)
            # every layer's keys and values at once, and their tags
            kv.index_copy_(4, index[size:], kv.index_select(4, index[:size]))
            tags.index_copy_(1, index[size:], tags.index_select(1, index[:size]))
        self._moves.clear()

    def retain(self, lattice: list[int], promote: int = 0) -> None:
        """Keep the committed prefix and the lattice entries at ``lattice`` (indices relative to the first
        lattice entry, in that order); the first ``promote`` of them join the committed prefix.
        O(len(lattice)): the committed entries are neither listed nor touched."""
        same = 0
        while same < len(lattice) and lattice[same] == same:
            same += 1
        self._move(self.committed + same, [self.committed + i for i in lattice[same:]])
        rest = lattice[promote:]
        self.slots = [self.slots[i] for i in rest]
        self.positions = [self.positions[i] for i in rest]
        self.committed += promote

    def keep(self, indices: list[int], committed: int) -> None:
        """Keep the entries at ``indices`` (in that order); the first ``committed`` are committed.
        O(len(indices)); ``retain`` does the usual case (the committed prefix stays) without listing it."""
        start = 0
        while start < len(indices) and indices[start] == start:
            start += 1
        self._move(start, indices[start:])
        lattice = [i - self.committed for i in indices[committed:]]
        self.slots = [self.slots[i] for i in lattice]
        self.positions = [self.positions[i] for i in lattice]
        self.committed = committed

    def commit(self, slot: int, kept_slots: set[int]) -> None:
        """Move ``slot``'s entry into the committed prefix and drop lattice entries not kept: O(lattice)."""
        mine = [i for i, s in enumerate(self.slots) if s == slot]
        if len(mine) != 1:
            raise RuntimeError(f"slot {slot} has {len(mine)} entries in this stage; expected 1")
        self.retain(mine + [i for i, s in enumerate(self.slots) if s in kept_slots], promote=1)

    def reset(self) -> None:
        self.committed = 0
        self._moves.clear()
        self.slots, self.positions = [], []
        self.tags.fill_(EMPTY)
