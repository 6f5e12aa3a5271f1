"""Per-token proof of a decoded output against the unmodified model: ``dex verify`` and ``certify_tokens``.

What DEX guarantees depends on the dtype. In float32 and float64 the committed tokens are identical to
the AR reference's (greedy: to Hugging Face ``generate``). In bfloat16 and float16 the lattice's batched
rows, masks and kernel paths round differently from one-row decoding, so where the model's two best
tokens are a numerical near-tie either may come out; the promise there is that every committed token
is the unmodified model's choice or within the tie gap of it (``sampling.tie_gap``). A certificate
checks that token by token: one teacher-forced forward of the model's own ``forward`` over prompt +
committed tokens (no lattice, no cache), logits upcast to float32, and for the token t at position p

    gap_p = max_v s_p(v) - s_p(t)     s_p = logits (greedy), or Sampler.scores(logits) + Gumbel row p

certified when gap_p <= tie_gap(dtype, m_p, T), m_p the larger magnitude of the row's top logit and
t's logit. With top-k / top-p, membership of the filtered set is itself decided by rounding at its edge:
there the gap is measured inside the set the filter admits once t's logit is raised by the tie gap. The gap is 0
where t is the model's choice; a token beyond the gap is a bug, not rounding.
Sampled tokens are checked with the very noise rows the run drew (keyed by seed and position, drawn
by the generator of the device type the run used), so they verify only on that device type.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch

from ..algorithm.sampling import Sampler, tie_gap
from ..config import DexError, GenerationOptions
from ..device import dtype_name
from ..model.adapters import SHAPE_KEYS, model_identity, same_weights
from ..model.checkpoint import missing_locally
from ..model.load import load_model, resolve_device
from ..model.view import model_view
from ..runtime.request import prompt_ids
from ..trace.events import EndEvent, RoundEvent, StartEvent, TokenEvent, parse_events
from ..trace.files import load_trace


@dataclass(frozen=True)
class TokenCheck:
    """One committed token against the unmodified model's scores at its position."""

    index: int  # 0-based among the committed tokens
    position: int  # absolute position of the token
    token: int  # the committed token
    top: int  # the unmodified model's choice at that position
    gap: float  # top's score minus the token's (0 when they are the same token; inf when filtered out)
    tie_gap: float  # the largest gap that counts as a numerical near-tie there
    certified: bool


@dataclass(frozen=True)
class Certificate:
    """The checks of a run's committed tokens (``combine`` joins several runs')."""

    checks: tuple[TokenCheck, ...]
    dtype: str  # the dtype the model computed its logits in
    device: str  # where the check ran

    @property
    def total(self) -> int:
        return len(self.checks)

    @property
    def certified(self) -> int:
        return sum(c.certified for c in self.checks)

    @property
    def worst_gap(self) -> float:
        return max((c.gap for c in self.checks), default=0.0)

    @property
    def uncertified(self) -> list[TokenCheck]:
        return [c for c in self.checks if not c.certified]

    @property
    def ok(self) -> bool:
        return self.certified == self.total

    def summary(self) -> str:
        return (
            f"certified: {self.certified} of {self.total} tokens within the tie gap "
            f"(worst gap {self.worst_gap:.6g})"
        )

    @classmethod
    def combine(cls, certificates: Iterable[Certificate]) -> Certificate:
        parts = list(certificates)
        if not parts:
            raise DexError("combine needs at least one certificate")
        return cls(tuple(c for part in parts for c in part.checks), parts[0].dtype, parts[0].device)


