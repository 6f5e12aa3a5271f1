"""A run's settings in the page's words (``visualize.run_settings``), on hand-made start events: the words the
Compare table shows are the words the exported report shows, for every bound of a draft chain."""

import dataclasses

from dex_core.trace.events import StartEvent
from visualize.run_settings import draft_text, pruning_text, sampling_text, settings

START = StartEvent(
    version=1,
    method="dex",
    explorers=4,
    depths=[9, 18, 27, 30],
    num_layers=30,
    prompt=[1, 2, 3],
    max_new_tokens=128,
    decs=True,
    sampling={"temperature": 0.0, "top_k": None, "top_p": None, "seed": 0},
    adapter_depths=[9, 18, 27],
    proposal_vocab=8192,
    depth_choice="best set stored with the adapters",
    prune=8,
    draft={"ngram": 3, "min_ngram": 2, "length": 8, "chains": 1, "rows": 24, "gate": 0},
)


def test_each_setting_is_said_as_the_live_tab_says_it():
    assert dict(settings(START)) == {
        "explorers K": "4",
        "depths": "9, 18, 27, 30 (best set stored with the adapters)",
        "inducing adapters": "on, at depths 9, 18, 27",
        "DECS": "on",
        "sampling": "greedy",
        "proposal heads (rows)": "8192",
        "lattice pruning": "at most 8 rows per stage a round",
        "draft chains": "chains of up to 8 looked-up tokens, n-grams 2–3, 1 new chain a round, "
        "at most 24 chain slots alive",
    }


def test_every_draft_bound_is_worded_and_none_is_printed_raw():
    bounds = {"ngram": 4, "min_ngram": 4, "length": 6, "chains": 2, "rows": 12, "gate": 1}
    text = draft_text(dataclasses.replace(START, draft=bounds))
    assert text == (
        "chains of up to 6 looked-up tokens, n-grams of 4, 2 new chains a round, at most 12 chain slots alive, "
        "a chain slot cut once the slot before it proposes other tokens"
    )
    assert "=" not in text and "ngram" not in text
    assert draft_text(dataclasses.replace(START, draft=None)) == "off (or a trace made before them)"


def test_no_budget_and_sampling_read_as_the_controls_name_them():
    loose = dataclasses.replace(
        START, prune=None, sampling={"temperature": 0.7, "top_k": 50, "top_p": None, "seed": 3}
    )
    assert pruning_text(loose) == "none"
    assert sampling_text(loose) == "temperature 0.7, top-k 50, seed 3"
