"""``dex_sdpa`` (dex_core/model/attention.py): tree-masked layer calls attend by grouping query heads per KV
head, equal to transformers' sdpa without its ``repeat_kv`` copy; every other call is sdpa bit for bit."""

import pytest
import torch
import transformers.integrations.sdpa_attention as hf_sdpa
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from dex_core.model.attention import TREE_ATTENTION, tree_sdpa_attention, use_tree_attention
from dex_core.testing import tiny_model

FAMILIES = ("llama", "qwen3", "gemma3_text")
OVERRIDES = {"gemma3_text": dict(layer_types=["sliding_attention", "full_attention"])}  # one of each kind
NEG = torch.finfo(torch.float64).min


class TensorCache:
    """A cache as the layers see it: ``update`` returns the layer's past keys/values with the new ones after."""

    def __init__(self, past_keys: dict, past_values: dict):
        self.keys, self.values = past_keys, past_values

    def update(self, key, value, layer_idx, *args, **kwargs):
        return torch.cat([self.keys[layer_idx], key], 2), torch.cat([self.values[layer_idx], value], 2)


def tree_mask(q: int, past: int, generator: torch.Generator) -> torch.Tensor:
    """A random additive mask (1, 1, q, past + q): random columns visible, and each node sees itself."""
    visible = torch.rand(q, past + q, generator=generator) < 0.5
    visible[torch.arange(q), past + torch.arange(q)] = True
    return torch.zeros(q, past + q, dtype=torch.float64).masked_fill_(~visible, NEG)[None, None]


def run_layers(model, past: int, **kwargs) -> list[torch.Tensor]:
    """Every decoder layer of ``model`` on the same random batch of 7 tree nodes after ``past`` cached entries
    (no cache when 0): the same inputs for two models built from the same seed."""
    g = torch.Generator().manual_seed(1)
    cfg, q = model.config, 7
    hidden = torch.randn(1, q, cfg.hidden_size, generator=g, dtype=torch.float64)
    positions = (past + torch.randint(0, q, (q,), generator=g))[None]
    mask = tree_mask(q, past, g)
    outs = []
    for i, layer in enumerate(model.model.layers):
        kv = (1, cfg.num_key_value_heads, past, layer.self_attn.head_dim)
        cache = TensorCache(
            {i: torch.randn(kv, generator=g, dtype=torch.float64)},
            {i: torch.randn(kv, generator=g, dtype=torch.float64)},
        )
        rotary = model.model.rotary_emb  # Gemma 3 keeps one per layer type
        gemma3 = cfg.model_type == "gemma3_text"
        rope = rotary(hidden, positions, cfg.layer_types[i]) if gemma3 else rotary(hidden, positions)
        out = layer(
            hidden,
            attention_mask=mask,
            position_ids=positions,
            position_embeddings=rope,
            use_cache=past > 0,
            cache=cache if past else None,
            **kwargs,
        )
        outs.append(out[0] if isinstance(out, tuple) else out)
    return outs


@pytest.fixture(scope="module")
def pairs():
    """Per family: the same tiny model (grouped heads: 4 query heads on 2 KV heads) on sdpa and on dex_sdpa."""
    built = {}
    for family in FAMILIES:
        plain = tiny_model(family, layers=2, **OVERRIDES.get(family, {}))
        tree = tiny_model(family, layers=2, **OVERRIDES.get(family, {}))
        assert plain.config.num_key_value_heads < plain.config.num_attention_heads
        assert use_tree_attention(tree)
        built[family] = (plain, tree)
    return built


@pytest.fixture
def repeat_kv_calls(monkeypatch):
    """How many times transformers' sdpa has copied K/V with ``repeat_kv`` since the test began."""
    calls = []

    def counting(hidden_states, n_rep):
        calls.append(n_rep)
        return original(hidden_states, n_rep)

    original = hf_sdpa.repeat_kv
    monkeypatch.setattr(hf_sdpa, "repeat_kv", counting)
    return calls


@pytest.mark.parametrize("past", [0, 9])
@pytest.mark.parametrize("family", FAMILIES)
def test_tree_layer_calls_equal_transformers_sdpa(pairs, family, past):
    plain, tree = pairs[family]
    with torch.no_grad():
        expected = run_layers(plain, past)
        got = run_layers(tree, past, dex_tree=True)
    for e, g in zip(expected, got):
        assert g.shape == e.shape
        assert (g - e).abs().max().item() <= 1e-12


