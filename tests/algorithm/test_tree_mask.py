"""Tree masks built on the device from a table of the batch's rows and the cache's tags equal the masks of the
definition, entry by entry, whatever stale tags lie past the cache's entries; the table's size depends only on the
batch's buckets (rows, path width), never on the lattice."""

import random

import pytest
import torch

from dex_core.device import to_device
from dex_core.model.cache import EMPTY, StageCache
from dex_core.model.explorer import TreeMask
from dex_core.shapes import bucket


def reference(committed, slots, positions, paths, queries, window, rows, capacity):
    """The visibility of the definition, one entry at a time: committed entries are visible, lattice entries when
    their slot is on the node's path; under a window only when query - key < window; padding rows see the
    committed prefix only; columns past the lattice and the batch, nothing."""
    keys = list(range(committed)) + positions + queries
    owners = [None] * committed + slots + [p[-1] for p in paths]
    paths = paths + [()] * (rows - len(paths))
    queries = queries + [queries[0]] * (rows - len(queries))
    return torch.tensor(
        [
            [
                j < len(keys)
                and (j < committed or owners[j] in path)
                and (window is None or q - keys[j] < window)
                for j in range(capacity)
            ]
            for path, q in zip(paths, queries)
        ]
    )


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


@pytest.mark.parametrize("windows", [[None], [5], [1, 12, None]])
@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_masks_from_the_table_equal_the_definition(windows, dtype):
    rng, tree = random.Random(len(windows)), TreeMask(windows, dtype, "cpu")
    cache, committed, low = StageCache([0], kv_heads=1, head_dim=1, dtype=dtype), 3, torch.finfo(dtype).min
    for step in range(150):
        committed += rng.choice([0, 1, 1, 2, 30])  # commits, now and then a long prefill
        cache.committed = committed
        cache.slots, cache.positions, paths, queries = lattice(rng, committed, depth=6)
        if step % 7 == 0:  # a node behind the committed prefix still gets the mask of the definition
            queries[0] = max(0, committed - rng.randint(1, 8))
        rows = bucket(len(paths))
        table = tree.table(cache, rows, [p[-1] for p in paths], paths, queries)
        cache.reserve(committed + tree.region)
        # stale tags everywhere (a slot on some path among them), then the lattice's own after the prefix
        cache.tags.copy_(torch.tensor(rng.choices(cache.slots or [EMPTY], k=2 * cache.capacity)).view(2, -1))
        lattice_at = slice(committed, len(cache))
        cache.tags[:, lattice_at] = torch.tensor([cache.slots, cache.positions], dtype=torch.long)
        batch = tree.rows(to_device(table, "cpu"), rows)
        cache.write_at(batch.at, batch.tags)
        positions, at, masks = batch.positions, batch.at, tree.build(batch, cache.tags)
        assert positions.tolist()[: len(queries)] == queries
        assert at.tolist() == list(range(len(cache), len(cache) + rows))  # the batch goes after every entry
        for w in windows:
            want = reference(committed, cache.slots, cache.positions, paths, queries, w, rows, cache.capacity)
            assert torch.equal(
                masks[w][0, 0], torch.zeros(want.shape, dtype=dtype).masked_fill(~want, low)
            ), f"step {step}, window {w}"
    assert committed > 300 and cache.capacity >= committed


def test_the_table_of_a_batch_has_the_size_of_its_buckets_whatever_the_lattice():
    tree, cache = (
        TreeMask([None], torch.float32, "cpu"),
        StageCache([0], kv_heads=1, head_dim=1, dtype=torch.float32),
    )
    sizes = set()
    for committed, slots, paths in [
        (5, [7, 8], [(7, 9), (10,)]),
        (90, [], [(11,)]),
        (91, [11, 12, 13], [(11, 14)]),
    ]:
        cache.committed, cache.slots, cache.positions = committed, slots, [committed] * len(slots)
        sizes.add(len(tree.table(cache, 2, [p[-1] for p in paths], paths, [committed] * len(paths))))
    assert sizes == {2 * (1 + tree.width + 1) + 2}  # positions, paths, slots a row; committed, length
    cache.slots = list(
        range(200, 240)
    )  # a larger lattice: the region grows to the next bucket and stays there
    tree.table(cache, 2, [9], [(9,)], [91])
    assert tree.region == 64
    cache.slots = []
    tree.table(cache, 2, [9], [(9,)], [91])
    assert tree.region == 64


def test_a_row_sees_the_committed_prefix_its_path_and_itself_never_stale_tags():
    cache = StageCache([0], kv_heads=1, head_dim=2, dtype=torch.float32, capacity=32)
    cache.write_at(torch.arange(2), torch.tensor([[EMPTY, EMPTY], [0, 1]]))
    cache.extend_committed(2)
    cache.write_at(torch.arange(2, 4), torch.tensor([[5, 6], [2, 3]]))
    cache.extend([5, 6], [2, 3])
    # tags a compaction left past the cache's length: slot 5 again, which the new row's path holds
    cache.tags[:, 6:10] = torch.tensor([[5] * 4, [2] * 4])
    tree = TreeMask([None], torch.float32, "cpu")
    # one node (slot 7, on slot 5's branch) and a padding row
    table = tree.table(cache, 2, [7], [(5, 7)], [4])
    assert len(table) == 2 * (tree.width + 2) + 2  # the rows only: nothing of the lattice
    batch = tree.rows(torch.tensor(table), 2)
    cache.write_at(batch.at, batch.tags)
    visible = tree.build(batch, cache.tags)[None][0, 0] == 0  # (rows, capacity)
    assert visible[0].nonzero().flatten().tolist() == [0, 1, 2, 4]
    assert cache.tags[:, 4:6].tolist() == [[7, EMPTY], [4, 4]]  # the padding row's entry: seen by no one


def test_a_cache_capacity_stays_within_a_sixteenth_of_what_it_holds():
    from dex_core.shapes import capacity

    for n in [1, 200, 256, 257, 1000, 4176, 5000, 9000, 70_000, 1_000_000]:
        c = capacity(n)
        assert n <= c <= max(n + 255, n * 17 // 16 + 1), n
    assert len({capacity(n) for n in range(4097, 8193)}) == 16  # 16 sizes an octave, not one per token


def test_the_table_holds_each_part_where_its_layout_says():
    from dex_core.model.explorer import NO_SLOT, TableLayout, TreeMask

    tree = TreeMask([None], torch.float64, "cpu")
    cache = StageCache([0], kv_heads=1, head_dim=2, dtype=torch.float64, capacity=64)
    cache.committed, cache.slots, cache.positions = 30, [7, 8, 9], [30, 31, 31]
    table = tree.table(cache, 4, [8, 9, 11], [(7, 8), (7, 9), (7, 9, 11)], [31, 32, 33])
    at = TableLayout(4, tree.width)
    assert len(table) == at.size
    assert table[at.positions] == [31, 32, 33, 31]  # the padding row repeats the first position
    assert table[at.paths][: tree.width] == [7, 8] + [NO_SLOT] * (tree.width - 2)
    assert table[at.slots] == [8, 9, 11, EMPTY] and (table[at.committed], table[at.length]) == (30, 33)
    rows = tree.rows(torch.tensor(table), 4)
    assert rows.paths[2, :3].tolist() == [7, 9, 11] and rows.at.tolist() == [33, 34, 35, 36]
