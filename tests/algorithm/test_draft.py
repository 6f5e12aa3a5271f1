"""Draft chains: prompt lookup, chain bookkeeping in the lattice, and DEX with chains forced on emitting
exactly the AR reference's tokens (random tiny float64 models, random exploration sets, greedy and
seeded sampling, sequential schedule; the distributed one is checked in test_distributed.py)."""

import functools

import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from dex_core import DecoderOptions, DexDecoder, DexError, ar_generate
from dex_core.algorithm.chains import ChainPlanner
from dex_core.algorithm.draft import PromptLookup
from dex_core.algorithm.lattice import Lattice
from dex_core.config import DraftBounds
from dex_core.testing import tiny_model, tiny_tokenizer
from dex_core.trace.events import RoundEvent

LAYERS, VOCAB = 6, 48


def test_lookup_prefers_the_longest_match_and_its_first_occurrence():
    look = PromptLookup([1, 2, 3, 9, 2, 3, 4, 5, 2, 3], ngram=3)
    assert look.find([9, 2, 3], 1, 4) == (3, [4, 5, 2, 3])  # "9 2 3" occurred once: what followed it
    assert look.find([7, 2, 3], 1, 2) == (2, [9, 2])  # "2 3": its first occurrence, not the later "2 3 4"
    assert look.find([7, 8], 1, 3) == (0, [])
    assert look.find([7, 5], 2, 3) == (0, [])  # "5" alone is too short a match at min_ngram 2
    look = PromptLookup([1, 2, 3], ngram=3)
    assert look.find([2, 3], 1, 2) == (0, [])  # the context's own suffix never matches itself
    look.extend(6)  # until a committed token follows it
    assert look.find([2, 3], 1, 2) == (2, [6])


def test_draft_bounds_parse_and_refuse_bad_text():
    assert DecoderOptions().draft == DraftBounds() and DecoderOptions(draft="none").draft is None
    assert DecoderOptions(draft="length=4,chains=2").draft == DraftBounds(length=4, chains=2)
    for bad in (
        "x",
        "length=0",
        "rows=-1",
        "colour=1",
        "gate=2",
        "ngram=1,min_ngram=2",
        "length=2.5",
        3,
        True,
    ):
        with pytest.raises(DexError, match="draft"):
            DecoderOptions(draft=bad)


def commit(lattice: Lattice):
    """Validate and commit, then collapse; the Commit."""
    done = lattice.validate_and_commit()
    lattice.collapse(done)
    return done


def chained(K: int, context: list[int], bounds: DraftBounds) -> Lattice:
    """A lattice whose draft chains look up ``context`` (its root: the context's last token)."""
    return Lattice(K, context[-1], len(context), ChainPlanner(bounds, context))


def _complete(lattice: Lattice, truth, count: int, plan) -> list:
    """Insert ``plan``'s candidates, then run rounds, every node proposing ``truth(position)``, until ``count``
    commits: their (round, commit)."""
    plans = []
    for _ in range(3 * count):
        plan = plan or lattice.plan_round()
        lattice.insert({n.id: truth(n.position) for batch in plan.batches for n in batch})
        while lattice.ready():
            plans.append((plan.round, commit(lattice)))
        plan = None
        if len(plans) >= count:
            return plans
    raise AssertionError(f"{count} commits did not come within {3 * count} rounds")


def test_a_chain_that_matches_commits_all_its_slots_in_one_round():
    context = [5, 6, 7, 8, 9, 5, 6]  # ends with "5 6": the lookup drafts 7 8 9 5 6
    text = context + [7, 8, 9, 5, 6, 7]
    lat = chained(3, context, DraftBounds(length=4, gate=0))
    plan = lat.plan_round()
    assert [n.kind for n in plan.batches[0]] == ["root", "chain", "chain", "chain", "chain"]
    assert [n.input_token for n in plan.batches[0]] == [6, 7, 8, 9, 5]
    plans = _complete(lat, lambda p: text[p] if p < len(text) else 0, 6, plan)
    assert [(r, p.token) for r, p in plans[:5]] == [
        (3, t) for t in text[7:12]
    ]  # the root and its chain, round 3
    assert [p.via for _, p in plans[:5]] == [
        "chain"
    ] * 5  # round 2 grew the chain by a slot (its prefix ends "8 9 5")
    assert [p.drafted for _, p in plans[:5]] == [False, True, True, True, True]
    assert (
        plans[5][0] == 4 and plans[5][1].drafted
    )  # that slot was one stage behind: it commits the round after


def test_a_chain_slot_is_scored_as_its_predecessor_times_the_rate_this_runs_chains_were_right():
    lat = chained(2, [5, 6, 7, 8, 5, 6], DraftBounds(length=2, gate=0))  # drafts 7 8 after the root
    plan = lat.plan_round()
    assert [lat.slots[n.slot].score for n in plan.batches[0]] == [1.0, 0.5, 0.25]  # no commit yet: 1/2 a slot
    _complete(lat, lambda p: 9 if p < 9 else 5, 3, plan)  # 9 comes where the chain said 7: one chain wrong
    assert lat.chains.odds() == 1 / 3
    context = [5, 6, 7, 8, 9, 5, 6]
    text = context + [7, 8, 9, 5, 6, 7]
    lat = chained(3, context, DraftBounds(length=4, gate=0))
    plans = _complete(lat, lambda p: text[p] if p < len(text) else 0, 6, None)
    assert [c.via for _, c in plans] == ["chain"] * 6 and lat.chains.odds() == 7 / 8  # six chains right
    grown = [lat.slots[n.slot] for n in lat.plan_round().batches[0] if n.kind == "chain"]
    assert grown and [s.score for s in grown] == [
        pytest.approx(7 / 8 * lat.slots[s.parent].score) for s in grown
    ]  # the chain grown now: 7/8 a slot


