"""The best exploration set of each K: the cheapest one, never slower depth-side than the K before it.

``best_depths`` finds the set of K stages with the lowest cost per token (``ModelCost.dex_steady``, every
head and adapter counted) or, without a cost model, the lowest R(X) * longest stage — exhaustively when
there are at most ``EXHAUSTIVE_LIMIT`` sets, else by a local search that moves one boundary at a time.

The cheapest set of K + 1 stages may explore fewer good depths than the cheapest of K: on the default model
the cheapest K = 5 set runs through all three long-trained adapters (depth-side 1.93x) while no K = 6 set
through all three avoids a 9-layer non-final stage, so the cost bound picked the uniform K = 6 split (1.67x)
and a user with one more device got a slower decoder. ``ordered_best`` therefore chooses the sets of all K
together: the chain of sets (one per K, in increasing K) of the least summed cost in which each K's set is at
least as fast depth-side as the previous K's minus ``ORDER_TOLERANCE`` (0: the sets are chosen on the tune
split, and held-out prompts then move each K's speed by a little: chosen with a tolerance of 0.02, the
default model's K = 8 set fell 0.03 below K = 7's on the eval split). Taking each K's cheapest set that meets
the previous one's speed would be greedy: a fast K = 6 set raises the bar for K = 7 and 8, whose sets then
cost more than they need. Any set plus one depth keeps the order (paper Prop. 7: X within X' gives
S_X <= S_X'), so those sets start the local search of the larger K; a set that breaks it is taken only
when no chain keeps it, marked ``floor_met: false``.
"""

from __future__ import annotations

import bisect
import itertools
import math

from ..config import DexError, resolve_depths

EXHAUSTIVE_LIMIT = 5000  # exploration sets searched exhaustively up to this many, else local search
ORDER_TOLERANCE = 0.0  # how much slower depth-side a K's set may be than the previous K's, where chosen
CHAINS = 24  # the cheapest chains whose sets, plus one depth, start the local search of the next K
PENALTY = 1e9  # the cost added to a chain that breaks the order (taken only when no chain keeps it)


def best_depths(score, L: int, explorers: int, key: str, within=None, starts=(), seen=None) -> dict:
    """The set of ``explorers`` stages (last depth ``L``) minimising ``score(depths)[key]``; with ``within``,
    only sets whose non-final depths lie in it. ``score`` is ``set_cost`` with its data bound; ``starts``: more
    sets the local search starts from; ``seen``: a dict that collects every set scored (depths -> result)."""
    if not 1 <= explorers <= L or (within is not None and explorers - 1 > len(within)):
        raise DexError(
            f"explorers must lie in 1..{L if within is None else len(within) + 1}; got {explorers}"
        )
    pool = sorted(within) if within is not None else list(range(1, L))
    seen = {} if seen is None else seen

    def scored(depths) -> dict:
        depths = tuple(depths)
        if depths not in seen:
            seen[depths] = score(depths)
        return seen[depths]

    if math.comb(len(pool), explorers - 1) <= EXHAUSTIVE_LIMIT:
        sets = (tuple(c) + (L,) for c in itertools.combinations(pool, explorers - 1))
        return min(map(scored, sets), key=lambda r: (r[key], r["depths"]))
    found = [_descend(scored, _start(L, explorers, pool), pool, key)]
    found += [_descend(scored, start, pool, key) for start in starts if set(start[:-1]) <= set(pool)]
    return min(found, key=lambda r: (r[key], r["depths"]))


def _descend(scored, start, pool, key: str) -> dict:
    """Local search from ``start``: move one boundary at a time (to a depth of ``pool``) while that is cheaper."""
    best, improved = scored(start), True
    while improved:
        improved = False
        for i in range(len(start) - 1):
            for step in (-3, -2, -1, 1, 2, 3):
                depths, j = list(best["depths"]), pool.index(best["depths"][i]) + step
                if not 0 <= j < len(pool) or not (depths[i - 1] if i else 0) < pool[j] < depths[i + 1]:
                    continue
                depths[i] = pool[j]
                trial = scored(depths)
                if (trial[key], trial["depths"]) < (best[key], best["depths"]):
                    best, improved = trial, True
    return best


