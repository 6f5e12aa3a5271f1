"""Adaptive depth selection (AdaDecode-style confidence exits, DEL-style running statistics): exact against the
AR reference, counted like self-speculation where they coincide, and DEL's choice read from its statistics."""

import pytest

from dex_core.config import DexError
from dex_core.evaluation.baselines.selectors import Confidence, Running, select_generate, uniform_exits
from dex_core.evaluation.baselines.speculation import self_spec_generate
from dex_core.model.cost import ModelCost
from dex_core.runtime.reference import ar_generate
from dex_core.testing import tiny_model

PROMPT = [3, 1, 4, 1, 5, 9, 2, 6]


def policies(model):
    return [
        Confidence(0.0, 3),  # every token exits at the first exit: the most drafts, most discarded
        Confidence(
            0.0145, 2
        ),  # the tiny models' top probabilities lie near 0.014: some tokens exit, some not
        Confidence(1.01, 4),  # never confident: AR through the segments
        Running(ModelCost.of(model), drafts=(1, 3)),
    ]


SAMPLED, TOP_K = {"temperature": 1.0, "seed": 3}, {"temperature": 0.8, "top_k": 20, "seed": 5}


# Mistral's window met greedy and under top-k; plain sampling, which meets no window, on Llama only
@pytest.mark.parametrize(
    "family,kwargs",
    [("llama", {}), ("llama", SAMPLED), ("llama", TOP_K), ("mistral", {}), ("mistral", TOP_K)],
    ids=["llama-greedy", "llama-sampled", "llama-top_k", "mistral-greedy", "mistral-top_k"],
)
def test_selectors_are_exact_in_greedy_and_seeded_sampling(family, kwargs):
    extra = {"sliding_window": 12} if family == "mistral" else {}  # the prompt plus 40 tokens passes it
    model = tiny_model(family, layers=6, seed=7, **extra)
    ref = ar_generate(model, PROMPT, 40, **kwargs).tokens
    for policy in policies(model):
        out = select_generate(model, PROMPT, 40, policy, exits=(2, 4), **kwargs)
        assert out["tokens"] == ref, policy
        assert len(out["counts"].w_sel) == len(ref) and out["accepted"] == len(ref) - out["steps"]
        if policy.name == "adadecode" and 0 < policy.threshold < 1:
            assert {2, 6} <= set(out["counts"].w_sel) or max(out["counts"].w_sel) > 6


def test_one_exit_that_always_fires_is_self_speculation_counted_the_same():
    model = tiny_model("llama", layers=6, seed=7)
    for exit_layer, draft in ((1, 2), (3, 4)):
        spec = self_spec_generate(model, PROMPT, 40, exit_layer, draft)
        out = select_generate(model, PROMPT, 40, Confidence(0.0, draft), exits=(exit_layer,))
        assert out["tokens"] == spec["tokens"]
        assert (out["steps"], out["accepted"], out["layer_forwards"]) == (
            spec["steps"],
            spec["accepted"],
            spec["layer_forwards"],
        )
        # Eq. (4) charges each step n * E + L over its tokens; only the last step may be cut at the length
        w = sum(out["counts"].w_sel)
        assert out["layer_forwards"] - (draft * exit_layer + 6) < w <= out["layer_forwards"]
        assert out["accepted"] > 0  # some drafts held: the kept-draft path ran


def test_never_confident_runs_every_token_through_every_layer_once():
    model = tiny_model("llama", layers=6, seed=7)
    out = select_generate(model, PROMPT, 20, Confidence(1.01, 4), exits=(2, 4))
    assert out["steps"] == 20 and out["layer_forwards"] == 20 * 6 and out["counts"].w_sel == [6] * 20
    assert [rows for _, rows in out["counts"].forwards] == [1] * 60  # three segments a token, one row each


def test_del_picks_the_exit_and_length_its_statistics_favour():
    cost = ModelCost(12, 2.0, 0.0)
    policy = Running(cost, drafts=(1, 4))
    policy.learn({0: [True] * 64, 1: [False] * 64})
    policy.plan((3, 8))
    assert policy.choice == (0, 4)  # exit 3 is always right: draft long there
    policy.learn({0: [False] * 64, 1: [False] * 64})
    policy.plan((3, 8))
    assert policy.choice == (0, 0)  # nothing holds: no drafts, plain AR steps
    assert policy.looks(0, 0) is False


def test_exits_are_checked_and_spread_evenly():
    model = tiny_model("llama", layers=6, seed=7)
    assert (
        uniform_exits(48) == (8, 16, 24, 32, 40)
        and uniform_exits(6, 2) == (2, 4)
        and uniform_exits(2) == (1,)
    )
    for bad in ((0, 2), (4, 2), (2, 6)):
        with pytest.raises(DexError, match="candidate exits"):
            select_generate(model, PROMPT, 4, Confidence(0.5, 2), exits=bad)