def test_a_contradicted_chain_is_cut_and_its_predecessor_branches_as_usual():
    context = [5, 6, 7, 8, 5, 6]
    lat = chained(3, context, DraftBounds(length=2, gate=1))
    plan = lat.plan_round()
    root, first, second = plan.batches[0]
    lat.insert({root.id: 3, first.id: 8, second.id: 1})  # the root proposes 3, not the drafted 7
    assert lat.cut == [first.id, second.id] and set(lat.nodes) == {root.id}
    nxt = lat.plan_round()
    assert [(n.kind, n.input_token) for n in nxt.batches[0]][0] == ("position", 3)


def test_a_chain_slot_whose_candidate_differs_starts_the_recovery_branch_that_commits_at_the_break():
    context = [5, 6, 7, 8, 5, 6]  # the lookup drafts 7 8 after the root
    lat = chained(2, context, DraftBounds(length=2, gate=0))
    plan = lat.plan_round()
    root, first, second = plan.batches[0]
    lat.insert({root.id: 7, first.id: 4, second.id: 1})  # the first chain slot proposes 4, not the drafted 8
    pending = {
        lat.nodes[p.parent].slot: lat.nodes[p.parent].token for p in lat.children if p.kind == "position"
    }
    assert pending == {first.slot: 4, second.slot: 1}  # no branch under the root: its chain slot repeats 7
    nxt = lat.plan_round()
    recovery = next(n for n in nxt.batches[0] if n.kind == "position" and n.input_token == 4)
    lat.insert({n.id: {root.slot: 7, first.slot: 4}.get(n.slot, 2) for b in nxt.batches for n in b})
    commits = [commit(lat) for _ in range(2) if lat.ready()]
    assert [(c.token, c.via) for c in commits] == [(7, "chain"), (4, "position")]  # 4 breaks the chain ...
    assert lat.anchor == recovery.slot and lat.state == 1  # ... and the next anchor is a stage deep already


@functools.cache
def model(seed: int):
    return tiny_model("llama", layers=LAYERS, vocab=VOCAB, seed=seed)


@functools.cache
def tokenizer():  # one object: its token ranking (light proposal heads) is derived once
    return tiny_tokenizer(VOCAB)


@st.composite
def chain_cases(draw):
    """A prompt that repeats a random piece (so lookups find drafts), forced chains, random options."""
    piece = draw(st.lists(st.integers(0, VOCAB - 1), min_size=2, max_size=6))
    prompt = draw(st.lists(st.integers(0, VOCAB - 1), max_size=3)) + piece * draw(st.integers(2, 3))
    depths = draw(
        st.lists(st.integers(1, LAYERS - 1), unique=True, max_size=3).map(
            lambda d: tuple(sorted(d)) + (LAYERS,)
        )
    )
    ngram = draw(st.integers(1, 3))
    bounds = {
        "ngram": ngram,
        "min_ngram": draw(st.integers(1, ngram)),
        "length": draw(st.integers(1, 6)),
        "chains": draw(st.integers(1, 3)),
        "rows": draw(st.integers(1, 12)),
        "gate": draw(st.integers(0, 1)),
    }
    decoder = {
        "depths": depths,
        "decs": draw(st.booleans()),
        "prune": draw(st.sampled_from([None, 1, 2])),
        "proposal_vocab": draw(st.sampled_from(["full", 12])),
        "draft": ",".join(f"{k}={v}" for k, v in bounds.items()),
    }
    sampled = draw(st.booleans())
    generation = {"max_new_tokens": draw(st.integers(4, 14))}
    if sampled:
        generation.update(
            temperature=draw(st.floats(0.3, 1.5)),
            seed=draw(st.integers(0, 2**32)),
            top_k=draw(st.sampled_from([None, 8])),
        )
    return draw(st.integers(0, 2)), decoder, generation, prompt


@given(case=chain_cases())
def test_dex_with_draft_chains_forced_on_emits_the_ar_references_tokens(case):
    seed, decoder_options, generation, prompt = case
    result = DexDecoder(model(seed), tokenizer=tokenizer(), **decoder_options).generate(prompt, **generation)
    assert result.tokens == ar_generate(model(seed), prompt, **generation).tokens
    commits = [c for e in result.trace if isinstance(e, RoundEvent) for c in e.commits]
    assert [c.token for c in commits] == result.tokens and result.stats.drafted == sum(
        c.drafted for c in commits
    )
    event(
        "several commits in a round"
        if result.stats.rounds < len(result.tokens) + len(decoder_options["depths"]) - 1
        else "one commit per round"
    )


def test_chains_carry_greedy_and_sampled_runs_past_one_token_per_round():
    prompt = [3, 17, 4, 40, 9, 22] * 3
    m = model(0)
    for options in ({}, {"temperature": 0.7, "seed": 5}):
        plain = DexDecoder(m, explorers=3, draft="none").generate(prompt, 24, **options)
        chained = DexDecoder(m, explorers=3, draft="gate=0").generate(prompt, 24, **options)
        assert chained.tokens == plain.tokens == ar_generate(m, prompt, 24, **options).tokens
        if not options:  # the tiny model continues the repeating prompt greedily: drafts hold
            assert chained.stats.drafted > 0 and chained.stats.rounds < plain.stats.rounds
