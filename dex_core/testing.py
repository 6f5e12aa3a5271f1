"""Tiny random models of the supported families and a tiny tokenizer, built offline from configs: what the tests,
``dex bench --quick`` and the benchmarks' quick modes run on (never loaded from files)."""

from __future__ import annotations

import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import (
    Gemma2Config,
    Gemma2ForCausalLM,
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    GraniteConfig,
    GraniteForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Olmo2Config,
    Olmo2ForCausalLM,
    Phi3Config,
    Phi3ForCausalLM,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
)

CLASSES = {
    "llama": (LlamaConfig, LlamaForCausalLM),
    "mistral": (MistralConfig, MistralForCausalLM),
    "qwen2": (Qwen2Config, Qwen2ForCausalLM),
    "qwen3": (Qwen3Config, Qwen3ForCausalLM),
    "gemma2": (Gemma2Config, Gemma2ForCausalLM),
    "gemma3_text": (Gemma3TextConfig, Gemma3ForCausalLM),
    "phi3": (Phi3Config, Phi3ForCausalLM),
    "olmo2": (Olmo2Config, Olmo2ForCausalLM),
    "granite": (GraniteConfig, GraniteForCausalLM),
    "qwen3_moe": (Qwen3MoeConfig, Qwen3MoeForCausalLM),
}
# What each family does beyond a Llama, at values that make it matter in a tiny model: windows shorter than a
# test's prompt and answer, soft-caps near the logits' scale, multipliers far from 1, a quarter of the experts.
FAMILY_CONFIG = {
    "gemma2": dict(
        head_dim=12,
        sliding_window=8,
        query_pre_attn_scalar=12,
        attn_logit_softcapping=2.0,
        final_logit_softcapping=1.5,
    ),
    "gemma3_text": dict(head_dim=12, sliding_window=8, query_pre_attn_scalar=12, final_logit_softcapping=1.5),
    "phi3": dict(partial_rotary_factor=0.5, sliding_window=10),
    "olmo2": dict(),
    "granite": dict(
        embedding_multiplier=6.0, residual_multiplier=0.3, attention_multiplier=0.2, logits_scaling=0.25
    ),
    "qwen3_moe": dict(
        head_dim=12, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=True
    ),
}


def tiny_model(family: str = "llama", layers: int = 6, vocab: int = 96, seed: int = 0, **overrides):
    """A tiny random float64 model of a supported family (``CLASSES``), built offline from a config (tests,
    --quick); ``FAMILY_CONFIG`` sets what the family adds, ``overrides`` anything."""
    config_cls, model_cls = CLASSES[family]
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
    kwargs.update(FAMILY_CONFIG.get(family, {}))
    kwargs.update(overrides)
    torch.manual_seed(seed)
    model = model_cls(config_cls(**kwargs)).to(torch.float64).eval()
    if hasattr(model.config, "num_experts"):
        model.set_experts_implementation("eager")  # grouped expert matmuls have no float64; the loop does
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = None
    return model


def save_tiny(folder, family: str = "llama"):
    """A tiny ``family`` model and the tiny tokenizer saved in ``folder``, loadable with ``--model FOLDER``;
    returns ``folder``."""
    tiny_model(family).save_pretrained(folder)
    tiny_tokenizer().save_pretrained(folder)
    return folder


def tiny_tokenizer(vocab: int = 96):
    """A word-level tokenizer over 'w0'..'w{n}' plus a few English words (offline, no files)."""
    words = ["[UNK]", "hello", "world", "the", "a", "prime", "number"]
    words += [f"w{i}" for i in range(vocab - len(words))]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]")