@torch.inference_mode()
def certify_tokens(model, prompt, tokens, options: GenerationOptions | None = None) -> Certificate:
    """Check each of ``tokens`` (generated after ``prompt``, token ids) against one teacher-forced forward of
    ``model`` under ``options``' sampling (default greedy); any method's tokens, DEX's or a baseline's."""
    view = model_view(model)
    o = options or GenerationOptions()
    prompt = prompt_ids(prompt, view.vocab)
    tokens = list(tokens)
    bad = [t for t in tokens if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < view.vocab]
    if bad:
        raise DexError(f"committed tokens must be ids in [0, {view.vocab}); got {bad[:5]}")
    cert = Certificate((), dtype_name(view.dtype), str(view.device))
    if not tokens:
        return cert
    n, device = len(tokens), view.device
    ids = torch.tensor([prompt + tokens[:-1]], device=device)  # position p predicts token p + 1
    keep = {"logits_to_keep": n} if "logits_to_keep" in inspect.signature(model.forward).parameters else {}
    logits = model(input_ids=ids, use_cache=False, **keep).logits[0, -n:]  # (n, vocab)
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    positions = list(range(len(prompt), len(prompt) + n))
    sampler = Sampler(view.vocab, o.temperature, o.top_k, o.top_p, o.seed)
    scores = sampler.scores(logits, final=True)
    if not sampler.greedy:
        scores = scores + sampler.noise(positions, scores)
    best, top = scores.max(dim=-1)  # (n,), (n,)
    picked = torch.tensor(tokens, device=device)[:, None]  # (n, 1)
    gaps = (best - scores.gather(-1, picked)[:, 0]).double()
    magnitude = torch.maximum(logits.amax(dim=-1).abs(), logits.gather(-1, picked)[:, 0].abs())
    allowed = tie_gap(view.dtype, magnitude.cpu(), o.temperature)
    if not sampler.greedy and (o.top_k is not None or (o.top_p or 1.0) < 1.0):
        # at the edge of the top-k / top-p set rounding decides membership too: filter again with the token's
        # logit raised by the tie gap, and measure its gap inside the set that then admits it
        raised = logits.scatter_add(1, picked, (allowed.to(logits) * o.temperature)[:, None])
        admitted = torch.isfinite(sampler.scores(raised, final=True))
        inside = sampler.scores(logits, final=False) + sampler.noise(positions, logits)
        inside = inside.masked_fill(~admitted, -torch.inf)
        gaps = torch.minimum(gaps, (inside.max(dim=-1).values - inside.gather(-1, picked)[:, 0]).double())
    gaps, top = gaps.cpu(), top.tolist()
    ok = (gaps <= allowed).tolist()
    return Certificate(
        tuple(
            TokenCheck(i, p, t, top[i], g, a, c)
            for i, (p, t, g, a, c) in enumerate(zip(positions, tokens, gaps.tolist(), allowed.tolist(), ok))
        ),
        cert.dtype,
        cert.device,
    )


def trace_tokens(events: list) -> list[int]:
    """A trace's committed tokens (its events, typed by ``parse_events``): DEX's commit records or AR's token
    events, checked against the end event."""
    if not events or not isinstance(events[0], StartEvent):
        raise DexError("not a DEX trace: it must begin with its start event")
    if events[0].method == "dex":
        tokens = [c.token for e in events if isinstance(e, RoundEvent) for c in e.commits]
    else:
        tokens = [e.token for e in events if isinstance(e, TokenEvent)]
    end = events[-1] if isinstance(events[-1], EndEvent) else None
    if end is not None and end.tokens != tokens:
        i = next(
            (i for i, (a, b) in enumerate(zip(end.tokens, tokens)) if a != b),
            min(len(tokens), len(end.tokens)),
        )
        raise DexError(
            f"the trace contradicts itself: its end event's tokens and its "
            f"{'commit records' if events[0].method == 'dex' else 'token events'} differ at token {i}"
        )
    return tokens


def verifier_model(
    events: list,
    meta: dict,
    spec: str | None = None,
    dtype: str | None = None,
    device: str | None = None,
    log=None,
    allow_download: bool = False,
):
    """``(model, tokenizer)`` to verify a trace (its events, plain or typed) with: ``spec`` (default: the model its
    meta names) in ``dtype`` (default: the trace's, float32 for traces that do not record one) on ``device``
    ('auto'/None: the trace's device type when it sampled, so its noise can be redrawn; else
    ``resolve_device('auto')``). A trace's meta can name any model, so one that is not present locally (a hub id
    not in the Hugging Face cache, a named model not yet fetched) is refused unless ``allow_download``; a local
    directory or .gguf file always loads."""
    start = _start(events)
    given, spec = spec, spec or meta.get("model")
    if not isinstance(spec, str) or not spec.strip():
        raise DexError(
            "the trace does not name its model (no 'model' in its meta); pass the model with --model"
        )
    if not allow_download and (missing := missing_locally(spec)):
        raise DexError(
            f"model {spec!r}{'' if given else ', which the trace names,'} is not present locally: {missing}. "
            "dex verify downloads a model only when asked, since a trace can name any model: pass "
            "--allow-download (allow_download=True) to fetch it, or --model with a local copy"
        )
    if device in (None, "auto"):
        device = start.made_on if start.sampling["temperature"] > 0 else "auto"
    kwargs = {} if log is None else {"log": log}
    return load_model(
        spec,
        dtype=dtype or start.dtype or "float32",
        device=resolve_device(device),
        local_files_only=not allow_download,
        **kwargs,
    )


def _start(events: list) -> StartEvent:
    """A trace's start event, typed."""
    start = parse_events(events[:1])
    if not start or not isinstance(start[0], StartEvent):
        raise DexError("not a DEX trace: it must begin with its start event")
    return start[0]


