"""The per-stage tree KV cache: writes, growth, compaction and commit."""

import torch

from dex_core.cache import StageCache


def filled(n_committed=3, slots=(10, 11, 12, 13), capacity=4):
    cache = StageCache([4, 5], kv_heads=2, head_dim=3, dtype=torch.float64, capacity=capacity)
    total = n_committed + len(slots)
    kv = torch.arange(total, dtype=torch.float64)[None, None, :, None].expand(1, 2, total, 3)
    for layer in (4, 5):
        cache.update(kv[:, :, :n_committed], -kv[:, :, :n_committed], layer)
    cache.extend_committed(n_committed)
    for layer in (4, 5):
        k, v = cache.update(kv[:, :, n_committed:], -kv[:, :, n_committed:], layer)
    cache.extend(list(slots), [7 + i for i in range(len(slots))])
    return cache, k, v


def ids(cache, layer=4):
    return cache._keys[layer][0, 0, : len(cache), 0].long().tolist()


def test_update_returns_all_entries_and_grows_past_capacity():
    cache, k, v = filled(capacity=2)
    assert k.shape == (1, 2, 7, 3) and cache.capacity >= 7
    assert ids(cache) == list(range(7)) and torch.equal(v, -k)


def test_commit_moves_the_anchor_entry_and_keeps_only_kept_slots():
    cache, _, _ = filled()
    cache.commit(slot=12, kept_slots={11, 13})
    assert cache.committed == 4 and cache.slots == [11, 13] and cache.positions == [8, 10]
    assert ids(cache) == [0, 1, 2, 5, 4, 6]
    assert ids(cache, layer=5) == [0, 1, 2, 5, 4, 6]
    assert (cache._values[5][0, 1, :6, 2] == -torch.tensor([0, 1, 2, 5, 4, 6.0])).all()


def test_keep_leaves_the_unchanged_prefix_in_place():
    cache, _, _ = filled()
    before = cache._keys[4].data_ptr()
    cache.keep([0, 1, 2, 3, 6], committed=4)
    assert ids(cache) == [0, 1, 2, 3, 6] and cache.slots == [13]
    assert cache._keys[4].data_ptr() == before


def test_commit_of_a_slot_without_an_entry_is_an_error():
    cache, _, _ = filled()
    try:
        cache.commit(slot=99, kept_slots=set())
    except RuntimeError as err:
        assert "slot 99" in str(err)
    else:
        raise AssertionError("expected an error")
