"""The viewers' shared traces: two runs with draft chains on the tiny Llama, made once a module that asks."""

import pytest

from dex_core import DexDecoder
from dex_core.testing import tiny_tokenizer

PROMPT = [4, 8, 15, 16, 23, 42, 7, 9] * 3  # a repeating prompt: every n-gram has a continuation to look up


@pytest.fixture(scope="module")
def chains(llama):
    """Chains forced through every stage (gate=0): rounds that commit two tokens, no cuts."""
    decoder = DexDecoder(
        llama, explorers=4, tokenizer=tiny_tokenizer(), trace_top=5, prune="none", draft="gate=0"
    )
    return decoder.generate(PROMPT, 24, node_text=True).trace


@pytest.fixture(scope="module")
def cut_chains(llama):
    """The default draft bounds: chains whose predecessor proposed another token are cut."""
    decoder = DexDecoder(
        llama, explorers=4, tokenizer=tiny_tokenizer(), trace_top=5, prune="none", draft="min_ngram=1,gate=1"
    )
    return decoder.generate(PROMPT, 24, node_text=True).trace
