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


def test_the_row_budget_keeps_the_branches_most_likely_reused_and_never_stops_a_slot():
    lat = Lattice(3, 7, 10)
    (root,), _, _ = lat.plan_round().batches
    lat.insert({root.id: 1}, {root.id: 0.1})  # an unlikely candidate: its branch is reused with 0.1
    plan = lat.plan_round()  # the root's depth child, and the branch its candidate started
    (branch,), (deeper,), _ = plan.batches
    lat.insert({branch.id: 2, deeper.id: 3}, {branch.id: 0.9, deeper.id: 0.5})
    plan = lat.plan_round(budget=1)
    # the branch's own candidate is likelier (0.9 > 0.5), but its path is not: 0.1 x 0.9 against 1 x 0.5
    assert [n.parent for n in plan.batches[0]] == [deeper.id] and plan.pruned == [branch.id]
    assert [len(b) for b in plan.batches] == [1, 1, 1]  # depth children are never trimmed
    assert lat.slots[plan.batches[0][0].slot].score == pytest.approx(0.5)
    assert lat.nodes[branch.id].position_child is None and branch.id in lat.nodes


def test_a_branch_twin_of_a_shallower_stages_scores_zero_and_goes_first():
    lat = Lattice(4, 7, 10)
    (root,), *_ = lat.plan_round().batches
    lat.insert({root.id: 5}, {root.id: 0.3})
    (branch,), (deeper,), *_ = lat.plan_round().batches
    lat.insert({branch.id: 6, deeper.id: 5}, {branch.id: 0.2, deeper.id: 0.9})  # stage 1 proposes 5 again
    plan = lat.plan_round(budget=1)
    # the twin of the branch stage 0 started with 5 is never reused (first_match picks stage 0): it goes,
    # although its candidate is the likeliest; the branch's own child (0.3 x 0.2) stays
    assert plan.pruned == [deeper.id] and [n.parent for n in plan.batches[0]] == [branch.id]


def two_branches(K: int):
    """A lattice after two rounds: the root's candidate 5 (p 0.5), then its branch's 6 (p 0.8) and the root's stage-1
    candidate 8 (p 0.5); returns (lattice, the branch's node, the root's stage-1 node)."""
    lat = Lattice(K, 7, 10)
    (root,), *_ = lat.plan_round().batches
    lat.insert({root.id: 5}, {root.id: 0.5})
    (branch,), (deeper,), *_ = lat.plan_round().batches
    lat.insert({branch.id: 6, deeper.id: 8}, {branch.id: 0.8, deeper.id: 0.5})
    return lat, branch, deeper


def test_a_row_is_worth_its_chance_of_reuse_times_the_rounds_its_reuse_saves():
    lat, branch, deeper = two_branches(4)
    plan = lat.plan_round(budget=1)
    # the stage-1 branch is likelier (0.5 against 0.5 x 0.8), but reused it saves 2 rounds, the branch's own 3:
    # 1.0 against 1.2, so the deeper branch goes
    assert plan.pruned == [deeper.id] and [n.parent for n in plan.batches[0]] == [branch.id]
    (kept,) = plan.batches[0]
    assert lat.worth(kept) == pytest.approx(0.4 * 3) and lat.rank(kept)[1] == pytest.approx(-1.2)


def test_a_branch_the_budget_left_out_competes_again_worth_the_rounds_it_would_still_save():
    lat, branch, deeper = two_branches(5)
    plan = lat.plan_round(budget=1)  # the stage-1 branch, 0.5 x 3 against 0.4 x 4, waits
    assert plan.pruned == [deeper.id] and lat.waiting == [deeper.id]
    (child,), (branch_1,), (root_2,), *_ = plan.batches
    lat.insert({child.id: 2, branch_1.id: 3, root_2.id: 9}, {child.id: 0.1, branch_1.id: 0.1, root_2.id: 0.3})
    plan = lat.plan_round(budget=2)
    # a round late it is a stage behind: it saves 4 - 1 - 1 = 2 rounds, worth 0.5 x 2, the most of the rows new
    # this round (the root's stage-2 branch 0.3 x 2; the others 0.4 x 0.1 x 4 and 0.5 x 0.1 x 3)
    started = {n.parent: n for n in plan.batches[0]}
    assert sorted(started) == sorted([deeper.id, root_2.id])
    late = started[deeper.id]
    assert late.kind == "position" and late.round == deeper.round + 2
    assert lat.worth(late) == pytest.approx(0.5 * 2) and lat.nodes[deeper.id].position_child == late.id
    assert sorted(plan.pruned) == sorted([child.id, branch_1.id]) and lat.waiting == plan.pruned
    lat.insert(
        {n.id: 40 + n.id for b in plan.batches for n in b}, {n.id: 0.9 for b in plan.batches for n in b}
    )
    plan = lat.plan_round()
    # the two left out start a second round late, each worth a round less: 0.4 x 0.1 x 3 and 0.5 x 0.1 x 2
    late = {n.parent: lat.worth(n) for n in plan.batches[0] if n.parent in (child.id, branch_1.id)}
    assert late == {child.id: pytest.approx(0.12), branch_1.id: pytest.approx(0.1)}


@pytest.mark.parametrize("options", [{}, {"temperature": 0.9, "seed": 3}], ids=["greedy", "sampled"])
def test_runs_on_a_row_budget_are_exact_and_no_stage_runs_more_rows(llama, options):
    """At a budget of 2 rows a stage, draft chains on (their rows within it); the golden traces hold a budget of 1
    (K = 2, 3, 4, greedy and sampled)."""
    from dex_core import DexDecoder, ar_generate
    from dex_core.trace.events import RoundEvent

    model, budget = llama, 2
    prompt = [4, 9, 1, 30, 4, 9, 1, 30, 4, 9]  # it repeats: draft chains find drafts
    result = DexDecoder(model, explorers=4, prune=budget).generate(prompt, 30, **options)
    assert result.tokens == ar_generate(model, prompt, 30, **options).tokens
    rounds = [e for e in result.trace if isinstance(e, RoundEvent)]
    assert max(len(b) for e in rounds for b in e.batches) == budget  # full, and never over
    kinds = {n.id: n.kind for e in rounds for n in e.nodes}
    assert "chain" in kinds.values() and sum(len(e.pruned) for e in rounds) > 0
    computed = {n.id for e in rounds for n in e.nodes}
    assert all(set(e.pruned) <= computed for e in rounds)


def test_the_auto_budget_is_the_devices_and_recorded_in_the_trace(llama):
    from dex_core import DexDecoder
    from dex_core.runtime.settings import AUTO_ROWS, resolve_prune

    assert resolve_prune("auto", ["cpu", "cpu"]) == AUTO_ROWS["cpu"] == 8
    assert resolve_prune("auto", ["cuda:0", "cuda:1"]) == resolve_prune("auto", ["cpu", "cuda:1"]) == 64
    assert resolve_prune(4, ["cuda:0"]) == 4 and resolve_prune(None, ["cpu"]) is None
    model = llama
    auto, off = DexDecoder(model, explorers=4), DexDecoder(model, explorers=4, prune="none")
    assert (auto.prune, off.prune) == (8, None)
    start, off_start = auto.generate([4, 9, 1, 30], 12).trace[0], off.generate([4, 9, 1, 30], 12).trace[0]
    assert start.prune == 8 and off_start.prune is None and "prune" not in off_start.record()
