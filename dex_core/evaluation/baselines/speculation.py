"""Baselines DEX is compared with: LayerSkip-style self-speculation on our stage runner, Hugging Face's
built-in ``assistant_early_exit`` (depth selection) and its prompt lookup (``prompt_lookup_num_tokens``, token-axis
drafts copied from the prompt and the text so far, no draft model).

Self-speculation with exit E and draft length n (paper App. D; LayerSkip): each step drafts n tokens
one by one through layers [0, E) (and the inducing adapter at E, when given) and the LM head, then
verifies them in one batched pass that sends the n + 1 inputs through layers [E, L) — the first E
layers of the drafted inputs are reused, as LayerSkip shares their KV cache. The longest verified
prefix of the drafts plus the verifier's next token is committed, so the output is exactly AR's.
Sampling is exact too: draft and verifier draw with the same Gumbel row per position (sampling.py),
and a draft is kept only where it equals the verifier's token.

Critical path of one step: n * E layer forwards of drafting plus E + (L - E) = L for the verification
(its last input's first E layers and the upper L - E), i.e. n * E + L, as the benchmark counts it.
"""

from __future__ import annotations

import torch

from ...algorithm.sampling import Sampler
from ...config import DexError, GenerationOptions
from ...device import to_device
from ...model.explorer import Explorer
from ...model.view import model_view
from ...runtime.clock import Clock
from ...runtime.reference import plain_generation
from ...runtime.request import make_request, warn
from ...trace.stats import GenerationStats


class _SelfSpec:
    """The two halves of the model a self-speculation step runs: layers 1..E (the drafter, with the exit's adapter
    and head) and E+1..L (the verifier), each with its own tree KV cache."""

    def __init__(self, view, exit_layer: int, draft: int, adapter, sampler: Sampler):
        self.view, self.draft, self.sampler = view, draft, sampler
        self.lower = Explorer(view, 0, 2, 0, exit_layer, adapter)
        self.upper = Explorer(view, 1, 2, exit_layer, view.num_layers)

    def prefill(self, prompt: list[int]) -> None:
        if len(prompt) > 1:
            self.upper.prefill(self.lower.prefill(self.view.embed(to_device(prompt[:-1], self.view.device))))

    def step(self, last: int, position: int) -> tuple[list[int], list[int]]:
        """n drafts after ``last`` through the lower layers, then every draft verified by the upper layers in one
        batch: (drafts, the verifier's tokens at positions ``position``..``position + n``)."""
        view, n = self.view, self.draft
        inputs, hidden, drafts = [last], [], []
        for i in range(n + 1):  # n drafts, then the E layers of the last draft for verification
            x = view.embed(to_device([inputs[-1]], view.device))
            hidden.append(self.lower.expand(x, [i], [position - 1 + i], [tuple(range(i + 1))]))
            if i < n:
                drafts.append(
                    int(self.sampler.choose(self.lower.propose(hidden[-1]), [position + i], final=False)[0])
                )
                inputs.append(drafts[-1])
        paths = [tuple(range(i + 1)) for i in range(n + 1)]
        out = self.upper.expand(
            torch.cat(hidden), list(range(n + 1)), [position - 1 + i for i in range(n + 1)], paths
        )
        positions = [position + i for i in range(n + 1)]
        return drafts, self.sampler.choose(self.upper.propose(out), positions, final=True).tolist()

    def keep(self, accepted: int) -> None:
        """The inputs of the committed tokens stay in both caches; the rest of the chain goes."""
        for stage in (self.lower, self.upper):
            stage.cache.retain(list(range(accepted + 1)), promote=accepted + 1)


@torch.no_grad()
def self_spec_generate(
    model,
    input_ids,
    max_new_tokens: int,
    exit_layer: int,
    draft: int,
    adapter=None,
    *,
    options: GenerationOptions | None = None,
    **overrides,
) -> dict:
    """Self-speculative decoding; returns ``{"tokens", "steps", "accepted", "layer_forwards", "seconds",
    "stats"}`` where ``layer_forwards`` is the critical path n * E + L summed over steps. ``overrides``
    are ``GenerationOptions`` fields (temperature, top_k, top_p, seed, eos_token_id)."""
    view = model_view(model)
    L = view.num_layers
    if not 1 <= exit_layer < L:
        raise DexError(f"the exit layer must lie in 1..{L - 1}; got {exit_layer}")
    if draft < 1:
        raise DexError(f"the draft length must be at least 1; got {draft}")
    request = warn(
        make_request(
            view, input_ids, GenerationOptions.build(options, max_new_tokens=max_new_tokens, **overrides)
        )
    )
    prompt, eos, o = list(request.prompt), request.eos, request.options
    sampler = Sampler(view.vocab, o.temperature, o.top_k, o.top_p, o.seed)
    spec, clock = _SelfSpec(view, exit_layer, draft, adapter, sampler), Clock(view.device)
    start = clock.stamp()
    spec.prefill(prompt)
    tokens: list[int] = []
    steps = accepted = 0
    last = prompt[-1]
    while len(tokens) < max_new_tokens and not (tokens and tokens[-1] in eos):
        position = len(prompt) + len(tokens)  # position of the first token this step decides
        drafts, verified = spec.step(last, position)
        keep = 0
        while keep < draft and drafts[keep] == verified[keep]:
            keep += 1
        spec.keep(keep)
        before = len(tokens)
        for t in verified[: keep + 1]:
            if len(tokens) < max_new_tokens and not (tokens and tokens[-1] in eos):
                tokens.append(t)
        sampler.forget_before(position + keep + 1)
        last, steps = verified[keep], steps + 1
        accepted += len(tokens) - before - 1  # drafts kept (past max_new_tokens or EOS they do not count)
    forwards = steps * (draft * exit_layer + L)
    return speculation_result(tokens, eos, [exit_layer, L], (steps, accepted, forwards), clock.since(start))


