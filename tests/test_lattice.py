"""The lattice and its FSM as pure bookkeeping, driven by scripted candidates (no model)."""

import pytest

from dex_core.algorithm.lattice import Lattice


def truth(position: int) -> int:
    """The token every correct prefix continues with at ``position``."""
    return 1000 + position


def run(K: int, tokens: int, guess, start: int = 10):
    """Drive a lattice; ``guess(node, on_track)`` gives non-final candidates. Returns (lattice, commits, rounds)."""
    lat = Lattice(K, truth(start - 1), start)
    commits, rounds_at = [], []
    while len(commits) < tokens:
        plan = lat.plan_round()
        chosen = {}
        for batch in plan.batches:
            for node in batch:
                on_track = _on_track(lat, node)
                final = node.stage == K - 1
                chosen[node.id] = truth(node.position) if final and on_track else guess(node, on_track)
        lat.insert(chosen)
        if lat.ready():
            commits.append(commit(lat)[0])
            rounds_at.append(lat.rounds)
    return lat, commits, rounds_at


def commit(lat: Lattice):
    """Validate and commit, then collapse: (Commit, Collapse)."""
    done = lat.validate_and_commit()
    return done, lat.collapse(done)


def _on_track(lat: Lattice, node) -> bool:
    """Whether the node's prefix agrees with the truth (its slot's input tokens all true)."""
    slot = lat.slots[node.slot]
    while slot is not None:
        if slot.input_token != truth(slot.position - 1):
            return False
        slot = lat.slots.get(slot.parent) if slot.parent is not None else None
    return True


def always_right(node, on_track):
    return truth(node.position) if on_track else -1


def always_wrong(node, on_track):
    return -2 - node.stage  # never the truth


@pytest.mark.parametrize("K", [2, 3, 4, 6])
def test_state_q_holds_two_to_the_q_minus_one_nodes(K):
    lat = Lattice(K, 7, 3)
    for q in range(1, K + 1):
        plan = lat.plan_round()
        assert plan.state_before == q - 1
        lat.insert({n.id: 100 + n.id for b in plan.batches for n in b})
        assert lat.state == q
        assert len(lat.nodes) == 2**q - 1
        assert sum(len(b) for b in plan.batches) == 2 ** (q - 1)


@pytest.mark.parametrize("K", [2, 3, 4])
def test_collapse_keeps_only_the_matched_subtree(K):
    for k in range(K):
        lat = Lattice(K, 7, 3)
        for _ in range(K):
            plan = lat.plan_round()
            chosen = {}
            for b in plan.batches:
                for n in b:  # anchor candidates: match first at stage k; others distinct
                    anchor = n.slot == lat.anchor
                    chosen[n.id] = 42 if anchor and n.stage >= k else 500 + n.id
            lat.insert(chosen)
        anchor_slot = lat.anchor
        before = dict(lat.nodes)
        plan, kept = commit(lat)
        assert plan.token == 42 and plan.matched_stage == k
        if k == K - 1:
            assert kept.kept == [] and plan.next_anchor is None and lat.state == 0
            continue
        root = before[before[plan.anchor_nodes[k]].position_child]
        expected = set()
        frontier = [root.id]
        while frontier:  # all lattice descendants of the matched position child
            nid = frontier.pop()
            expected.add(nid)
            frontier += [m.id for m in before.values() if m.parent == nid and m.slot != anchor_slot]
        assert set(kept.kept) == expected == set(lat.nodes)
        assert set(kept.dropped) | set(kept.kept) | set(plan.anchor_nodes) == set(before)
        assert lat.state == K - 1 - k and len(kept.kept) == 2 ** (K - 1 - k) - 1
        assert all(lat.slots[s].path[0] == root.slot for s in kept.kept_slots)


@pytest.mark.parametrize("K", [2, 3, 4])
def test_token_matched_at_stage_k_costs_k_plus_one_rounds(K):
    for k in range(K):

        def guess(node, on_track, k=k):
            return truth(node.position) if on_track and node.stage >= k else -7 - node.stage

        _, commits, rounds_at = run(K, 12, guess)
        gaps = [b - a for a, b in zip(rounds_at, rounds_at[1:])]
        assert all(c.matched_stage == k for c in commits)
        assert rounds_at[0] == K  # the first token always needs the full anchor chain
        assert gaps == [k + 1] * len(gaps)