def test_the_tree_path_never_repeats_kv_and_plain_sdpa_does(pairs, repeat_kv_calls):
    plain, tree = pairs["llama"]
    with torch.no_grad():
        run_layers(tree, 9, dex_tree=True)
        assert repeat_kv_calls == []
        run_layers(plain, 9)
    assert repeat_kv_calls == [2, 2, 2, 2]  # keys and values of both layers


def _attention_inputs(q: int = 5, k: int = 11):
    """A module with 2 query heads per KV head, query (1, 4, q, 8), key/value (1, 2, k, 8), a random mask."""
    g = torch.Generator().manual_seed(2)
    module = torch.nn.Module()
    module.num_key_value_groups, module.is_causal = 2, True
    query = torch.randn(1, 4, q, 8, generator=g, dtype=torch.float64)
    key, value = (torch.randn(1, 2, k, 8, generator=g, dtype=torch.float64) for _ in range(2))
    return module, query, key, value, tree_mask(q, k - q, g)


@pytest.mark.parametrize(
    "kwargs",
    [
        {},  # not a tree call
        {"dex_tree": True, "position_bias": torch.randn(1, 4, 5, 11, dtype=torch.float64)},  # T5-style bias
        {"dex_tree": True, "no_mask": True},  # nothing to tile: sdpa's causal path
    ],
    ids=["no_dex_tree", "position_bias", "no_mask"],
)
def test_calls_the_grouped_path_cannot_serve_are_transformers_sdpa_bit_for_bit(kwargs):
    module, query, key, value, mask = _attention_inputs()
    kwargs = dict(kwargs)
    if kwargs.pop("no_mask", False):
        mask = None
    reference = {k: v for k, v in kwargs.items() if k != "dex_tree"}
    expected, _ = sdpa_attention_forward(module, query, key, value, mask, scaling=0.3, **reference)
    got, weights = tree_sdpa_attention(module, query, key, value, mask, scaling=0.3, **kwargs)
    assert weights is None
    assert torch.equal(got, expected)


def test_a_soft_capped_tree_call_goes_to_sdpa_without_the_dex_tree_keyword(monkeypatch):
    seen = []

    def recording(module, query, key, value, attention_mask, **kwargs):
        seen.append(kwargs)
        return query, None

    monkeypatch.setattr(hf_sdpa, "sdpa_attention_forward", recording)
    module, query, key, value, mask = _attention_inputs()
    tree_sdpa_attention(module, query, key, value, mask, dex_tree=True, softcap=30.0, sliding_window=4)
    assert seen == [dict(dropout=0.0, scaling=None, is_causal=None, softcap=30.0, sliding_window=4)]


def test_the_grouped_output_has_sdpa_layout_and_values():
    module, query, key, value, mask = _attention_inputs()
    got, _ = tree_sdpa_attention(module, query, key, value, mask, dex_tree=True)
    expected, _ = sdpa_attention_forward(module, query, key, value, mask)
    assert got.shape == (1, 5, 4, 8) and got.is_contiguous()
    assert (got - expected).abs().max().item() <= 1e-12


def _greedy(model, prompt: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    return model.generate(prompt, attention_mask=attention_mask, max_new_tokens=6, do_sample=False)


def test_use_tree_attention_switches_sdpa_only_and_keeps_generate_unchanged():
    model = tiny_model("llama", layers=2)
    prompt = torch.randint(0, 96, (2, 5), generator=torch.Generator().manual_seed(3))
    padded = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])  # a left-padded row: the padding mask matters
    with torch.no_grad():
        tokens, logits = _greedy(model, prompt, padded), model(prompt, attention_mask=padded).logits
        assert use_tree_attention(model) and use_tree_attention(model)  # idempotent
        assert all(
            layer.self_attn.config._attn_implementation == TREE_ATTENTION for layer in model.model.layers
        )
        assert torch.equal(_greedy(model, prompt, padded), tokens)
        assert torch.equal(model(prompt, attention_mask=padded).logits, logits)
    eager = tiny_model("llama", layers=1, attn_implementation="eager")
    assert not use_tree_attention(eager) and eager.config._attn_implementation == "eager"
    soft_capped = tiny_model("gemma2", layers=1)  # transformers runs Gemma 2 on eager only
    assert not use_tree_attention(soft_capped) and soft_capped.config._attn_implementation == "eager"
