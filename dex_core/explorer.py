"""One depth explorer: the decoder layers of one stage, their tree KV cache, and candidate proposal.

Explorer k owns layers (d_{k-1}, d_k]. Each round it runs a batch of exploration tokens as one
sequence of length n with an explicit additive mask: a node attends to the committed prefix, to the
entries of the slots on its own branch (its prefix inside the lattice) and to itself. Positions go to
the rotary embedding per token. Its output hidden states feed the depth children on explorer k + 1;
its candidates come from hidden -> adapter (non-final depths only) -> final norm -> LM head (at non-final
depths a light head may score only a shortlist of the vocabulary: ``dex_core.proposal``).
"""

from __future__ import annotations

import torch

from .cache import StageCache
from .device import to_device
from .models import ModelView


def _additive(visible: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A boolean visibility matrix (q, k) -> the additive mask (1, 1, q, k): 0 where visible, else the
    dtype's most negative finite value (finite, so a bfloat16/float16 score plus the mask never makes NaN)."""
    mask = torch.zeros(visible.shape, dtype=dtype, device=visible.device)
    return mask.masked_fill_(~visible, torch.finfo(dtype).min)[None, None]


def tree_mask(cache: StageCache, paths: list[tuple[int, ...]], positions: list[int],
              window: int | None, dtype: torch.dtype, device) -> torch.Tensor:
    """Additive mask (1, 1, n, len(cache) + n) for a batch of n lattice nodes, built on ``device``.

    Entry j is visible to node i if it is committed, or a lattice entry (existing or in this batch)
    whose slot lies on node i's path; with a sliding window, only if position_i - position_j < window.
    """
    n, committed = len(paths), cache.committed
    width = max(len(p) for p in paths)
    slots = to_device(cache.slots + [path[-1] for path in paths], device)  # (m + n,)
    padded = to_device([list(p) + [-1] * (width - len(p)) for p in paths], device)  # (n, width)
    visible = (padded[:, :, None] == slots[None, None, :]).any(dim=1)  # (n, m + n)
    visible = torch.cat([torch.ones(n, committed, dtype=torch.bool, device=device), visible], dim=1)
    if window is not None:
        key_pos = torch.cat([torch.arange(committed, device=device), to_device(cache.positions + positions, device)])
        visible &= (to_device(positions, device)[:, None] - key_pos[None, :]) < window
    return _additive(visible, dtype)


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

    def __init__(self, view: ModelView, index: int, count: int, start: int, stop: int, adapter=None, head=None):
        self.view = view
        self.index = index
        self.final = index == count - 1
        self.layer_ids = list(range(start, stop))
        self.adapter = None if self.final else adapter
        self.head = None if self.final else head  # a ProposalHead, or None: the full LM head
        self.cache = StageCache(self.layer_ids, view.kv_heads, view.head_dim, view.dtype, view.device)
        self._windows = sorted({view.windows[i] for i in self.layer_ids}, key=lambda w: (w is None, w))

    def reset(self) -> None:
        self.cache.reset()

    def _forward(self, hidden: torch.Tensor, positions: list[int], masks: dict) -> torch.Tensor:
        view = self.view
        pos = to_device([positions], view.device)
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
        masks = {w: causal_mask(start, n, w, self.view.dtype, self.view.device) for w in self._windows}
        out = self._forward(hidden, list(range(start, start + n)), masks)
        self.cache.extend_committed(n)
        return out

    def masks(self, paths: list[tuple[int, ...]], positions: list[int]) -> dict:
        """The tree masks of a batch of lattice nodes, one per attention window of this stage's layers."""
        return {w: tree_mask(self.cache, paths, positions, w, self.view.dtype, self.view.device)
                for w in self._windows}

    @torch.no_grad()
    def expand(self, hidden: torch.Tensor, slots: list[int], positions: list[int],
               paths: list[tuple[int, ...]], masks: dict | None = None) -> torch.Tensor:
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
