"""Loading causal LMs (the default, a directory, a .gguf file, a hub id) and their stage view.

The stage view exposes what an explorer needs from a Hugging Face decoder-only model without forking
its modeling code: the embeddings, the decoder layers ``model.model.layers[i]`` (called directly with
explicit masks, positions and a duck-typed cache), the rotary embedding, the final norm and LM head.
"""

from __future__ import annotations

import inspect
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from .config import DTYPES, DexError, parse_device
from .default_model import prepare_default
from .device import dtype_name

SUPPORTED_TYPES = ("llama", "mistral", "qwen2", "qwen3")
HUB_TIMEOUT = 5.0  # seconds for the hub to answer whether it has a model


class UnsupportedModelError(DexError):
    pass


def _log(msg: str) -> None:
    print(f"[dex] {msg}", file=sys.stderr, flush=True)


def _hub_offline() -> bool:
    """HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE, read now (huggingface_hub reads them once, at import)."""
    from huggingface_hub import constants

    names = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    return constants.HF_HUB_OFFLINE or any(os.environ.get(n, "").strip().lower() in ("1", "true", "yes", "on")
                                           for n in names)


def _check_hub(repo_id: str, timeout: float = HUB_TIMEOUT) -> None:
    """Fail fast with a clear message when a hub id is malformed, or not cached and the hub is offline,
    unreachable or without that model. The hub is asked through ``huggingface_hub`` (``HfApi.model_info``),
    so HF_ENDPOINT, HF_TOKEN and proxies (HTTPS_PROXY) apply as they do to the download itself."""
    from huggingface_hub import HfApi, constants, try_to_load_from_cache
    from huggingface_hub.errors import OfflineModeIsEnabled, RepositoryNotFoundError
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(repo_id)
    except HFValidationError:
        raise DexError(f"model {repo_id!r:.120} is not a local directory or .gguf file, nor a Hugging Face hub "
                       f"id like 'org/name'") from None
    if isinstance(try_to_load_from_cache(repo_id, "config.json"), str):
        return
    offline = (f"model {repo_id!r} is not in the local Hugging Face cache and HF_HUB_OFFLINE is set; "
               f"pass a local directory or .gguf file, or 'default'")
    if _hub_offline():
        raise DexError(offline)
    try:
        HfApi().model_info(repo_id, timeout=timeout)
    except OfflineModeIsEnabled:
        raise DexError(offline) from None
    except RepositoryNotFoundError:  # also a private or gated model the token does not grant
        raise DexError(f"model {repo_id!r} is not a local directory or .gguf file, and the Hugging Face hub "
                       f"({constants.ENDPOINT}) has no model by that name that you may read; check the name, "
                       f"or log in (hf auth login, or HF_TOKEN) for a private model") from None
    except Exception as err:  # no route, DNS, proxy, TLS, timeout, a server error: the hub cannot tell
        reason = str(err).strip().splitlines()[0][:160] if str(err).strip() else type(err).__name__
        raise DexError(f"model {repo_id!r} is not a local directory or .gguf file, and the Hugging Face hub "
                       f"({constants.ENDPOINT}) cannot be reached ({reason}); download the model where the "
                       f"hub is reachable and pass its directory, or use 'default'") from None


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


def load_model(spec: str = "default", dtype: str | torch.dtype | None = None, device: str | torch.device = "auto",
               log=_log):
    """Return ``(model, tokenizer)`` for 'default', a local directory, a .gguf file or a hub id, the model in
    ``dtype`` on ``device`` (``resolve_device``: 'auto' is CUDA when available). ``log`` gets one line per stage
    that takes a while (fetching, converting, loading weights); stderr by default."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not isinstance(spec, str) or not spec.strip():
        raise DexError(f"model must be 'default', a local directory, a .gguf file or a hub id; got {spec!r}")
    if isinstance(dtype, str):
        if dtype not in DTYPES:
            raise DexError(f"dtype must be one of {', '.join(DTYPES)}; got {dtype!r}")
        dtype = getattr(torch, dtype)
    dtype = dtype or torch.float32
    device = resolve_device(device)  # before any work: a missing GPU is a bad option, not a late crash
    kwargs: dict = {}
    if spec == "default":
        source = prepare_default(log)
    elif spec.endswith(".gguf"):
        path = Path(spec)
        if not os.path.isfile(path):  # os.path: False, not an error, for names that cannot exist
            raise DexError(f"no such GGUF file: {spec}")
        source, kwargs = path.parent, {"gguf_file": path.name}
    elif os.path.isdir(spec):
        source = Path(spec)
        if not os.path.isfile(source / "config.json"):
            raise DexError(f"{spec} is a directory without config.json; point --model at a saved model")
    elif spec.startswith((".", "/", "~")) or spec.count("/") > 1:  # a path, not an 'org/name' hub id
        raise DexError(f"no such model directory or file: {spec}")
    else:
        source = spec
        _check_hub(spec)
    log(f"loading {spec} ({dtype_name(dtype)}, {device})")
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, **kwargs)
        model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, **kwargs)
    except Exception as err:  # model files are untrusted input: any failure to parse them is a bad model
        reason = str(err).strip().splitlines()[0][:200] if str(err).strip() else type(err).__name__
        where = ("its files are missing, corrupt or inconsistent" if isinstance(source, Path)  # local files
                 else "not a local model and the Hugging Face hub could not provide it")
        again = f"; delete {source} to convert it again" if spec == "default" else ""
        raise DexError(f"could not load model {spec!r}: {where} ({reason}){again}") from None
    check_supported(model)
    return model.eval().to(device), tokenizer


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