def verify_trace(
    trace,
    meta: dict | None = None,
    *,
    model=None,
    spec: str | None = None,
    dtype: str | None = None,
    device: str | None = None,
    log=None,
    allow_download: bool = False,
) -> Certificate:
    """Certify every committed token of a trace (a saved file's path, or its events and meta), DEX or AR.
    ``model``: an already loaded model in the trace's dtype (``spec``: its name, for messages); else
    ``verifier_model`` loads one (downloading it only with ``allow_download``). A model other than the one that
    made the trace (``check_model``) is refused before any token is checked."""
    if isinstance(trace, (str, Path)):
        events, meta = load_trace(trace)
    else:
        events, meta = list(trace), dict(meta or {})
    events = parse_events(events)  # read once, typed from here on
    tokens = trace_tokens(events)
    start = events[0]
    if model is None:
        model, _ = verifier_model(events, meta, spec, dtype, device, log, allow_download)
    check_model(start, meta, model, spec)
    view = model_view(model)
    wanted = dtype or start.dtype
    if wanted is not None and dtype_name(view.dtype) != wanted:
        raise DexError(
            f"the trace was made in {wanted} but the model given is {dtype_name(view.dtype)}; load it "
            f"with dtype='{wanted}' (the tie gap is that dtype's)"
        )
    sampling = start.sampling
    if sampling["temperature"] > 0 and view.device.type != start.made_on:
        raise DexError(
            f"this sampled trace was made on {start.made_on} and its Gumbel noise comes from that "
            f"device type's generator; verify it on {start.made_on} (--device {start.made_on}), "
            f"not on {view.device.type}"
        )
    _within_vocabulary(start.prompt, tokens, view.vocab)
    options = GenerationOptions(max_new_tokens=max(1, len(tokens)), **sampling)
    return certify_tokens(model, start.prompt, tokens, options)


def _within_vocabulary(prompt: list[int], tokens: list[int], vocab: int) -> None:
    """A trace's prompt and committed token ids are ids of the model's vocabulary, or the trace was made with
    another model (or edited): DexError naming the first id that is not."""
    for what, ids in (("prompt token", prompt), ("committed token", tokens)):
        for i, t in enumerate(ids):
            if not 0 <= t < vocab:
                raise DexError(
                    f"token id {t} ({what} {i}) is outside the model's vocabulary of {vocab} (ids 0 to "
                    f"{vocab - 1}): the trace was made with another model, or edited; verify it with the model "
                    "that made it (--model)"
                )


def _described(identity: dict, weights: bool) -> str:
    """A model's identity in words: its family and shapes (those recorded), and its embedding fingerprint when
    ``weights`` (two models of one shape)."""
    words = {"num_layers": "{} layers", "hidden_size": "hidden {}", "vocab_size": "vocabulary {}"}
    parts = [identity["model_type"]] if "model_type" in identity else []
    parts += [words[k].format(identity[k]) for k in SHAPE_KEYS[1:] if k in identity]
    if weights and "fingerprint" in identity:
        parts.append(f"embedding fingerprint {identity['fingerprint']:.4f}")
    return ", ".join(parts)


def _names(named: str | None, spec: str | None) -> tuple[str, str, str]:
    """How a refusal names the trace's model (``named``: its meta's) and the model given (``spec``, else the one
    the meta names), and which ``--model`` to verify with."""
    given = spec or named
    if named and named == given:  # the name stayed, the model behind it changed
        return f"{named!r} as it was then", f"{named!r} as it loads now", " (--model)"
    made, now = repr(named) if named else "a model", repr(given) if given else "the model given"
    return made, now, f" (--model {named})" if named else " (--model)"


def check_model(start: StartEvent, meta: dict, model, spec: str | None = None) -> None:
    """The trace was made by ``model`` as far as it recorded its model: the identity in its start event (family,
    shapes, embedding fingerprint), or in older traces the number of layers; else DexError naming both models:
    the trace's meta's name and ``spec`` (the model given), with what each is."""
    have = model_identity(model)
    want = start.model or {"num_layers": start.num_layers}
    shapes = all(want[k] == have[k] for k in SHAPE_KEYS if k in want)
    if shapes and ("fingerprint" not in want or same_weights(want["fingerprint"], have["fingerprint"])):
        return
    name = meta.get("model")
    made, now, hint = _names(name if isinstance(name, str) and name.strip() else None, spec)
    raise DexError(
        f"the trace was made by another model: {made} ({_described(want, shapes)}), not {now} "
        f"({_described(have, shapes)}); verify it with the model that made it{hint}"
    )
