"""A generation request: prompt text to token ids (chat template), checks against the model, and the typed
``Request`` that the round loop runs and that travels to explorer processes.

A request means what its ``GenerationOptions`` say. Of the model's generation config only the EOS ids are
taken (where the options name none); every other setting there that would change ``model.generate()``'s
tokens (repetition penalty, n-gram ban, suppressed tokens, sampling defaults, ...) is not applied, by DEX
and by ``ar_generate`` alike: ``make_request`` names each one in the request's ``notes``, and ``warn`` says them in a
``GenerationConfigWarning``. A request is checked once, where it enters (the CLI, the app, the HTTP API: prompt
text by ``check_text``, the rest by ``make_request``), and travels as this record from there on.
"""

from __future__ import annotations

import operator
import warnings
from dataclasses import dataclass

import torch

from ..config import DexError, GenerationOptions
from ..device import check_float32_matmuls
from ..model.view import ModelView
from ..values import integer

MAX_LOGPROBS = 20  # likeliest alternatives a committed token may report (OpenAI's top_logprobs bound)


@dataclass(frozen=True)
class Request:
    """One checked generation: prompt token ids, the options, and the EOS ids it stops at. ``pipeline``: AR
    through the same K stages (pipeline-parallel AR at batch 1) — no stage but the last proposes, so every token
    walks all K stages in K rounds: exactly the AR reference's tokens, the like-for-like baseline on the devices
    DEX runs on. ``notes``: the settings of the model's generation config the request does not apply
    (``ignored_settings``). ``logprobs``: each committed token's log-probability at the final depth and this many
    likeliest alternatives there are reported with it (None: not asked)."""

    prompt: tuple[int, ...]
    options: GenerationOptions
    eos: tuple[int, ...]
    id: int = 0
    pipeline: bool = False
    notes: tuple[str, ...] = ()
    logprobs: int | None = None


def _token(t) -> int:
    if isinstance(t, bool):
        raise TypeError("a bool is not a token id")
    return operator.index(t)


def prompt_ids(input_ids, vocab: int) -> list[int]:
    """Token ids from a list, a 1-D tensor or a (1, n) tensor, checked against the vocabulary."""
    if isinstance(input_ids, (str, bytes)):
        raise DexError(
            "the prompt must be token ids, not text; encode text first with "
            "encode_prompt(tokenizer, text, chat)"
        )
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


class GenerationConfigWarning(UserWarning):
    """A setting of the model's generation config that DEX and ``ar_generate`` do not apply."""


# Settings of a generation config that change the tokens model.generate() emits, each with its "off" value.
PROCESSORS = {
    "repetition_penalty": 1.0,
    "no_repeat_ngram_size": 0,
    "bad_words_ids": None,
    "sequence_bias": None,
    "suppress_tokens": None,
    "begin_suppress_tokens": None,
    "min_length": 0,
    "min_new_tokens": 0,
    "forced_bos_token_id": None,
    "forced_eos_token_id": None,
    "exponential_decay_length_penalty": None,
    "guidance_scale": 1.0,
    "watermarking_config": None,
    "num_beams": 1,
    "penalty_alpha": 0.0,
    "dola_layers": None,
    "stop_strings": None,
}
WARPERS = {
    "min_p": None,
    "typical_p": 1.0,
    "epsilon_cutoff": 0.0,
    "eta_cutoff": 0.0,
    "top_h": None,
}  # do_sample only
HF_SAMPLING = {
    "temperature": 1.0,
    "top_k": 50,
    "top_p": 1.0,
}  # what generate() samples with where a config is silent


def ignored_settings(generation_config, options: GenerationOptions) -> list[str]:
    """One sentence per setting of ``generation_config`` that ``model.generate()`` would apply and a request with
    ``options`` does not: the setting, what DEX does instead, and how to silence it."""

    def value(name):
        return getattr(generation_config, name, None)

    def is_set(name, off):
        return value(name) is not None and value(name) != off and value(name) not in ([], {}, ())

    sampling = value("do_sample") is True
    notes = [
        f"the model's generation_config sets {name}={value(name)!r}, which DEX does not apply (it changes the "
        f"tokens model.generate() emits); DEX decodes without it, as ar_generate does; set "
        f"generation_config.{name} = {off!r} to silence this"
        for name, off in [*PROCESSORS.items(), *(WARPERS.items() if sampling else ())]
        if is_set(name, off)
    ]
    if sampling and options.temperature == 0:
        given = "".join(f", {k}={value(k)!r}" for k in HF_SAMPLING if value(k) is not None)
        t, k, p = (default if value(name) is None else value(name) for name, default in HF_SAMPLING.items())
        ask = ", ".join(
            [f"temperature={t!r}"] + ([f"top_k={k!r}"] if k else []) + ([f"top_p={p!r}"] if p < 1 else [])
        )
        notes.append(
            f"the model's generation_config asks for sampling (do_sample=True{given}), which DEX does not "
            f"take as a default: a request samples only when its temperature is > 0; DEX decodes greedily, "
            f"as ar_generate does; pass {ask} to sample as model.generate() does, or set "
            f"generation_config.do_sample = False to silence this"
        )
    elif sampling:  # the request samples: a top-k/top-p it leaves off stays off
        notes += [
            f"the model's generation_config sets {k}={value(k)!r}, which DEX does not take as a default; DEX "
            f"samples without it, as ar_generate does; pass {k}={value(k)!r} to sample as model.generate() "
            f"does, or set generation_config.{k} = None to silence this"
            for k, off in (("top_k", 0), ("top_p", 1.0))
            if is_set(k, off) and getattr(options, k) is None
        ]
    return notes


