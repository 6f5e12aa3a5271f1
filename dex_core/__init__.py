"""DEX: Depth Exploration Decoding over Hugging Face causal LMs. In float32/float64 its tokens are identical to
autoregressive decoding's (``ar_generate``; greedy: HF ``generate``); in bfloat16/float16 each committed token is
the unmodified model's choice or a numerical near-tie of it, which ``verify_trace`` (``dex verify``) certifies
token by token.

The face resolves every public name through one table on first use (PEP 562): ``import dex_core`` loads nothing,
so ``import dex_core.trace`` (what viewers and the app's trace worker read) brings neither torch nor FastAPI, and a
name loads only the part of the library it lives in."""

import importlib

# public name -> where it is defined: module (relative to this package) and name
_FACE = {
    "DecoderOptions": "config.DecoderOptions",
    "DexConfig": "config.DexConfig",
    "DexError": "config.DexError",
    "GenerationOptions": "config.GenerationOptions",
    "resolve_depths": "config.resolve_depths",
    "DexDecoder": "decoder.DexDecoder",
    "ExplorerError": "distributed.group.ExplorerError",
    "load_model": "model.load.load_model",
    "shipped_adapters": "model.named.shipped_adapters",
    "UnsupportedModelError": "model.view.UnsupportedModelError",
    "ar_generate": "runtime.reference.ar_generate",
    "ar_stream": "runtime.reference.ar_stream",
    "hf_greedy": "runtime.reference.hf_greedy",
    "GenerationConfigWarning": "runtime.request.GenerationConfigWarning",
    "encode_prompt": "runtime.request.encode_prompt",
    "GenerationResult": "runtime.results.GenerationResult",
    "GenerationStats": "trace.stats.GenerationStats",
    "DecoderPool": "serving.pool.DecoderPool",
    "bounded_connections": "serving.connections.bounded_connections",
    "MAX_BODY_BYTES": "serving.api_requests.MAX_BODY_BYTES",
    "BODY_SECONDS": "serving.api_requests.BODY_SECONDS",
    "hf_generate_dir": "serving.hf_generate.hf_generate_dir",
    "Certificate": "evaluation.verify.Certificate",
    "certify_tokens": "evaluation.verify.certify_tokens",
    "verify_trace": "evaluation.verify.verify_trace",
    "TRACE_VERSION": "trace.schema.TRACE_VERSION",
    "load_trace": "trace.files.load_trace",
    "save_trace": "trace.files.save_trace",
    "openai_app": "serving.api.make_app",  # the FastAPI app factory, under the name users know
}

__all__ = sorted(_FACE)


def __getattr__(name: str):
    if name not in _FACE:
        raise AttributeError(f"module 'dex_core' has no attribute {name!r}")
    module, attr = _FACE[name].rsplit(".", 1)
    value = getattr(importlib.import_module(f".{module}", __name__), attr)
    globals()[name] = value  # resolved once
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
