"""Exploration sets, model support checks and adapters."""

import pytest
import torch

from dex_core import DexDecoder, DexError, UnsupportedModelError, ar_generate, resolve_depths


@pytest.mark.parametrize(
    "L,K,expected",
    [
        (30, 4, (8, 15, 23, 30)),
        (6, 4, (2, 3, 5, 6)),
        (6, 1, (6,)),
        (6, 6, (1, 2, 3, 4, 5, 6)),
        (32, 8, (4, 8, 12, 16, 20, 24, 28, 32)),
    ],
)
def test_uniform_split(L, K, expected):
    assert resolve_depths(L, explorers=K) == expected


@pytest.mark.parametrize(
    "depths,message",
    [
        ((8, 15, 23), "must end at the model's 30 layers"),
        ((0, 30), r"depths must be integers >= 1; got \(0, 30\)"),
        ((15, 8, 30), "strictly increasing"),
        ((), "empty"),
    ],
)
def test_invalid_depths_are_refused_with_a_reason(depths, message):
    with pytest.raises(DexError, match=message):
        resolve_depths(30, depths=depths)


def test_unsupported_models_name_their_class():
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(vocab_size=32, n_embd=16, n_layer=2, n_head=2))
    with pytest.raises(UnsupportedModelError, match="GPT2LMHeadModel"):
        DexDecoder(model, explorers=2)


def test_prompt_and_request_checks(llama):
    decoder = DexDecoder(llama, explorers=2)
    with pytest.raises(DexError, match="empty"):
        decoder.generate([], 4)
    with pytest.raises(DexError, match="batch of 2"):
        decoder.generate(torch.zeros(2, 3, dtype=torch.long), 4)
    with pytest.raises(DexError, match=r"lie in \[0, 96\)"):
        decoder.generate([1, 500], 4)
    with pytest.raises(DexError, match="context window of 256"):
        decoder.generate([1, 2], 255)


class Shift(torch.nn.Module):
    """A stand-in inducing adapter: a fixed random residual update of the hidden state."""

    def __init__(self, hidden, seed):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.delta = torch.randn(hidden, generator=g, dtype=torch.float64) * 3

    def forward(self, h):
        return h + self.delta


def test_adapters_change_which_branch_survives_but_never_the_tokens(llama):
    model = llama
    prompt = [7, 1, 4, 2, 8]
    plain = DexDecoder(model, depths=(2, 4, 6)).generate(prompt, 48)
    adapted = DexDecoder(model, depths=(2, 4, 6), adapters={2: Shift(48, 0), 4: Shift(48, 1)}).generate(
        prompt, 48
    )
    assert adapted.tokens == plain.tokens == ar_generate(model, prompt, 48).tokens
    assert adapted.stats.matched_stages != plain.stats.matched_stages
    with pytest.raises(DexError, match="only the non-final explored depths"):
        DexDecoder(model, depths=(2, 4, 6), adapters={6: Shift(48, 0)})
