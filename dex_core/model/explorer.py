"""One depth explorer: the decoder layers of one stage, their tree KV cache, and candidate proposal.

Explorer k owns layers (d_{k-1}, d_k]. Each round it runs a batch of exploration tokens as one
sequence of length n with an explicit additive mask: a node attends to the committed prefix, to the
entries of the slots on its own branch (its prefix inside the lattice) and to itself. Positions go to
the rotary embedding per token. Its output hidden states feed the depth children on explorer k + 1;
its candidates come from hidden -> adapter (non-final depths only) -> final norm -> LM head (at non-final
depths a light head may score only a shortlist of the vocabulary: ``dex_core.model.proposal``).
"""

from __future__ import annotations

import torch

from ..device import to_device
from .cache import StageCache
from .view import ModelView


def _additive(visible: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A boolean visibility matrix (q, k) -> the additive mask (1, 1, q, k): 0 where visible, else the
    dtype's most negative finite value (finite, so a bfloat16/float16 score plus the mask never makes NaN)."""
    mask = torch.zeros(visible.shape, dtype=dtype, device=visible.device)
    return mask.masked_fill_(~visible, torch.finfo(dtype).min)[None, None]


class TreeMask:
    """The additive tree masks of one stage's lattice batches under one attention window, on ``device``.

    Entry j is visible to node i if it is committed, or a lattice entry (existing or in this batch)
    whose slot lies on node i's path; with a sliding window, only if position_i - position_j < window.
    A batch's mask is [committed columns | lattice columns]. The committed columns are the same for
    every node and round (all visible; under a window w the first ``committed - w + 1`` are hidden),
    so they stay in a buffer between rounds and change only where the committed prefix grew; a round
    writes its lattice columns and, under a window, the few committed columns near the window's edge
    that differ per node. Per round that is O(nodes × lattice), not O(nodes × context).
    """

    def __init__(self, window: int | None, dtype: torch.dtype, device):
        self.window, self.dtype, self.device = window, dtype, torch.device(device)
        self.low = torch.finfo(dtype).min  # finite: a bfloat16/float16 score plus the mask never makes NaN
        self.buf = torch.zeros(0, 0, dtype=dtype, device=self.device)  # (rows, columns), committed part kept
        self.committed = 0  # the committed length the buffer's committed part is built for
        self.band = (0, 0, 0)  # (first, stop, rows) committed columns the last batch wrote per node

    def _hidden(self, committed: int) -> int:
        """Leading committed columns hidden from every node at a position of at least ``committed`` (every
        lattice node; ``build`` writes the exact columns of any other node into its band)."""
        return 0 if self.window is None else max(0, committed - self.window + 1)

    def _reset(self, rows: int, columns: int, committed: int) -> None:
        rows = max(16, 1 << (rows - 1).bit_length(), self.buf.shape[0])  # powers of two, never shrinking
        columns = max(256, 1 << (columns - 1).bit_length(), self.buf.shape[1])
        self.buf = torch.zeros(rows, columns, dtype=self.dtype, device=self.device)
        self.buf[:, : self._hidden(committed)] = self.low
        self.committed, self.band = committed, (0, 0, 0)

    def _advance(self, committed: int) -> None:
        """Back to the committed part of ``self.committed`` (undo the last band), then grow it to ``committed``."""
        first, stop, rows = self.band
        hidden, now = self._hidden(self.committed), self._hidden(committed)
        if min(stop, hidden) > first:
            self.buf[:rows, first : min(stop, hidden)] = self.low
        if stop > max(first, hidden):
            self.buf[:rows, max(first, hidden) : stop] = 0
        if committed > self.committed:
            self.buf[:, self.committed : committed] = 0  # former lattice columns, now committed
        if now > hidden:
            self.buf[:, hidden:now] = self.low
        self.committed, self.band = committed, (0, 0, 0)

    def build(self, cache: StageCache, paths: list[tuple[int, ...]], positions: list[int]) -> torch.Tensor:
        """Additive mask (1, 1, n, len(cache) + n) of a batch of n lattice nodes; a view of the buffer,
        valid until the next ``build``."""
        n, m, committed, window = len(paths), len(cache.slots), cache.committed, self.window
        total = committed + m + n
        if n > self.buf.shape[0] or total > self.buf.shape[1] or committed < self.committed:
            self._reset(n, total, committed)
        else:
            self._advance(committed)
        width = max(len(p) for p in paths)
        host = (
            cache.slots + [p[-1] for p in paths] + [s for p in paths for s in (*p, *(-1,) * (width - len(p)))]
        )
        if window is not None:
            host += positions + cache.positions + positions
        data = to_device(host, self.device)  # one transfer: slots, paths, [query and key positions]
        slots, padded = data[: m + n], data[m + n : m + n + n * width].view(n, width)  # (m + n,), (n, width)
        visible = (padded[:, :, None] == slots).any(dim=1)  # (n, m + n)
        if window is not None:
            query = data[m + n + n * width : m + 2 * n + n * width, None]  # (n, 1)
            visible &= (query - data[m + 2 * n + n * width :]) < window
            hidden = self._hidden(
                committed
            )  # columns [first, stop) may differ per node; outside, the buffer holds
            first = min(hidden, max(0, min(min(positions) - window + 1, committed)))
            stop = max(hidden, min(committed, max(positions) - window + 1))
            if stop > first:
                band = self.buf[:n, first:stop]  # (n, stop - first)
                band.zero_()
                band.masked_fill_(query - torch.arange(first, stop, device=self.device) >= window, self.low)
                self.band = (first, stop, n)
        block = self.buf[:n, committed:total]  # (n, m + n)
        block.fill_(self.low)
        block.masked_fill_(visible, 0)
        return self.buf[None, None, :n, :total]


def causal_mask(start: int, count: int, window: int | None, dtype: torch.dtype, device) -> torch.Tensor:
    """Additive causal mask (1, 1, count, start + count) for committed tokens at start..start+count-1."""
    q = torch.arange(start, start + count, device=device)[:, None]
    k = torch.arange(start + count, device=device)[None, :]
    visible = k <= q
    if window is not None:
        visible &= (q - k) < window
    return _additive(visible, dtype)


class Explorer:
    """Explorer ``index`` of ``count``, running layers [start, stop) of ``view``."""

    def __init__(
        self, view: ModelView, index: int, count: int, start: int, stop: int, adapter=None, head=None
    ):
        self.view = view
        self.index = index
        self.final = index == count - 1
        self.layer_ids = list(range(start, stop))
        self.adapter = None if self.final else adapter
        self.head = None if self.final else head  # a ProposalHead, or None: the full LM head
        self.cache = StageCache(self.layer_ids, view.kv_heads, view.head_dim, view.dtype, view.device)
        self._windows = sorted({view.windows[i] for i in self.layer_ids}, key=lambda w: (w is None, w))
        self._tree_masks = {w: TreeMask(w, view.dtype, view.device) for w in self._windows}
        self._rope_types = {view.rope_types[i] for i in self.layer_ids}

    def reset(self) -> None:
        self.cache.reset()

    def _forward(self, hidden: torch.Tensor, positions: list[int], masks: dict) -> torch.Tensor:
        view = self.view
        pos = to_device([positions], view.device)
        h = hidden[None]  # (1, n, hidden)
        rope = view.rotary(h, pos, self._rope_types)
        for i in self.layer_ids:
            out = view.layers[i](
                h,
                attention_mask=masks[view.windows[i]],
                position_ids=pos,
                position_embeddings=rope[view.rope_types[i]],
                use_cache=True,
                **{view.cache_kwarg: self.cache},
            )
            h = out[0] if isinstance(out, tuple) else out
        return h[0]

    @torch.no_grad()
    def prefill(self, hidden: torch.Tensor) -> torch.Tensor:
        """Run committed prompt tokens (n, hidden) at the next positions; return their outputs."""
        start, n = self.cache.committed, hidden.shape[0]
        masks = {w: causal_mask(start, n, w, self.view.dtype, self.view.device) for w in self._windows}
        out = self._forward(hidden, list(range(start, start + n)), masks)
        self.cache.extend_committed(n)
        return out

    def masks(self, paths: list[tuple[int, ...]], positions: list[int]) -> dict:
        """The tree masks of a batch of lattice nodes, one per attention window of this stage's layers
        (views of this explorer's mask buffers: valid until its next ``masks`` call)."""
        return {w: m.build(self.cache, paths, positions) for w, m in self._tree_masks.items()}

    @torch.no_grad()
    def expand(
        self,
        hidden: torch.Tensor,
        slots: list[int],
        positions: list[int],
        paths: list[tuple[int, ...]],
        masks: dict | None = None,
    ) -> torch.Tensor:
        """Run a batch of lattice nodes (n, hidden) whose input tokens sit at ``positions`` (``masks``:
        ``self.masks(paths, positions)``, when the caller built them already)."""
        masks = self.masks(paths, positions) if masks is None else masks
        out = self._forward(hidden, positions, masks)
        self.cache.extend(slots, positions)
        return out

    @torch.no_grad()
    def propose(self, hidden: torch.Tensor) -> torch.Tensor:
        """Candidate logits at this explorer's depth: (n, vocab), or (n, N) over ``head.ids`` with a light head."""
        if self.adapter is not None:
            hidden = self.adapter(hidden)
        return self.view.head(hidden) if self.head is None else self.head(hidden)
