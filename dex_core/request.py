"""A generation request: prompt text to token ids (chat template), checks against the model, and the typed
``Request`` that the round loop runs and that travels to explorer processes."""

from __future__ import annotations

import operator
from dataclasses import dataclass

import torch

from .config import DexError, GenerationOptions
from .models import ModelView


@dataclass(frozen=True)
class Request:
    """One checked generation: prompt token ids, the options, and the EOS ids it stops at."""

    prompt: tuple[int, ...]
    options: GenerationOptions
    eos: tuple[int, ...]
    id: int = 0


def _token(t) -> int:
    if isinstance(t, bool):
        raise TypeError("a bool is not a token id")
    return operator.index(t)


def prompt_ids(input_ids, vocab: int) -> list[int]:
    """Token ids from a list, a 1-D tensor or a (1, n) tensor, checked against the vocabulary."""
    if isinstance(input_ids, (str, bytes)):
        raise DexError("the prompt must be token ids, not text; encode text first with "
                       "encode_prompt(tokenizer, text, chat)")
    if isinstance(input_ids, torch.Tensor):
        if input_ids.dim() == 2:
            if input_ids.shape[0] != 1:
                raise DexError(f"DEX decodes one sequence at a time; got a batch of {input_ids.shape[0]}")
            input_ids = input_ids[0]
        input_ids = input_ids.tolist()
    try:
        ids = [_token(t) for t in input_ids]
    except TypeError:
        raise DexError(f"the prompt must be a sequence of integer token ids; got {input_ids!r:.80}") from None
    if not ids:
        raise DexError("the prompt is empty; give at least one token to continue from")
    bad = [t for t in ids if not 0 <= t < vocab]
    if bad:
        raise DexError(f"prompt token ids must lie in [0, {vocab}); got {bad[:5]}")
    return ids


def eos_ids(model, eos_token_id=None) -> tuple[int, ...]:
    """The token ids generation stops after: the given ones, else the model's generation config."""
    if eos_token_id is None:
        eos_token_id = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if eos_token_id is None:
        return ()
    return (int(eos_token_id),) if isinstance(eos_token_id, int) else tuple(int(t) for t in eos_token_id)


def make_request(view: ModelView, input_ids, options: GenerationOptions, eos: tuple[int, ...] | None = None) -> Request:
    """Check a prompt and its options against the model; DexError says what to change. ``eos``
    (default: ``options.eos_token_id``, else the model's generation config) is where it stops."""
    prompt = prompt_ids(input_ids, view.vocab)
    n = options.max_new_tokens
    if view.max_positions and len(prompt) + n > view.max_positions:
        raise DexError(f"the prompt ({len(prompt)} tokens) plus max_new_tokens ({n}) exceeds "
                       f"the model's context window of {view.max_positions} tokens; ask for fewer tokens")
    return Request(tuple(prompt), options, eos_ids(view.model, options.eos_token_id) if eos is None else eos)


def chat_ids(tokenizer, messages: list[dict], generation_prompt: bool = False) -> list[int]:
    """Token ids of chat ``messages`` through the tokenizer's chat template (plain lines without one)."""
    if getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=generation_prompt)
        return list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    return tokenizer("\n".join(m["content"] for m in messages) + ("\n" if generation_prompt else ""))["input_ids"]


def check_text(prompt) -> str:
    """``prompt`` if it is non-empty text a tokenizer can encode (UTF-8: no lone surrogates)."""
    if not isinstance(prompt, str):
        raise DexError(f"the prompt must be text (a str); got {type(prompt).__name__}")
    try:
        prompt.encode("utf-8")
    except UnicodeEncodeError as err:
        raise DexError(f"the prompt is not valid Unicode: a lone surrogate {prompt[err.start]!r} at character "
                       f"{err.start}; remove it or fix the text's encoding") from None
    if not prompt.strip():
        raise DexError("the prompt is empty; give some text to continue")
    return prompt


def encode_prompt(tokenizer, prompt: str, chat: bool) -> list[int]:
    """Token ids of ``prompt``; through the tokenizer's chat template when it has one and ``chat``."""
    check_text(prompt)
    if chat and getattr(tokenizer, "chat_template", None):
        return chat_ids(tokenizer, [{"role": "user", "content": prompt}], generation_prompt=True)
    return tokenizer(prompt, add_special_tokens=True)["input_ids"]


def encode_item(tokenizer, item: dict) -> list[int]:
    """Token ids of a prompt-set item ``{"prompt", "chat"}`` (``dex_core.data``)."""
    return encode_prompt(tokenizer, item["prompt"], item["chat"])
