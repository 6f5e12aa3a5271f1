"""One depth explorer: the decoder layers of one stage, their tree KV cache, and candidate proposal.

Explorer k owns layers (d_{k-1}, d_k]. Each round it runs a batch of exploration tokens as one
sequence of length n with an explicit additive mask: a node attends to the committed prefix, to the
entries of the slots on its own branch (its prefix inside the lattice) and to itself. Positions go to
the rotary embedding per token. Its output hidden states feed the depth children on explorer k + 1;
its candidates come from hidden -> adapter (non-final depths only) -> final norm -> LM head (at non-final
depths a light head may score only a shortlist of the vocabulary: ``dex_core.proposal``).
"""

from __future__ import annotations

import time

import torch

from .cache import StageCache
from .models import ModelView


def tree_mask(cache: StageCache, paths: list[tuple[int, ...]], positions: list[int],
              window: int | None, dtype: torch.dtype, device) -> torch.Tensor:
    """Additive mask (1, 1, n, len(cache) + n) for a batch of n lattice nodes.

    Entry j is visible to node i if it is committed, or a lattice entry (existing or in this batch)
    whose slot lies on node i's path; with a sliding window, only if position_i - position_j < window.
    """
    n, committed = len(paths), cache.committed
    slots = torch.tensor(cache.slots + [path[-1] for path in paths], dtype=torch.long)  # (m + n,)
    width = max(len(p) for p in paths)
    padded = torch.full((n, width), -1, dtype=torch.long)
    for i, path in enumerate(paths):
        padded[i, : len(path)] = torch.tensor(path)
    visible = (padded[:, :, None] == slots[None, None, :]).any(dim=1)  # (n, m + n)
    visible = torch.cat([torch.ones(n, committed, dtype=torch.bool), visible], dim=1)
    if window is not None:
        key_pos = torch.cat([torch.arange(committed), torch.tensor(cache.positions + positions)])
        visible &= (torch.tensor(positions)[:, None] - key_pos[None, :]) < window
    mask = torch.zeros(visible.shape, dtype=dtype)
    mask.masked_fill_(~visible, torch.finfo(dtype).min)
    return mask[None, None].to(device)


def causal_mask(start: int, count: int, window: int | None, dtype: torch.dtype, device) -> torch.Tensor:
    """Additive causal mask (1, 1, count, start + count) for committed tokens at start..start+count-1."""
    q = torch.arange(start, start + count)[:, None]
    k = torch.arange(start + count)[None, :]
    visible = k <= q
    if window is not None:
        visible &= (q - k) < window
    mask = torch.zeros(visible.shape, dtype=dtype)
    mask.masked_fill_(~visible, torch.finfo(dtype).min)
    return mask[None, None].to(device)


class Explorer:
    """Explorer ``index`` of ``count``, running layers [start, stop) of ``view``."""

    def __init__(self, view: ModelView, index: int, count: int, start: int, stop: int, adapter=None, head=None):
        self.view = view
        self.index = index
        self.final = index == count - 1
        self.layer_ids = list(range(start, stop))
        self.adapter = None if self.final else adapter
        self.head = None if self.final else head  # a ProposalHead, or None: the full LM head
        self.cache = StageCache(self.layer_ids, view.kv_heads, view.head_dim, view.dtype, view.device)
        self._windows = sorted({view.windows[i] for i in self.layer_ids}, key=lambda w: (w is None, w))
        self.mask_seconds = 0.0  # time spent building masks since the last reset

    def reset(self) -> None:
        self.cache.reset()
        self.mask_seconds = 0.0

    def _forward(self, hidden: torch.Tensor, positions: list[int], masks: dict) -> torch.Tensor:
        view = self.view
        pos = torch.tensor([positions], device=view.device)
        h = hidden[None]  # (1, n, hidden)
        rope = view.rotary(h, pos)
        for i in self.layer_ids:
            out = view.layers[i](h, attention_mask=masks[view.windows[i]], position_ids=pos,
                                 position_embeddings=rope, use_cache=True, **{view.cache_kwarg: self.cache})
            h = out[0] if isinstance(out, tuple) else out
        return h[0]

    @torch.no_grad()
    def prefill(self, hidden: torch.Tensor) -> torch.Tensor:
        """Run committed prompt tokens (n, hidden) at the next positions; return their outputs."""
        start, n = self.cache.committed, hidden.shape[0]
        tic = time.perf_counter()
        masks = {w: causal_mask(start, n, w, self.view.dtype, self.view.device) for w in self._windows}
        self.mask_seconds += time.perf_counter() - tic
        out = self._forward(hidden, list(range(start, start + n)), masks)
        self.cache.extend_committed(n)
        return out

    @torch.no_grad()
    def expand(self, hidden: torch.Tensor, slots: list[int], positions: list[int],
               paths: list[tuple[int, ...]]) -> torch.Tensor:
        """Run a batch of lattice nodes (n, hidden) whose input tokens sit at ``positions``."""
        tic = time.perf_counter()
        masks = {w: tree_mask(self.cache, paths, positions, w, self.view.dtype, self.view.device)
                 for w in self._windows}
        self.mask_seconds += time.perf_counter() - tic
        out = self._forward(hidden, positions, masks)
        self.cache.extend(slots, positions)
        return out

    @torch.no_grad()
    def propose(self, hidden: torch.Tensor) -> torch.Tensor:
        """Candidate logits at this explorer's depth: (n, vocab), or (n, N) over ``head.ids`` with a light head."""
        if self.adapter is not None:
            hidden = self.adapter(hidden)
        return self.view.head(hidden) if self.head is None else self.head(hidden)
