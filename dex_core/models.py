"""Loading whole causal LMs (the default, a directory, a .gguf file, a hub id) and their stage view.

The stage view exposes what an explorer needs from a Hugging Face decoder-only model without forking
its modeling code: the embeddings, the decoder layers ``model.model.layers[i]`` (called directly with
explicit masks, positions and a duck-typed cache), the rotary embedding, the final norm and LM head.
"""

from __future__ import annotations

import inspect
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from .checkpoint import check_hub, is_hub_id, locate
from .config import DexError, parse_device
from .device import check_dtype, dtype_name, resolve_dtype

SUPPORTED_TYPES = ("llama", "mistral", "qwen2", "qwen3")


class UnsupportedModelError(DexError):
    pass


def _log(msg: str) -> None:
    print(f"[dex] {msg}", file=sys.stderr, flush=True)


def resolve_device(spec: str | torch.device = "auto") -> torch.device:
    """The device that option value ``spec`` names: 'auto' is CUDA (torch's current device) when torch sees a
    GPU, else the CPU; 'cuda' / 'cuda:N' must exist (DexError saying what to use instead); 'cpu' is the CPU."""
    name = parse_device(str(spec) if isinstance(spec, torch.device) else spec)
    if name == "cpu" or (name == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise DexError(f"--device {name}: no CUDA device is visible to torch (torch.cuda.is_available() is "
                       f"False); use --device cpu or auto")
    count = torch.cuda.device_count()
    index = torch.cuda.current_device() if ":" not in name else int(name.split(":")[1])
    if index >= count:
        raise DexError(f"--device {name}: torch sees {count} CUDA device(s), cuda:0..cuda:{count - 1}; use one "
                       f"of them, or --device cpu")
    return torch.device("cuda", index)


def load_model(spec: str = "default", dtype: str | torch.dtype | None = "auto", device: str | torch.device = "auto",
               log=_log):
    """Return ``(model, tokenizer)`` for 'default', a local directory, a .gguf file or a hub id, the whole model
    in one process, in ``dtype`` (``resolve_dtype``: 'auto' is float32 on CPU, the checkpoint's half precision on
    CUDA) on ``device`` (``resolve_device``: 'auto' is CUDA when available). ``log`` gets one line per stage
    that takes a while (fetching, converting, loading weights); stderr by default. The default model and
    .gguf files are converted once into the DEX cache (``checkpoint.locate``) and read from there."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    device = resolve_device(device)  # before any work: a missing GPU is a bad option, not a late crash
    check_dtype(dtype)
    if is_hub_id(spec):
        source = spec  # from_pretrained fetches it (any weight format) into the HF cache
        check_hub(spec)
    else:
        source = locate(spec, log)
    try:
        config = AutoConfig.from_pretrained(source)
        dtype = resolve_dtype(dtype, device.type, config)
        log(f"loading {spec} ({dtype_name(dtype)}, {device})")
        tokenizer = AutoTokenizer.from_pretrained(source)
        model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype)
    except Exception as err:  # model files are untrusted input: any failure to parse them is a bad model
        reason = str(err).strip().splitlines()[0][:200] if str(err).strip() else type(err).__name__
        where = ("its files are missing, corrupt or inconsistent" if isinstance(source, Path)  # local files
                 else "not a local model and the Hugging Face hub could not provide it")
        again = f"; delete {source} to convert it again" if spec == "default" else ""
        raise DexError(f"could not load model {spec!r}: {where} ({reason}){again}") from None
    check_supported(model)
    return model.eval().to(device), tokenizer


def load_tokenizer(folder, spec: str | None = None):
    """The tokenizer of the model in ``folder`` (``spec`` names the model in errors) and nothing else of it."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(folder)
    except Exception as err:  # model files are untrusted input
        reason = str(err).strip().splitlines()[0][:200] if str(err).strip() else type(err).__name__
        raise DexError(f"could not load the tokenizer of model {spec or str(folder)!r}: its files are missing, "
                       f"corrupt or inconsistent ({reason})") from None


def tiny_model(family: str = "llama", layers: int = 6, vocab: int = 96, seed: int = 0, **overrides):
    """A tiny random float64 model of a supported family, built offline from a config (tests, --quick)."""
    from transformers import (LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM,
                              Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM)

    classes = {"llama": (LlamaConfig, LlamaForCausalLM), "mistral": (MistralConfig, MistralForCausalLM),
               "qwen2": (Qwen2Config, Qwen2ForCausalLM), "qwen3": (Qwen3Config, Qwen3ForCausalLM)}
    config_cls, model_cls = classes[family]
    kwargs = dict(vocab_size=vocab, hidden_size=48, intermediate_size=96, num_hidden_layers=layers,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                  bos_token_id=None, eos_token_id=None, pad_token_id=None)
    kwargs.update(overrides)
    torch.manual_seed(seed)
    model = model_cls(config_cls(**kwargs)).to(torch.float64).eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = None
    return model


def tiny_tokenizer(vocab: int = 96):
    """A word-level tokenizer over 'w0'..'w{n}' plus a few English words (offline, no files)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["[UNK]", "hello", "world", "the", "a", "prime", "number"]
    words += [f"w{i}" for i in range(vocab - len(words))]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]")


def check_supported(model) -> None:
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if model_type not in SUPPORTED_TYPES or not hasattr(getattr(model, "model", None), "layers"):
        raise UnsupportedModelError(
            f"{type(model).__name__} (model_type {model_type!r}) is not supported; DEX runs "
            f"decoder-only models of types {', '.join(SUPPORTED_TYPES)}")


def _layer_window(config, i: int) -> int | None:
    types = getattr(config, "layer_types", None)
    window = getattr(config, "sliding_window", None)
    if types:
        return window if types[i] == "sliding_attention" else None
    return window


@dataclass
class ModelView:
    """What explorers take from a model: its parts and the facts needed to drive its layers."""

    model: torch.nn.Module
    num_layers: int
    vocab: int
    kv_heads: int
    head_dim: int
    max_positions: int | None
    windows: list[int | None]  # sliding window per layer (None: full attention)
    cache_kwarg: str  # the name the decoder layers take their cache under

    @property
    def layers(self):
        return self.model.model.layers

    @property
    def dtype(self) -> torch.dtype:
        return self.model.model.norm.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.model.model.norm.weight.device

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.model.model.embed_tokens(tokens)

    def rotary(self, hidden: torch.Tensor, positions: torch.Tensor):
        return self.model.model.rotary_emb(hidden, position_ids=positions)

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        """Final norm + LM head: hidden (..., h) -> logits (..., vocab)."""
        return self.model.lm_head(self.model.model.norm(hidden))


def model_view(model) -> ModelView:
    check_supported(model)
    cfg = model.config
    num_layers = len(model.model.layers)
    params = inspect.signature(model.model.layers[0].forward).parameters
    cache_kwarg = next((n for n in ("cache", "past_key_values", "past_key_value") if n in params), None)
    if cache_kwarg is None:
        raise UnsupportedModelError(f"{type(model).__name__}: its decoder layers take no cache argument")
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    return ModelView(
        model=model,
        num_layers=num_layers,
        vocab=model.lm_head.out_features,
        kv_heads=getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads,
        head_dim=head_dim,
        max_positions=getattr(cfg, "max_position_embeddings", None),
        windows=[_layer_window(cfg, i) for i in range(num_layers)],
        cache_kwarg=cache_kwarg,
    )
