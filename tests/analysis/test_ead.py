"""EAD analysis: definitions on scripted rankings, agreement with real DEX runs, the best-set search."""

import itertools

import pytest
import torch

from dex_core import DexDecoder
from dex_core.analysis import best_sets
from dex_core.analysis.best_sets import best_depths, ordered_best
from dex_core.analysis.ead import analyse, layer_matches, matched_stages, scorer, set_cost
from dex_core.model.adapters import new_adapters
from dex_core.model.lens import layer_candidates
from dex_core.testing import tiny_model


def scripted(omega, tokens, others=None):
    """Rankings (T, L, 2) whose top candidate matches exactly where ``omega`` says."""
    omega = torch.tensor(omega, dtype=torch.bool)
    tokens = torch.tensor(tokens)
    wrong = tokens[:, None] + 100 if others is None else torch.tensor(others)
    top = torch.where(omega, tokens[:, None], wrong.expand_as(omega))
    second = torch.where(omega, tokens[:, None] + 200, tokens[:, None])  # the token is always 2nd when missed
    return torch.stack([top, second], dim=2), tokens


def test_ead_and_stable_ead_follow_their_definitions():
    cands, tokens = scripted(
        [
            [0, 0, 0, 1, 1, 1],  # ready at 4
            [1, 0, 1, 1, 0, 1],  # first match 1, stable only at 6
            [1, 1, 1, 1, 1, 1],
        ],
        [5, 6, 7],
    )
    out = analyse(cands, tokens, explorers=[2, 3, 6], decs=False)
    assert out["ead"] == [4, 1, 1] and out["ead_stable"] == [4, 6, 1]
    assert out["oracle"] == 6 * 3 / (4 + 6 + 1)
    by_k = {p["explorers"]: p for p in out["predicted"]}
    assert by_k[2]["depths"] == [3, 6] and by_k[2]["speedup"] == 18 / (6 + 6 + 3)
    assert by_k[6]["speedup"] == out["oracle"]
    # stages [2, 4, 6]: first matches 1, 1, 0; the first token takes K = 3 rounds, then 1 + previous match
    assert by_k[3]["rounds_speedup_no_decs"] == pytest.approx(3 * 3 / (3 + 2 + 2))


def test_decs_lets_a_deeper_stage_match_the_runner_up():
    # both non-final stages rank the same wrong token first and the right one second
    cands, tokens = scripted([[0, 0, 1]], [5], others=[[9, 9, 9]])
    assert matched_stages(cands, tokens, (1, 2, 3), decs=False).tolist() == [2]
    assert matched_stages(cands, tokens, (1, 2, 3), decs=True).tolist() == [1]  # stage 1 skips 9, proposes 5


def test_dex_matches_at_the_predicted_stage_with_and_without_decs():
    model = tiny_model("llama", layers=6, seed=5)
    adapters = new_adapters(model, [2, 4])
    for a in adapters.values():
        a.alpha.data.fill_(0.5)
        a.double().eval()
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    for depths, decs in itertools.product([(2, 4, 6), (1, 2, 3, 4, 5, 6), (3, 6)], [False, True]):
        chosen = {d: a for d, a in adapters.items() if d in depths[:-1]}
        result = DexDecoder(
            model, depths=depths, decs=decs, adapters=chosen, prune="none", draft="none"
        ).generate(prompt, 40)
        cands = layer_candidates(model, prompt, result.tokens, chosen)
        assert result.stats.matched_stages == matched_stages(cands, result.tokens, depths, decs).tolist()
        predicted = set_cost(cands, result.tokens, depths, decs)
        assert predicted["rounds_per_token"] * len(result.tokens) == pytest.approx(result.stats.rounds)
        if not decs:
            omega = layer_matches(model, prompt, result.tokens, chosen)
            assert result.stats.matched_stages == omega[:, [d - 1 for d in depths]].float().argmax(1).tolist()


