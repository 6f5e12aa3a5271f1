"""DEX: Depth Exploration Decoding over Hugging Face causal LMs (exact to autoregressive decoding)."""

from .config import DecoderOptions, DexConfig, DexError, GenerationOptions, resolve_depths
from .decoder import DexDecoder
from .group import ExplorerError
from .models import UnsupportedModelError, load_model
from .reference import ar_generate, ar_stream, hf_greedy
from .request import encode_prompt
from .results import GenerationResult, GenerationStats
from .trace import TRACE_VERSION, load_trace, save_trace

__all__ = [
    "DecoderOptions", "DexConfig", "DexDecoder", "DexError", "ExplorerError", "GenerationOptions",
    "GenerationResult", "GenerationStats", "TRACE_VERSION", "UnsupportedModelError", "ar_generate", "ar_stream",
    "encode_prompt", "hf_greedy", "load_model", "load_trace", "resolve_depths", "save_trace",
]
