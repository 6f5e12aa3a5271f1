"""Every family DEX runs beyond Llama, Mistral and Qwen 2/3 (their exactness tests are tests/runtime/test_exactness.py):
Gemma 2 and 3, Phi-3, OLMo 2, Granite and Qwen3-MoE. Float64 tiny models (``dex_core.testing.FAMILY_CONFIG``:
windows shorter than a prompt, soft-caps and multipliers that matter); the options covered pairwise, not every
combination; the distributed schedule, each explorer loading its own part, on Gemma 3 and the MoE family."""

from __future__ import annotations

import tempfile

import pytest
import torch

from dex_core import DexDecoder, DexError, ar_generate, load_model
from dex_core.evaluation.verify import certify_tokens
from dex_core.model.lens import layer_candidates
from dex_core.model.proposal import ProposalHead
from dex_core.model.view import UnsupportedModelError, check_supported, model_view
from dex_core.runtime.reference import hf_greedy
from dex_core.testing import FAMILY_CONFIG, tiny_model, tiny_tokenizer

FAMILIES = sorted(FAMILY_CONFIG)
PROMPT = [5, 17, 3, 88, 40, 2, 61, 9, 33, 12, 70, 4, 21, 8]  # 14 tokens: past every tiny window (8, 10)
NEW = 14
# (sampled, K, DECS, draft chains, pruning): every pair of two options' values in some run
RUNS = [
    (False, 2, True, "none", 1),
    (False, 3, False, "auto", 1),
    (False, 4, True, "auto", "none"),
    (True, 2, False, "auto", "none"),
    (True, 3, True, "none", "none"),
    (True, 4, False, "none", 1),
]
SAMPLING = dict(temperature=0.9, top_k=20, seed=3)


@pytest.fixture(scope="module", params=FAMILIES)
def family(request):
    return request.param, tiny_model(request.param)


def test_the_runs_cover_every_pair_of_option_values():
    values = [sorted({run[i] for run in RUNS}, key=str) for i in range(5)]
    for i in range(5):
        for j in range(i + 1, 5):
            pairs = {(run[i], run[j]) for run in RUNS}
            assert len(pairs) == len(values[i]) * len(values[j]), (i, j)


def test_dex_equals_the_ar_reference_and_hf_greedy_under_pairwise_options(family):
    name, model = family
    greedy = hf_greedy(model, PROMPT, NEW)
    assert ar_generate(model, PROMPT, NEW).tokens == greedy, name
    sampled = ar_generate(model, PROMPT, NEW, **SAMPLING).tokens
    assert sampled != greedy  # the sampled runs check something the greedy ones do not
    for sample, K, decs, draft, prune in RUNS:
        decoder = DexDecoder(model, explorers=K, decs=decs, draft=draft, prune=prune)
        got = decoder.generate(PROMPT, NEW, **(SAMPLING if sample else {})).tokens
        assert got == (sampled if sample else greedy), (name, sample, K, decs, draft, prune)


def test_the_family_head_is_the_models_own_at_the_last_layer_and_in_light_heads(family):
    """``ModelView.finish`` (scaling, soft-capping) is what the family's causal-LM head does: the lens's last layer
    equals the model's logits, and a light head's rows equal the full head's columns."""
    name, model = family
    view = model_view(model)
    ids = torch.tensor([PROMPT])
    out = model(ids, output_hidden_states=True)
    assert torch.allclose(view.finish(model.lm_head(out.hidden_states[-1])), out.logits, rtol=0, atol=1e-12)
    top = layer_candidates(model, PROMPT[:-1], PROMPT[-1:], top=1)
    assert top[0, -1, 0].item() == out.logits[0, -2].argmax().item(), name  # (token, layer, top)
    h = torch.randn(3, model.config.hidden_size, dtype=torch.float64)
    light = ProposalHead(view, [7, 1, 30, 2])
    assert torch.allclose(light(h), view.head(h)[:, [7, 1, 30, 2]], rtol=0, atol=1e-12), name


def test_a_family_that_changes_its_logits_outside_the_layers_is_certified_by_verify():
    """Granite divides its logits by 0.25 and Gemma 2 soft-caps them: verify's gaps come from the model's own
    logits, so DEX's tokens certify at gap 0 and a wrong token does not."""
    for name in ("granite", "gemma2"):
        model = tiny_model(name)
        result = DexDecoder(model, explorers=3).generate(PROMPT, NEW)
        report = certify_tokens(model, PROMPT, result.tokens)
        assert report.certified == NEW and report.worst_gap == 0, name
        wrong = [*result.tokens[:5], (result.tokens[5] + 1) % 96, *result.tokens[6:]]
        assert certify_tokens(model, PROMPT, wrong).certified < NEW, name


@pytest.mark.slow
@pytest.mark.process
@pytest.mark.parametrize("name,dtype", [("gemma3_text", "float64"), ("qwen3_moe", "float32")])
def test_explorer_processes_each_loading_their_own_part_run_the_family_exactly(
    name, dtype, tmp_path, monkeypatch
):
    """Gemma 3 (a rotary per layer type, sliding and full layers) and Qwen3-MoE (experts fused from per-expert
    checkpoint tensors; float32, as its grouped expert matmuls have no float64) through DexDecoder.from_pretrained,
    K = 2, against the AR reference of the same checkpoint in the same dtype."""
    folder = tmp_path / name
    tiny_model(name).save_pretrained(folder, max_shard_size="60KB")
    tiny_tokenizer().save_pretrained(folder)
    reference_model, _ = load_model(
        str(folder), dtype=dtype
    )  # as the ranks load it (experts: grouped matmuls)
    reference = ar_generate(reference_model, PROMPT, NEW).tokens
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with DexDecoder.from_pretrained(
        str(folder), backend="distributed", explorers=2, device="cpu", threads=1, dtype=dtype
    ) as dex:
        assert dex.generate(PROMPT, NEW).tokens == reference


def test_a_family_dex_does_not_run_is_refused_in_one_line_that_says_why():
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64))
    with pytest.raises(UnsupportedModelError) as refused:
        check_supported(model)
    message = str(refused.value)
    assert "\n" not in message and isinstance(refused.value, DexError)
    assert message.startswith("GPT2LMHeadModel (model_type 'gpt2') is not supported: its absolute position")
    assert "gemma3_text" in message and "qwen3_moe" in message  # what it runs instead