def _ranked(seed: int, T: int, L: int):
    """Random rankings where each token becomes every layer's top candidate from a random depth on."""
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, 50, (T,), generator=gen)
    cands = torch.randint(0, 50, (T, L, 4), generator=gen)
    ready = torch.randint(1, L + 1, (T,), generator=gen)  # layers >= ready rank the token first
    for layer in range(L):
        cands[:, layer, 0] = torch.where(layer + 1 >= ready, tokens, cands[:, layer, 0])
    return cands, tokens


def test_best_exploration_set_is_the_cheapest_under_rounds_times_longest_stage():
    L = 6
    cands, tokens = _ranked(0, 60, L)
    score, key = scorer(cands, tokens)
    for K in (2, 3):
        best = best_depths(score, L, K, key)
        every = [
            set_cost(cands, tokens, c + (L,))["layer_times_per_token"]
            for c in itertools.combinations(range(1, L), K - 1)
        ]
        assert best["layer_times_per_token"] == min(every)
        assert best["depths"][-1] == L and len(best["depths"]) == K
    out = analyse(cands, tokens, explorers=[2, 3], best=True, tolerance=-1)
    assert all(p["best_gain"] >= 1.0 for p in out["predicted"])


def test_the_best_sets_are_the_cheapest_chain_in_which_no_k_is_slower_than_the_previous(monkeypatch):
    L, ks, tol = 10, [2, 3, 4, 5], best_sets.ORDER_TOLERANCE
    cands, tokens = _ranked(0, 80, L)
    score, key = scorer(cands, tokens)
    free = ordered_best(score, L, ks, key, tolerance=-1)
    assert free[5]["depth_speedup"] < free[4]["depth_speedup"] - 0.1  # the cheapest K = 5 set is slower
    ordered = {p["explorers"]: p["best"] for p in analyse(cands, tokens, ks, best=True)["predicted"]}
    every = {K: [score(c + (L,)) for c in itertools.combinations(range(1, L), K - 1)] for K in ks}
    chains = {
        (tuple(r["depths"]),): (r[key], r["depth_speedup"]) for r in every[2]
    }  # every chain, by brute force
    for K in ks[1:]:
        chains = {
            path + (tuple(r["depths"]),): (total + r[key], r["depth_speedup"])
            for path, (total, speed) in chains.items()
            for r in every[K]
            if r["depth_speedup"] >= speed - tol
        }
        assert (
            ordered[K]["floor_met"] and ordered[K]["depth_speedup"] >= ordered[K - 1]["depth_speedup"] - tol
        )
    assert sum(ordered[K][key] for K in ks) == pytest.approx(min(t for t, _ in chains.values()))
    assert any(ordered[K]["depths"] != free[K]["depths"] for K in ks)  # the free sets break the order
    monkeypatch.setattr(best_sets, "EXHAUSTIVE_LIMIT", 1)  # the local search keeps the order too
    local = ordered_best(score, L, ks, key)
    for K in ks[1:]:
        assert local[K]["floor_met"] and local[K]["depth_speedup"] >= local[K - 1]["depth_speedup"] - tol
    assert sum(local[K][key] for K in ks) >= sum(ordered[K][key] for K in ks) - 1e-9


def test_the_local_search_for_a_best_set_keeps_every_inner_depth_within_the_adapters(monkeypatch):
    L = 12
    cands, tokens = _ranked(1, 80, L)
    score, key = scorer(cands, tokens)
    within = [2, 3, 5, 7, 8, 10]  # the uniform K = 4 split (3, 6, 9) has 6 and 9 outside it
    monkeypatch.setattr(
        best_sets, "EXHAUSTIVE_LIMIT", 1
    )  # C(6, 3) = 20 sets: the local search, not every set
    best = best_depths(score, L, 4, key, within=within)
    assert set(best["depths"][:-1]) <= set(within) and best["depths"][-1] == L
    every = [
        set_cost(cands, tokens, c + (L,))["layer_times_per_token"] for c in itertools.combinations(within, 3)
    ]
    start = best_sets._start(L, 4, within)  # the uniform split moved onto the adapters' depths
    assert start == (3, 5, 8, 12) and best_sets._start(30, 4, [9, 18, 27]) == (9, 18, 27, 30)
    assert (
        best["layer_times_per_token"] == min(every) < set_cost(cands, tokens, start)["layer_times_per_token"]
    )
