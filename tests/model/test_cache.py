"""The per-stage tree KV cache: writes, growth, compaction and commit."""

import torch

from dex_core.model.cache import EMPTY, StageCache


def write(cache, keys, values, layer, tags=None):
    """A batch's keys and values (and ``tags``, (2, q)) written after the cache's entries, as an explorer writes
    them."""
    n, q = len(cache), keys.shape[2]
    cache.settle()  # as an explorer does before its step
    cache.reserve(n + q)
    cache.write_at(torch.arange(n, n + q), tags)
    return cache.update(keys, values, layer)


def filled(n_committed=3, slots=(10, 11, 12, 13), capacity=4):
    cache = StageCache([4, 5], kv_heads=2, head_dim=3, dtype=torch.float64, capacity=capacity)
    total = n_committed + len(slots)
    kv = torch.arange(total, dtype=torch.float64)[None, None, :, None].expand(1, 2, total, 3)
    for layer in (4, 5):
        write(cache, kv[:, :, :n_committed], -kv[:, :, :n_committed], layer)
    cache.extend_committed(n_committed)
    for layer in (4, 5):
        k, v = write(cache, kv[:, :, n_committed:], -kv[:, :, n_committed:], layer)
    cache.extend(list(slots), [7 + i for i in range(len(slots))])
    return cache, k, v


def ids(cache, layer=4):
    cache.settle()
    return cache.keys(layer)[0, 0, : len(cache), 0].long().tolist()


def test_update_returns_every_entry_of_the_capacity_and_grows_to_a_bucket():
    cache, k, v = filled(capacity=2)
    assert k.shape == (1, 2, 256, 3) and cache.capacity == 256  # 7 entries: the least capacity, 256
    assert ids(cache) == list(range(7)) and torch.equal(v, -k)
    assert (k[:, :, 7:] == 0).all()  # never written: zeros, not garbage (attention reads the whole capacity)


def test_commit_moves_the_anchor_entry_and_keeps_only_kept_slots():
    cache, _, _ = filled()
    cache.commit(slot=12, kept_slots={11, 13})
    assert cache.committed == 4 and cache.slots == [11, 13] and cache.positions == [8, 10]
    assert ids(cache) == [0, 1, 2, 5, 4, 6]
    assert ids(cache, layer=5) == [0, 1, 2, 5, 4, 6]
    assert (cache.values(5)[0, 1, :6, 2] == -torch.tensor([0, 1, 2, 5, 4, 6.0])).all()


def test_commits_move_the_entries_on_the_device_when_settled_in_order():
    cache, _, _ = filled()
    cache.commit(slot=10, kept_slots={11, 12, 13})  # a draft chain's commits: two before the next step
    cache.commit(slot=11, kept_slots={13})
    assert cache.committed == 5 and cache.slots == [13]  # the host's bookkeeping at once
    assert cache.keys(4)[0, 0, :6, 0].long().tolist() == list(range(6))  # the device's not yet
    assert ids(cache) == [0, 1, 2, 3, 4, 6] and ids(cache, layer=5) == [0, 1, 2, 3, 4, 6]


def test_keep_leaves_the_unchanged_prefix_in_place():
    cache, _, _ = filled(capacity=32)  # room for a move's bucket: nothing reallocated
    before = cache.keys(4).data_ptr()
    cache.keep([0, 1, 2, 3, 6], committed=4)
    assert ids(cache) == [0, 1, 2, 3, 6] and cache.slots == [13]
    assert cache.keys(4).data_ptr() == before


def test_commit_of_a_slot_without_an_entry_is_an_error():
    cache, _, _ = filled()
    try:
        cache.commit(slot=99, kept_slots=set())
    except RuntimeError as err:
        assert "slot 99" in str(err)
    else:
        raise AssertionError("expected an error")


def entry_ids(cache, layer=5):
    """The value written into each entry of ``layer`` (keys hold +id, values -id), checked to agree."""
    cache.settle()
    keys = cache.keys(layer)[0, 1, : len(cache), 2]
    assert torch.equal(cache.values(layer)[0, 1, : len(cache), 2], -keys)
    return keys.long().tolist()


def grow(cache, ids, slots, positions):
    kv = torch.tensor(ids, dtype=torch.float64)[None, None, :, None].expand(1, 2, len(ids), 3)
    for layer in (4, 5):
        write(cache, kv, -kv, layer, torch.tensor([slots, positions]))
    cache.extend(slots, positions)


def lattice_tags(cache):
    """The device tags (slots, positions) of the cache's lattice entries."""
    cache.settle()
    return cache.tags[:, cache.committed : len(cache)].tolist()


