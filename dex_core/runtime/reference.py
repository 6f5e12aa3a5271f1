"""The references DEX must equal: the AR sampler (the model's own forward with a KV cache and DEX's sampler)
and Hugging Face ``generate`` (greedy). DEX and both references decode a request as its options say, with
the EOS of the model's generation config and none of its other settings (``dex_core.runtime.request``)."""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from ..algorithm.sampling import Sampler
from ..config import GenerationOptions
from ..device import check_float32_matmuls, to_device
from ..model.view import model_view
from ..trace.build import end_event, start_event, token_event, with_text
from ..trace.events import Event
from ..trace.stats import GenerationStats
from .clock import Clock
from .request import make_request, warn
from .results import GenerationResult

TOKEN_IDS = ("bos_token_id", "eos_token_id", "pad_token_id")  # what hf_greedy keeps of a generation config


def ar_generate(
    model,
    input_ids,
    max_new_tokens: int | None = None,
    *,
    options: GenerationOptions | None = None,
    tokenizer=None,
    **overrides,
) -> GenerationResult:
    """Autoregressive reference: the model's own forward with a KV cache, DEX's sampler on its logits."""
    return GenerationResult.from_trace(
        list(ar_stream(model, input_ids, max_new_tokens, options=options, tokenizer=tokenizer, **overrides))
    )


def ar_stream(
    model,
    input_ids,
    max_new_tokens: int | None = None,
    *,
    options: GenerationOptions | None = None,
    tokenizer=None,
    **overrides,
) -> Iterator[Event]:
    """``ar_generate`` as events: start, one ``TokenEvent`` per token, end.

    A token event's ``seconds`` is the generator's own compute time so far (time spent by the
    consumer between events is not counted; on CUDA read from events), so AR can be raced against DEX
    in one process. Logits are upcast before the token choice (``Sampler``), as in DEX.
    """

    view = model_view(model)
    request = warn(
        make_request(
            view, input_ids, GenerationOptions.build(options, max_new_tokens=max_new_tokens, **overrides)
        )
    )
    o, prompt = request.options, list(request.prompt)
    sampler = Sampler(view.vocab, o.temperature, o.top_k, o.top_p, o.seed)
    stats = GenerationStats(1, [view.num_layers], compute_seconds=[0.0])
    yield start_event(request, view, device=str(view.device))
    cache = _new_cache(model)
    cache_kwarg = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    busy, clock = 0.0, Clock(view.device)
    ids = to_device([prompt], view.device)
    tokens: list[int] = []
    while len(tokens) < o.max_new_tokens and stats.stop != "eos":
        with clock.span("token"), torch.no_grad():
            logits = model(input_ids=ids, use_cache=True, **{cache_kwarg: cache}).logits[0, -1:]
            position = len(prompt) + len(tokens)
            chosen = sampler.choose(logits, [position], final=True)
            ids = chosen[None]  # (1, 1): the next input, without a trip through the host
            token = int(chosen[0])
        sampler.forget_before(position)
        tokens.append(token)
        if token in request.eos:
            stats.stop = "eos"
        busy += clock.seconds("token")
        event = token_event(len(tokens) - 1, position, token, busy)
        yield event if tokenizer is None else with_text(event, lambda t: tokenizer.decode([t]))
    stats.round_seconds = stats.compute_seconds[0] = stats.projected_seconds = busy
    stats.rounds = len(tokens)
    stats.matched_stages = [0] * len(tokens)
    stats.finish(len(tokens), busy)
    yield end_event(tokens, stats)


def _new_cache(model):
    """An empty KV cache for ``model`` (transformers 5 sizes it from the config; 4 takes no argument)."""
    # deferred: transformers takes seconds to import (docs/ARCHITECTURE.md, Imports)
    from transformers import DynamicCache

    try:
        return DynamicCache(config=model.config)
    except TypeError:
        return DynamicCache()


@contextmanager
def plain_generation(model) -> Iterator[None]:
    """Inside the block ``model.generation_config`` keeps only the model's token ids (BOS, EOS, pad).
    ``generate`` fills every setting it is not passed from that config (even under ``generation_config=``), so
    only this way does it apply no processor that DEX does not (repetition penalty, n-gram ban, suppressed
    tokens, sampling defaults, ...). The model's own config is put back on exit."""

    # deferred: transformers takes seconds to import (docs/ARCHITECTURE.md, Imports)
    from transformers import GenerationConfig

    saved = model.generation_config
    model.generation_config = GenerationConfig(**{k: getattr(saved, k, None) for k in TOKEN_IDS})
    try:
        yield
    finally:
        model.generation_config = saved


@torch.no_grad()
def hf_greedy(model, prompt: list[int], max_new_tokens: int) -> list[int]:
    """Hugging Face ``generate``, plain greedy (``plain_generation``: stopping at the model's EOS, no other
    setting of its generation config): the reference answer every method is compared with."""
    check_float32_matmuls(model.dtype, model.device)
    ids = torch.tensor([list(prompt)], device=model.device)
    with plain_generation(model):
        out = model.generate(
            ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=max_new_tokens
        )
    return out[0, ids.shape[1] :].tolist()
