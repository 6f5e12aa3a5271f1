"""The real default model (SmolLM2-135M-Instruct, float32): DEX K=4 equals HF greedy generate."""

import pytest

from dex_core import DexDecoder, hf_greedy, load_model
from dex_core.data import humaneval_prompts

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def default_model():
    return load_model("default")


def test_dex_k4_equals_hf_generate_on_humaneval_prompts(default_model):
    model, tokenizer = default_model
    decoder = DexDecoder(model, explorers=4, tokenizer=tokenizer)  # the shipped adapters' best set, light heads
    assert decoder.depths == (9, 18, 27, 30) and decoder.depth_choice == "best set stored with the adapters"
    assert decoder.proposal_vocab == 8192
    for item in humaneval_prompts(2):
        prompt = tokenizer(item["prompt"])["input_ids"]
        result = decoder.generate(prompt, 32)
        assert result.tokens == hf_greedy(model, prompt, 32), item["id"]
        assert 1.0 <= result.stats.rounds_per_token <= 4.0


def test_default_model_is_a_30_layer_llama_with_a_chat_template(default_model):
    model, tokenizer = default_model
    assert type(model).__name__ == "LlamaForCausalLM" and model.config.num_hidden_layers == 30
    assert tokenizer.chat_template and model.config.tie_word_embeddings


def test_every_figure_of_a_default_model_trace_builds_with_at_most_15_lattice_nodes(default_model):
    import visualize as viz

    model, tokenizer = default_model
    prompt = tokenizer("def fibonacci(n):")["input_ids"]
    trace = DexDecoder(model, explorers=4, tokenizer=tokenizer).generate(prompt, 24).trace
    views = viz.replay(trace)
    assert views
    for view in views:
        assert viz.lattice_figure(view).data
        assert all(isinstance(html, str) and html for html in
                   (viz.tokens_html(view), viz.fsm_html(view), viz.round_table_html(view)))
    assert all(viz.lattice_size(v) <= 2 ** 4 - 1 for v in views)


def test_shipped_adapters_load_for_the_default_model_and_keep_dex_exact(default_model):
    model, tokenizer = default_model
    decoder = DexDecoder(model, explorers=4, adapters="default")
    assert sorted(decoder.adapters) == [9, 18, 27]
    prompt = tokenizer(humaneval_prompts(3)[2]["prompt"])["input_ids"]
    assert decoder.generate(prompt, 32).tokens == hf_greedy(model, prompt, 32)