def test_commits_match_a_full_reindex_computed_the_slow_way():
    cache, _, _ = filled(n_committed=40, slots=(), capacity=8)
    ref_ids, ref_slots, ref_positions = list(range(40)), [], []  # the entries as one list, rebuilt every time
    gen, next_id, next_slot = torch.Generator().manual_seed(0), 40, 100
    for step in range(30):
        n = int(torch.randint(1, 6, (1,), generator=gen))
        slots = (
            [next_slot + i for i in range(n)]
            if step % 3
            else ref_slots[:1] + [next_slot + i for i in range(n - 1)]
        )
        slots = list(dict.fromkeys(slots))[:n]
        new_ids = list(range(next_id, next_id + len(slots)))
        grow(cache, new_ids, slots, [1000 + i for i in new_ids])
        ref_ids += new_ids
        ref_slots += slots
        ref_positions += [1000 + i for i in new_ids]
        next_id, next_slot = next_id + len(slots), next_slot + n
        lattice = list(dict.fromkeys(ref_slots))
        slot = lattice[int(torch.randint(0, len(lattice), (1,), generator=gen))]
        if ref_slots.count(slot) != 1:
            continue
        kept = {s for s in lattice if s != slot and torch.rand(1, generator=gen) < 0.5}
        base = len(ref_ids) - len(ref_slots)
        order = (
            list(range(base))
            + [base + i for i, s in enumerate(ref_slots) if s == slot]
            + [base + i for i, s in enumerate(ref_slots) if s in kept]
        )
        ref_slots = [ref_slots[i - base] for i in order[base + 1 :]]
        ref_positions = [ref_positions[i - base] for i in order[base + 1 :]]
        ref_ids = [ref_ids[i] for i in order]
        cache.commit(slot, kept)
        assert entry_ids(cache) == ref_ids and entry_ids(cache, layer=4) == ref_ids
        assert cache.committed == base + 1 and cache.slots == ref_slots and cache.positions == ref_positions
        assert lattice_tags(cache) == [ref_slots, ref_positions]  # the tags moved with their entries
    assert cache.capacity > 8  # the tags grew with the buffer
    assert cache.committed > 45  # the loop committed many times


def test_retain_equals_keep_with_the_whole_index_list():
    for lattice, promote in [
        ([0, 1, 2, 3], 0),
        ([2, 0, 3], 1),
        ([0, 1], 2),
        ([], 0),
        ([3], 1),
        ([1, 3, 0], 0),
    ]:
        fast, _, _ = filled(n_committed=5, capacity=4)
        slow, _, _ = filled(n_committed=5, capacity=4)
        fast.retain(lattice, promote)
        slow.keep(list(range(5)) + [5 + i for i in lattice], 5 + promote)
        assert entry_ids(fast) == entry_ids(slow) == list(range(5)) + [5 + i for i in lattice]
        assert (fast.committed, fast.slots, fast.positions) == (slow.committed, slow.slots, slow.positions)
        assert fast.slots == [10 + i for i in lattice[promote:]]


def test_a_commit_names_only_lattice_entries_however_long_the_context(monkeypatch):
    import dex_core.model.cache as cache_module

    sizes = []
    real = cache_module.to_device
    monkeypatch.setattr(
        cache_module, "to_device", lambda values, device: sizes.append(len(values)) or real(values, device)
    )
    for context in (8, 2048):
        cache, _, _ = filled(n_committed=context, slots=(10, 11, 12, 13), capacity=8)
        cache.commit(slot=11, kept_slots={13})
        assert entry_ids(cache) == list(range(context)) + [context + 1, context + 3]
    assert sizes == [
        32,
        32,
    ]  # the moved entries' bucket (2 -> 16 sources, 16 destinations), whatever the context


def test_a_growing_cache_keeps_its_entries_and_a_static_mark():
    cache, _, _ = filled(capacity=4)
    cache.mark_static()
    before = cache.capacity
    cache.reserve(before + 1)
    assert cache.capacity > before and cache.static and ids(cache) == list(range(7))


def test_a_reset_empties_the_tags_and_a_growth_keeps_them():
    cache = StageCache([4, 5], kv_heads=2, head_dim=3, dtype=torch.float64, capacity=4)
    grow(cache, [0, 1, 2], [7, 8, 9], [20, 21, 22])
    assert lattice_tags(cache) == [[7, 8, 9], [20, 21, 22]]
    cache.reserve(300)
    assert cache.tags.shape == (2, cache.capacity) and lattice_tags(cache) == [[7, 8, 9], [20, 21, 22]]
    cache.reset()
    assert (cache.tags[0] == EMPTY).all()