@pytest.mark.parametrize("K", [2, 3, 4, 8])
def test_always_right_at_stage_zero_costs_one_round_per_token(K):
    _, commits, rounds_at = run(K, 20, always_right)
    assert [c.token for c in commits] == [truth(p) for p in range(10, 30)]
    assert all(b - a == 1 for a, b in zip(rounds_at, rounds_at[1:]))


@pytest.mark.parametrize("K", [1, 2, 3, 4])
def test_always_wrong_costs_K_rounds_per_token(K):
    lat, commits, rounds_at = run(K, 10, always_wrong)
    assert [c.token for c in commits] == [truth(p) for p in range(10, 20)]
    assert rounds_at == [K * (i + 1) for i in range(10)]
    assert all(c.matched_stage == K - 1 for c in commits)


def test_commit_before_the_anchor_is_complete_is_refused():
    lat = Lattice(3, 1, 1)
    lat.plan_round()  # round 1: the root (node 0) at stage 0
    with pytest.raises(ValueError, match=r"^no candidate recorded for nodes \[0\]$"):
        lat.insert({})
    with pytest.raises(
        RuntimeError, match=r"^cannot commit in state 1 of 3$"
    ):  # q=1: one of the 3 rounds the anchor needs
        lat.validate_and_commit()


def test_pruning_starts_the_most_probable_branches_and_never_stops_a_slot():
    lat = Lattice(3, 7, 10)
    lat.insert({n.id: 1 for b in lat.plan_round().batches for n in b}, None)
    plan = lat.plan_round()  # the root's depth child and position child
    (branch,), (deeper,), _ = plan.batches
    lat.insert({branch.id: 2, deeper.id: 2}, {branch.id: 0.2, deeper.id: 0.9})
    plan = lat.plan_round(prune=1)
    assert [n.parent for n in plan.batches[0]] == [deeper.id] and plan.pruned == [
        branch.id
    ]  # the 0.9 candidate's
    assert [len(b) for b in plan.batches] == [1, 1, 1]  # depth children are never pruned


@pytest.mark.parametrize("options", [{}, {"temperature": 0.9, "seed": 3}], ids=["greedy", "sampled"])
def test_pruned_runs_are_exact_and_mark_what_they_pruned(options):
    """At a bound of 2 new branches a round; the golden traces hold a bound of 1 (K = 2, 3, 4, greedy and sampled)."""
    from dex_core import DexDecoder, ar_generate
    from dex_core.testing import tiny_model

    model, prune = tiny_model("llama").double(), 2
    result = DexDecoder(model, explorers=4, prune=prune).generate([4, 9, 1, 30], 30, **options)
    assert result.tokens == ar_generate(model, [4, 9, 1, 30], 30, **options).tokens
    rounds = [e for e in result.trace if e["event"] == "round"]
    kinds = {n["id"]: n["kind"] for e in rounds for n in e["nodes"]}
    started = [
        [i for i in e["batches"][0] if kinds[i] != "chain"] for e in rounds
    ]  # draft chains are bounded apart
    assert max(map(len, started)) <= prune + 1  # new branches (+ a root after a miss)
    assert sum(len(e["pruned"]) for e in rounds) > 0
    computed = {n["id"] for e in rounds for n in e["nodes"]}
    assert all(set(e["pruned"]) <= computed for e in rounds)


def test_auto_pruning_is_one_branch_on_cpu_off_on_accelerators_and_recorded_in_the_trace():
    from dex_core import DexDecoder
    from dex_core.runtime.settings import resolve_prune
    from dex_core.testing import tiny_model

    assert resolve_prune("auto", ["cpu", "cpu"]) == 1
    assert (
        resolve_prune("auto", ["cuda:0", "cuda:1"]) is None
        and resolve_prune("auto", ["cpu", "cuda:1"]) is None
    )
    assert resolve_prune(2, ["cuda:0"]) == 2 and resolve_prune(None, ["cpu"]) is None
    model = tiny_model("llama").double()
    auto, off = DexDecoder(model, explorers=4), DexDecoder(model, explorers=4, prune="none")
    assert (auto.prune, off.prune) == (1, None)
    start = auto.generate([4, 9, 1, 30], 12).trace[0]
    assert start["prune"] == 1 and "prune" not in off.generate([4, 9, 1, 30], 12).trace[0]