def make_request(
    view: ModelView,
    input_ids,
    options: GenerationOptions,
    eos: tuple[int, ...] | None = None,
    pipeline: bool = False,
    logprobs: int | None = None,
) -> Request:
    """Check a prompt and its options against the model; DexError says what to change. ``eos``
    (default: ``options.eos_token_id``, else the model's generation config) is where it stops. Every other
    setting of that config that ``model.generate()`` would apply is named in the request's ``notes``.
    A float32 model refuses while this process runs float32 matmuls as TF32 (``device.check_float32_matmuls``)."""
    check_float32_matmuls(view.dtype, view.device)
    prompt = prompt_ids(input_ids, view.vocab)
    n = options.max_new_tokens
    if view.max_positions and len(prompt) + n > view.max_positions:
        raise DexError(
            f"the prompt ({len(prompt)} tokens) plus max_new_tokens ({n}) exceeds "
            f"the model's context window of {view.max_positions} tokens; ask for fewer tokens"
        )
    notes = ignored_settings(getattr(view.model, "generation_config", None), options)
    eos = eos_ids(view.model, options.eos_token_id) if eos is None else eos
    if logprobs is not None:
        logprobs = integer(logprobs, "logprobs", 0)
        if logprobs > MAX_LOGPROBS:
            raise DexError(f"logprobs takes 0 to {MAX_LOGPROBS} alternatives a token; got {logprobs}")
    return Request(tuple(prompt), options, eos, pipeline=pipeline, notes=tuple(notes), logprobs=logprobs)


def warn(request: Request, stacklevel: int = 3) -> Request:
    """``request`` after its notes were said, each in a ``GenerationConfigWarning`` (for library callers; the app
    shows them on the page)."""
    for note in request.notes:
        warnings.warn(note, GenerationConfigWarning, stacklevel=stacklevel)
    return request


def chat_ids(tokenizer, messages: list[dict], generation_prompt: bool = False) -> list[int]:
    """Token ids of chat ``messages`` through the tokenizer's chat template (plain lines without one)."""
    if getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=generation_prompt)
        return list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    return tokenizer("\n".join(m["content"] for m in messages) + ("\n" if generation_prompt else ""))[
        "input_ids"
    ]


class Text(str):
    """Prompt text that ``check_text`` passed: checked once, where it entered, and not again."""


def check_text(prompt) -> Text:
    """``prompt`` if it is non-empty text a tokenizer can encode (UTF-8: no lone surrogates), as ``Text``."""
    if not isinstance(prompt, str):
        raise DexError(f"the prompt must be text (a str); got {type(prompt).__name__}")
    try:
        prompt.encode("utf-8")
    except UnicodeEncodeError as err:
        raise DexError(
            f"the prompt is not valid Unicode: a lone surrogate {prompt[err.start]!r} at character "
            f"{err.start}; remove it or fix the text's encoding"
        ) from None
    if not prompt.strip():
        raise DexError("the prompt is empty; give some text to continue")
    return Text(prompt)


NO_TEMPLATE = (
    "the model's tokenizer has no chat template (its GGUF carries none): the prompt goes in as written"
)


def no_chat_template(tokenizer, chat: bool) -> str | None:
    """``NO_TEMPLATE`` when a chat prompt was asked for and the tokenizer has no template, else None."""
    return NO_TEMPLATE if chat and not getattr(tokenizer, "chat_template", None) else None


def encode_prompt(tokenizer, prompt: str, chat: bool) -> list[int]:
    """Token ids of ``prompt`` (checked by ``check_text`` unless it is ``Text`` already); through the tokenizer's
    chat template when it has one and ``chat`` (else as written: ``no_chat_template`` says so)."""
    prompt = prompt if isinstance(prompt, Text) else check_text(prompt)
    if chat and getattr(tokenizer, "chat_template", None):
        return chat_ids(tokenizer, [{"role": "user", "content": prompt}], generation_prompt=True)
    return tokenizer(prompt, add_special_tokens=True)["input_ids"]


def encode_item(tokenizer, item: dict) -> list[int]:
    """Token ids of a prompt-set item ``{"prompt", "chat"}`` (``dex_core.data.sets``)."""
    return encode_prompt(tokenizer, item["prompt"], item["chat"])
