"""Tree masks built incrementally (committed part kept between rounds) equal masks built from scratch."""

import random

import pytest
import torch

from dex_core.model.cache import StageCache
from dex_core.model.explorer import TreeMask


def reference(committed, slots, positions, paths, queries, window, dtype):
    """The mask of the definition, one entry at a time: committed entries are visible, lattice entries
    when their slot is on the node's path; under a window only when query - key < window."""
    keys = list(range(committed)) + positions + queries
    owners = [None] * committed + slots + [p[-1] for p in paths]
    low = torch.finfo(dtype).min
    rows = [
        [
            0.0 if (j < committed or owners[j] in path) and (window is None or q - keys[j] < window) else low
            for j in range(len(keys))
        ]
        for path, q in zip(paths, queries)
    ]
    return torch.tensor(rows, dtype=dtype)[None, None]


def lattice(rng, committed, depth):
    """A random lattice over the committed prefix: slot ids, their positions and a batch of paths."""
    slots = rng.sample(range(100, 200), rng.randint(0, 12))
    positions = [committed + rng.randint(0, depth) for _ in slots]
    paths, queries = [], []
    for i in range(rng.randint(1, 6)):
        path = tuple(rng.sample(slots, rng.randint(0, min(3, len(slots))))) + (300 + i,)
        paths.append(path)
        queries.append(committed + rng.randint(0, depth))
    return slots, positions, paths, queries


@pytest.mark.parametrize("window", [None, 1, 5, 12, 40])
@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_incremental_masks_equal_masks_built_from_scratch(window, dtype):
    rng, masks, committed, longest = random.Random(window or 0), TreeMask(window, dtype, "cpu"), 3, 0
    cache = StageCache([0], kv_heads=1, head_dim=1, dtype=dtype)
    for step in range(400):
        if step % 100 == 99:
            committed = rng.randint(0, 20)  # a new request after a reset
        elif rng.random() < 0.6:
            committed += rng.choice([1, 1, 1, 2, 30])  # commits, now and then a long prefill
        cache.committed, longest = committed, max(longest, committed)
        cache.slots, cache.positions, paths, queries = lattice(rng, committed, depth=6)
        if step % 7 == 0:  # a node behind the committed prefix still gets the mask of the definition
            queries[0] = max(0, committed - rng.randint(1, 8))
        mask = masks.build(cache, paths, queries)
        want = reference(committed, cache.slots, cache.positions, paths, queries, window, dtype)
        assert mask.shape == want.shape and torch.equal(mask, want), f"step {step}"
    assert longest > 300 and torch.isfinite(mask).all()


def test_a_round_writes_only_lattice_columns_when_nothing_was_committed():
    cache = StageCache([0], kv_heads=1, head_dim=1, dtype=torch.float32)
    cache.committed, cache.slots, cache.positions = 2000, [7], [2000]
    masks = TreeMask(None, torch.float32, "cpu")
    first = masks.build(cache, [(7, 8)], [2001])
    masks.buf[:, :2000] = 1.0  # a rebuild of the committed part would overwrite this marker
    again = masks.build(cache, [(7, 9), (10,)], [2001, 2001])
    low = torch.finfo(torch.float32).min
    assert again.data_ptr() == first.data_ptr() and (again[0, 0, :, :2000] == 1.0).all()
    assert again[0, 0, :, 2000:].tolist() == [[0.0, 0.0, low], [low, low, 0.0]]
