"""The real default model (SmolLM2-135M-Instruct, float32, loaded once a session: conftest's ``default_model``):
DEX K=4 equals HF greedy generate."""

import json

import pytest

from dex_core import DexDecoder, hf_greedy
from dex_core.data.sets import humaneval_prompts
from dex_core.model.adapters import DEFAULT_ADAPTERS
from dex_core.model.proposal import DEFAULT_PROPOSAL_VOCAB
from dex_core.trace.events import RoundEvent


def test_dex_k4_equals_hf_generate_on_a_humaneval_prompt(default_model):
    from safetensors import safe_open

    model, tokenizer = default_model
    # the shipped adapters' best set and light heads; no pruning (the GPU default), so every branch starts
    decoder = DexDecoder(model, explorers=4, tokenizer=tokenizer, prune="none")
    with safe_open(str(DEFAULT_ADAPTERS), "pt") as fh:  # what the shipped file records, read directly
        stored, ranking = json.loads(fh.metadata()["best_sets"])["4"], fh.get_tensor("shortlist").tolist()
    assert list(decoder.depths) == stored and decoder.depth_choice == "best set stored with the adapters"
    assert (
        decoder.shortlist.tolist() == ranking[:DEFAULT_PROPOSAL_VOCAB]
    )  # light heads: the file's most frequent tokens
    assert decoder.proposal_vocab == DEFAULT_PROPOSAL_VOCAB < len(ranking) == model.config.vocab_size
    # one prompt whose 24 tokens commit every way, at every stage (another prompt: the shipped adapters' test)
    prompt = tokenizer(humaneval_prompts(2)[1]["prompt"])["input_ids"]
    result = decoder.generate(prompt, 24)
    assert result.tokens == hf_greedy(model, prompt, 24)
    commits = [(e.round, c) for e in result.trace if isinstance(e, RoundEvent) for c in e.commits]
    matched = [c.matched_stage for _, c in commits]
    assert len(matched) == len(result.tokens) and set(matched) == {0, 1, 2, 3}, matched  # some commit early
    assert {c.via for _, c in commits} == {"root", "position", "chain"}  # each case of the law below
    # the first token takes the 4 rounds of the pipeline, each next one the stage that matched before it + 1
    # (4 after a miss), or fewer than 4 when a draft chain carried on
    assert commits[0][0] == 4 and result.stats.rounds == commits[-1][0]
    for (r, c), (later, _) in zip(commits, commits[1:]):
        gap = later - r
        assert 0 <= gap < 4 if c.via == "chain" else gap == (4 if c.via == "root" else c.matched_stage + 1)
    assert result.stats.rounds_per_token == pytest.approx(result.stats.rounds / len(result.tokens))


def test_default_model_is_a_30_layer_llama_with_a_chat_template(default_model):
    model, tokenizer = default_model
    assert type(model).__name__ == "LlamaForCausalLM" and model.config.num_hidden_layers == 30
    assert tokenizer.chat_template and model.config.tie_word_embeddings


def test_every_figure_of_a_default_model_trace_builds_with_at_most_15_lattice_nodes(default_model):
    import visualize as viz

    model, tokenizer = default_model
    prompt = tokenizer("def fibonacci(n):")["input_ids"]
    trace = DexDecoder(model, explorers=4, tokenizer=tokenizer, draft="none").generate(prompt, 24).trace
    views, rounds = viz.replay(trace), [e for e in trace if isinstance(e, RoundEvent)]
    assert len(views) == len(rounds) == trace[-1].stats.rounds and views[-1].tokens == trace[-1].tokens
    alive = []
    for view, event in zip(views, rounds):
        # a round's lattice: the nodes alive after the round before and the ones this round's plan ran, at most
        # the 2^(q+1) - 1 of the FSM state q it started in (15 for K = 4)
        size = viz.lattice_size(view)
        assert size == len(alive) + sum(map(len, event.batches)) <= 2 ** (event.state_before + 1) - 1 <= 15
        alive = event.alive
        assert (
            sum(len(t.x) for t in viz.lattice_figure(view).data if "markers" in t.mode) == size
        )  # each node drawn
        assert viz.tokens_html(view).count('class="dex-tok"') == len(view.tokens)
        assert all(
            isinstance(html, str) and html for html in (viz.fsm_html(view), viz.round_table_html(view))
        )


def test_shipped_adapters_load_for_the_default_model_and_keep_dex_exact(default_model):
    model, tokenizer = default_model
    decoder = DexDecoder(model, explorers=4, adapters="default")
    assert sorted(decoder.adapters) == [9, 18, 27]
    prompt = tokenizer(humaneval_prompts(3)[2]["prompt"])["input_ids"]
    assert decoder.generate(prompt, 24).tokens == hf_greedy(model, prompt, 24)
