"""DEX: Depth Exploration Decoding over Hugging Face causal LMs. In float32/float64 its tokens are identical to
autoregressive decoding's (``ar_generate``; greedy: HF ``generate``); in bfloat16/float16 each committed token is
the unmodified model's choice or a numerical near-tie of it, which ``verify_trace`` (``dex verify``) certifies
token by token.

The face resolves every public name through one table on first use (PEP 562): ``import dex_core`` loads nothing,
so ``import dex_core.trace`` (what viewers and the app's trace worker read) brings neither torch nor FastAPI, and a
name loads only the part of the library it lives in."""

import importlib

# public name -> the module (relative to this package) that defines it
_FACE = {
    "DecoderOptions": "config",
    "DexConfig": "config",
    "DexError": "config",
    "GenerationOptions": "config",
    "resolve_depths": "config",
    "DexDecoder": "decoder",
    "ExplorerError": "distributed.group",
    "load_model": "model.load",
    "shipped_adapters": "model.named",
    "UnsupportedModelError": "model.view",
    "ar_generate": "runtime.reference",
    "ar_stream": "runtime.reference",
    "hf_greedy": "runtime.reference",
    "GenerationConfigWarning": "runtime.request",
    "encode_prompt": "runtime.request",
    "GenerationResult": "runtime.results",
    "GenerationStats": "runtime.results",
    "hf_generate_dir": "serving.hf_generate",
    "Certificate": "evaluation.verify",
    "certify_tokens": "evaluation.verify",
    "verify_trace": "evaluation.verify",
    "TRACE_VERSION": "trace.schema",
    "load_trace": "trace.events",
    "save_trace": "trace.events",
}
_RENAMED = {"openai_app": ("serving.api", "make_app")}  # the FastAPI app factory, under the name users know

__all__ = sorted([*_FACE, *_RENAMED])


def __getattr__(name: str):
    if name in _FACE:
        module, attr = _FACE[name], name
    elif name in _RENAMED:
        module, attr = _RENAMED[name]
    else:
        raise AttributeError(f"module 'dex_core' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), attr)
    globals()[name] = value  # resolved once
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
