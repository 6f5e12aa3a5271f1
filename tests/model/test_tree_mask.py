"""The tree masks of a batch: built from a table of the batch's rows and the cache's tags on the device."""

import torch

from dex_core.model.cache import EMPTY, StageCache
from dex_core.model.explorer import TreeMask


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
