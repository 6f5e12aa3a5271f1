"""DEX: Depth Exploration Decoding over Hugging Face causal LMs. In float32/float64 its tokens are identical to
autoregressive decoding's (``ar_generate``; greedy: HF ``generate``); in bfloat16/float16 each committed token is
the unmodified model's choice or a numerical near-tie of it, which ``verify_trace`` (``dex verify``) certifies
token by token."""

from .config import DecoderOptions, DexConfig, DexError, GenerationOptions, resolve_depths
from .decoder import DexDecoder
from .distributed.group import ExplorerError
from .evaluation.verify import Certificate, certify_tokens, verify_trace
from .model.load import load_model
from .model.named import shipped_adapters
from .model.view import UnsupportedModelError
from .runtime.reference import ar_generate, ar_stream, hf_greedy
from .runtime.request import GenerationConfigWarning, encode_prompt
from .runtime.results import GenerationResult, GenerationStats
from .serving.hf_generate import hf_generate_dir
from .trace.events import TRACE_VERSION, load_trace, save_trace

__all__ = [
    "Certificate",
    "DecoderOptions",
    "DexConfig",
    "DexDecoder",
    "DexError",
    "ExplorerError",
    "GenerationOptions",
    "GenerationResult",
    "GenerationStats",
    "TRACE_VERSION",
    "UnsupportedModelError",
    "ar_generate",
    "ar_stream",
    "encode_prompt",
    "hf_generate_dir",
    "openai_app",
    "hf_greedy",
    "load_model",
    "load_trace",
    "resolve_depths",
    "save_trace",
    "shipped_adapters",
    "certify_tokens",
    "verify_trace",
    "GenerationConfigWarning",
]


def __getattr__(name: str):
    """``openai_app``: ``dex_core.serving.api.make_app``, imported on first use (FastAPI and uvicorn load
    only where HTTP is served)."""
    if name == "openai_app":
        from .serving.api import make_app

        return make_app
    raise AttributeError(f"module 'dex_core' has no attribute {name!r}")