def ordered_best(
    score, L: int, ks, key: str, within=None, tolerance: float = ORDER_TOLERANCE, chains: int = CHAINS
) -> dict:
    """``{K: best set}`` for the values ``ks``: the chain of sets, one per K, of the least summed cost in which
    each K's set is at least as fast depth-side as the previous K's minus ``tolerance`` (a negative tolerance:
    each K's cheapest set alone). Every set scored for a K competes (all of them where the search is exhaustive);
    the local search of larger K also starts from the ``chains`` cheapest chains' sets plus one depth."""
    ks = sorted(ks)
    if tolerance < 0:
        return {K: best_depths(score, L, K, key, _inside(within, K)) for K in ks}
    states: list[dict] = []  # per K: depths -> (summed cost of the cheapest chain to it, previous depths)
    sets: list[dict] = []
    for K in ks:
        leaders = sorted(states[-1], key=lambda d: states[-1][d][0])[:chains] if states else []
        seen: dict = {}
        inside = _inside(within, K)
        pool = sorted(inside) if inside is not None else list(range(1, L))
        starts = [s for d in leaders for s in _supersets(d, pool, L)]
        best_depths(score, L, K, key, inside, starts, seen)
        states.append(_link(seen, sets[-1] if sets else None, states[-1] if states else None, key, tolerance))
        sets.append(seen)
    chosen, depths = {}, min(states[-1], key=lambda d: states[-1][d][0])
    for i in range(len(ks) - 1, -1, -1):
        result = sets[i][depths]
        if i:
            previous = sets[i - 1][states[i][depths][1]]
            floor = previous["depth_speedup"] - tolerance
            result = {**result, "floor": floor, "floor_met": result["depth_speedup"] >= floor - 1e-12}
        chosen[ks[i]], depths = result, states[i][depths][1]
    return dict(sorted(chosen.items()))


def _link(seen: dict, before: dict | None, state: dict | None, key: str, tolerance: float) -> dict:
    """depths -> (summed cost, previous depths) of the cheapest chain reaching each set of ``seen`` from a set of
    ``before`` no faster than it plus ``tolerance`` (a set no chain reaches: reached from the slowest, at a
    penalty, so a chain always exists)."""
    if before is None:
        return {d: (r[key], None) for d, r in seen.items()}
    ordered = sorted(before, key=lambda d: before[d]["depth_speedup"])
    speeds = [before[d]["depth_speedup"] for d in ordered]
    best, running = [], None  # the cheapest chain among the previous sets up to each speed
    for d in ordered:
        if running is None or state[d][0] < state[running][0]:
            running = d
        best.append(running)
    out = {}
    for d, r in seen.items():
        i = bisect.bisect_right(speeds, r["depth_speedup"] + tolerance + 1e-12)
        previous = best[i - 1] if i else ordered[0]
        out[d] = (state[previous][0] + r[key] + (0.0 if i else PENALTY), previous)
    return out


def _inside(within, K: int):
    return within if within is not None and K - 1 <= len(within) else None


def _supersets(base, pool, L: int) -> list[tuple[int, ...]]:
    """``base`` (a set ending at ``L``) with one more depth of ``pool``: the nested candidates."""
    inner = set(base[:-1])
    return [tuple(sorted(inner | {d})) + (L,) for d in pool if d not in inner]


def _start(L: int, explorers: int, pool) -> tuple[int, ...]:
    """The uniform split, each inner depth moved to the nearest free depth of ``pool`` (kept increasing)."""
    chosen = []
    for d in resolve_depths(L, explorers=explorers)[:-1]:
        left = [p for p in pool if not chosen or p > chosen[-1]]
        room = len(left) - (explorers - 2 - len(chosen))  # a depth left for every boundary still to place
        chosen.append(min(left[:room], key=lambda p: (abs(p - d), p)))
    return (*chosen, L)
