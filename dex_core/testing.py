"""Tiny random models of the supported families and a tiny tokenizer, built offline from configs: what the tests,
``dex bench --quick`` and the benchmarks' quick modes run on (never loaded from files)."""

from __future__ import annotations

import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)


def tiny_model(family: str = "llama", layers: int = 6, vocab: int = 96, seed: int = 0, **overrides):
    """A tiny random float64 model of a supported family, built offline from a config (tests, --quick)."""
    classes = {
        "llama": (LlamaConfig, LlamaForCausalLM),
        "mistral": (MistralConfig, MistralForCausalLM),
        "qwen2": (Qwen2Config, Qwen2ForCausalLM),
        "qwen3": (Qwen3Config, Qwen3ForCausalLM),
    }
    config_cls, model_cls = classes[family]
    kwargs = dict(
        vocab_size=vocab,
        hidden_size=48,
        intermediate_size=96,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    kwargs.update(overrides)
    torch.manual_seed(seed)
    model = model_cls(config_cls(**kwargs)).to(torch.float64).eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = None
    return model


def tiny_tokenizer(vocab: int = 96):
    """A word-level tokenizer over 'w0'..'w{n}' plus a few English words (offline, no files)."""
    words = ["[UNK]", "hello", "world", "the", "a", "prime", "number"]
    words += [f"w{i}" for i in range(vocab - len(words))]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]")