def speculation_result(tokens: list[int], eos, depths: list[int], counts: tuple, seconds: float) -> dict:
    """What a draft-and-verify loop returns (self-speculation here, ``evaluation.baselines.selectors``' too);
    ``depths``: the exits and the final layer; ``counts``: (steps, drafts accepted, critical-path layer
    forwards)."""
    steps, accepted, forwards = counts
    stats = GenerationStats(
        len(depths),
        list(depths),
        tokens=len(tokens),
        rounds=steps,
        rounds_per_token=steps / max(1, len(tokens)),
        wall_seconds=seconds,
        tokens_per_second=len(tokens) / seconds if seconds else 0.0,
        stop="eos" if tokens and tokens[-1] in eos else "length",
    )
    return {
        "tokens": tokens,
        "steps": steps,
        "accepted": accepted,
        "layer_forwards": forwards,
        "seconds": seconds,
        "stats": stats,
    }


def self_spec_layer_forwards(
    omega_exit: torch.Tensor, draft: int, exit_layer: int, num_layers: int
) -> tuple[int, int]:
    """(steps, critical-path layer forwards) that greedy self-speculation needs for a generation whose
    exit-layer matches along the committed tokens are ``omega_exit`` (T,) — exact for greedy decoding,
    since every kept draft sits on the committed prefix. Used to grid-search (E, n) cheaply."""
    hits = omega_exit.tolist()
    t = steps = 0
    while t < len(hits):
        keep = 0
        while keep < draft and t + keep < len(hits) and hits[t + keep]:
            keep += 1
        t += keep + 1
        steps += 1
    return steps, steps * (draft * exit_layer + num_layers)


@torch.no_grad()
def hf_early_exit_generate(model, input_ids, max_new_tokens: int, exit_layer: int, draft: int) -> list[int]:
    """Greedy ``model.generate(assistant_early_exit=E)`` with ``draft`` assistant tokens per step and no
    confidence threshold (both read from the generation config, which ``plain_generation`` otherwise keeps
    plain, as for ``hf_greedy``); returns the new tokens."""
    ids = torch.as_tensor(input_ids, device=model.device).reshape(1, -1)
    with plain_generation(model):
        config = model.generation_config
        config.num_assistant_tokens = draft
        config.assistant_confidence_threshold = 0.0
        config.num_assistant_tokens_schedule = "constant"
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            max_new_tokens=max_new_tokens,
            assistant_early_exit=exit_layer,
        )
    return out[0, ids.shape[1] :].tolist()


@torch.no_grad()
def hf_prompt_lookup_generate(model, input_ids, max_new_tokens: int, lookup: int) -> dict:
    """Greedy ``model.generate(prompt_lookup_num_tokens=lookup)`` under ``plain_generation`` (as ``hf_greedy``:
    the same ids, new tokens and EOS). A draft is the up to ``lookup`` tokens that followed the first earlier
    occurrence of the text's last n-gram (n = 2, else 1: HF's default ``max_matching_ngram_size``), verified
    in one forward, so the output is greedy AR's. Returns ``{"tokens", "steps", "rows"}``: the new tokens,
    the model's forwards (the prefill counts as one, as AR's first token) and the rows they ran (prefill 1,
    then 1 + the draft length each), read by a pre-hook that only counts."""
    ids = torch.as_tensor(input_ids, device=model.device).reshape(1, -1)
    widths: list[int] = []

    def count(module, args, kwargs):
        widths.append(
            kwargs["input_ids"].shape[1] if kwargs.get("input_ids") is not None else args[0].shape[1]
        )

    hook = model.register_forward_pre_hook(count, with_kwargs=True)
    try:
        with plain_generation(model):
            out = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                do_sample=False,
                max_new_tokens=max_new_tokens,
                prompt_lookup_num_tokens=lookup,
            )
    finally:
        hook.remove()
    return {"tokens": out[0, ids.shape[1] :].tolist(), "steps": len(widths), "rows": 1 + sum(widths[1:])}
