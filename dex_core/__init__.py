"""DEX: Depth Exploration Decoding over Hugging Face causal LMs (exact to autoregressive decoding)."""

from .config import DexConfig, DexError, resolve_depths
from .engine import DexDecoder, GenerationResult, GenerationStats, ar_generate, ar_stream
from .models import UnsupportedModelError, load_model
from .trace import TRACE_VERSION, load_trace, save_trace

__all__ = [
    "DexConfig", "DexDecoder", "DexError", "GenerationResult", "GenerationStats", "TRACE_VERSION",
    "UnsupportedModelError", "ar_generate", "ar_stream", "load_model", "load_trace", "resolve_depths", "save_trace",
]
