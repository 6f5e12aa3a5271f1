"""A model's weights on disk, read one tensor at a time: where a model spec's safetensors checkpoint lies,
which file holds each key, and reads that memory-map the file instead of loading it.

``locate`` turns a model spec into a local folder holding ``config.json`` and safetensors weights: the
default model and any ``.gguf`` file are converted once into the DEX cache (``dex_core.model.gguf``), a
hub id is fetched once into the Hugging Face cache (its safetensors, configs and tokenizer files only);
``missing_locally`` says beforehand whether a spec would be downloaded. A
``Checkpoint`` reads a single ``model.safetensors`` or a sharded one through its index
(``model.safetensors.index.json``: key -> file). ``read`` returns a CPU tensor backed by the file's pages (no
copy: the pages are read when the tensor is used, and the OS may drop them again), or only some of its rows.
"""

from __future__ import annotations

import json
import os
from functools import cached_property
from pathlib import Path

import huggingface_hub
import torch
from huggingface_hub import constants
from huggingface_hub.errors import LocalEntryNotFoundError, OfflineModeIsEnabled, RepositoryNotFoundError
from huggingface_hub.utils import HFValidationError, validate_repo_id
from safetensors import SafetensorError, safe_open

from ..config import DexError
from .gguf import cache_dir, converted, prepare_gguf, prepare_named
from .named import NAMED, installed, named_model

HUB_TIMEOUT = 5.0  # seconds for the hub to answer whether it has a model
WEIGHTS = "model.safetensors"
INDEX = "model.safetensors.index.json"
HUB_FILES = ["*.json", "*.safetensors", "*.model", "*.txt", "*.tiktoken", "*.jinja"]  # no .bin, no .pt


def _hub_offline() -> bool:
    """HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE, read now (huggingface_hub reads them once, at import)."""
    names = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    return constants.HF_HUB_OFFLINE or any(
        os.environ.get(n, "").strip().lower() in ("1", "true", "yes", "on") for n in names
    )


def check_hub(repo_id: str, timeout: float = HUB_TIMEOUT) -> None:
    """Fail fast with a clear message when a hub id is malformed, or not cached and the hub is offline,
    unreachable or without that model. The hub is asked through ``huggingface_hub`` (``HfApi.model_info``),
    so HF_ENDPOINT, HF_TOKEN and proxies (HTTPS_PROXY) apply as they do to the download itself."""
    try:
        validate_repo_id(repo_id)
    except HFValidationError:
        raise DexError(
            f"model {repo_id!r:.120} is not a local directory or .gguf file, nor a Hugging Face hub "
            f"id like 'org/name'"
        ) from None
    if isinstance(huggingface_hub.try_to_load_from_cache(repo_id, "config.json"), str):
        return
    offline = (
        f"model {repo_id!r} is not in the local Hugging Face cache and HF_HUB_OFFLINE is set; "
        f"pass a local directory or .gguf file, or a named model ({', '.join(NAMED)})"
    )
    if _hub_offline():
        raise DexError(offline)
    try:
        huggingface_hub.HfApi().model_info(repo_id, timeout=timeout)
    except OfflineModeIsEnabled:
        raise DexError(offline) from None
    except RepositoryNotFoundError:  # also a private or gated model the token does not grant
        raise DexError(
            f"model {repo_id!r} is not a local directory or .gguf file, and the Hugging Face hub "
            f"({constants.ENDPOINT}) has no model by that name that you may read; check the name, "
            f"or log in (hf auth login, or HF_TOKEN) for a private model"
        ) from None
    except Exception as err:  # no route, DNS, proxy, TLS, timeout, a server error: the hub cannot tell
        reason = str(err).strip().splitlines()[0][:160] if str(err).strip() else type(err).__name__
        raise DexError(
            f"model {repo_id!r} is not a local directory or .gguf file, and the Hugging Face hub "
            f"({constants.ENDPOINT}) cannot be reached ({reason}); download the model where the "
            f"hub is reachable and pass its directory, or use a named model ({', '.join(NAMED)})"
        ) from None


def hub_config(repo_id: str) -> Path:
    """The folder holding hub model ``repo_id``'s ``config.json``: the Hugging Face cache's copy when it holds
    one (the hub is not asked), else that one file fetched after ``check_hub`` (so an offline or unreachable
    hub is one clear error at once, not huggingface_hub's retries)."""
    check_hub(repo_id)  # returns at once when the cache holds the config
    cached = huggingface_hub.try_to_load_from_cache(repo_id, "config.json")
    path = cached if isinstance(cached, str) else huggingface_hub.hf_hub_download(repo_id, "config.json")
    return Path(path).parent


def is_hub_id(spec) -> bool:
    """Whether model spec ``spec`` names a hub model ('org/name'), not a named model, a .gguf file or a folder."""
    return (
        isinstance(spec, str)
        and bool(spec.strip())
        and spec not in NAMED
        and not spec.endswith(".gguf")
        and not os.path.isdir(spec)
        and not spec.startswith((".", "/", "~"))
        and spec.count("/") <= 1
    )


def missing_locally(spec) -> str | None:
    """Why loading model ``spec`` would download it (what is missing here); None when it downloads nothing:
    a local directory or .gguf file, a named model already converted into the DEX cache or installed, a hub id
    whose snapshot the Hugging Face cache holds (``snapshot_download(local_files_only=True)``, which asks the hub
    nothing). A malformed spec is None too: loading it names the problem and downloads nothing."""
    named = named_model(spec)
    if named is not None:
        if converted(named) or installed(named):
            return None
        return (
            f"neither converted in the DEX cache ({cache_dir()}) nor installed (pip package "
            f"{named.packages[0]}, about {named.download_mb} MB)"
        )
    if not is_hub_id(spec):
        return None
    try:
        validate_repo_id(spec)
        huggingface_hub.snapshot_download(spec, allow_patterns=HUB_FILES, local_files_only=True)
    except HFValidationError:
        return None
    except LocalEntryNotFoundError:
        return f"not in the local Hugging Face cache ({constants.HF_HUB_CACHE})"
    return None


def locate(spec: str, log) -> Path:
    """The local folder of model ``spec`` (a named model, a directory, a .gguf file or a hub id) with its
    config and safetensors weights; DexError says what is missing."""
    if not isinstance(spec, str) or not spec.strip():
        raise DexError(
            f"model must be a named model, a local directory, a .gguf file or a hub id; got {spec!r}"
        )
    if named_model(spec):
        return prepare_named(named_model(spec), log)
    if spec.endswith(".gguf"):
        if not os.path.isfile(spec):  # os.path: False, not an error, for names that cannot exist
            raise DexError(f"no such GGUF file: {spec}")
        return prepare_gguf(Path(spec), log)
    if os.path.isdir(spec):
        if not os.path.isfile(Path(spec) / "config.json"):
            raise DexError(f"{spec} is a directory without config.json; point --model at a saved model")
        return Path(spec)
    if not is_hub_id(spec):  # a path, not an 'org/name' hub id
        raise DexError(f"no such model directory or file: {spec}")
    check_hub(spec)
    log(f"fetching {spec} from the Hugging Face hub (safetensors, configs and tokenizer; cached once)")
    return Path(huggingface_hub.snapshot_download(spec, allow_patterns=HUB_FILES))


class Checkpoint:
    """The safetensors weights in ``folder``: one file, or shards listed by an index."""

    def __init__(self, folder):
        self.folder = Path(folder)
        index = self.folder / INDEX
        if index.is_file():
            try:
                weight_map = json.loads(index.read_text())["weight_map"]
            except (ValueError, KeyError, TypeError):
                raise DexError(
                    f"{index} is not a safetensors index (no 'weight_map'); save the model again"
                ) from None
            self.files = {key: self.folder / name for key, name in weight_map.items()}
        elif (self.folder / WEIGHTS).is_file():
            self.files = dict.fromkeys(self._keys(self.folder / WEIGHTS), self.folder / WEIGHTS)
        else:
            raise DexError(
                f"{self.folder} holds no safetensors weights ({WEIGHTS} or {INDEX}); explorers read "
                "their stage from safetensors files: save the model with save_pretrained "
                "(safe_serialization, the default) and point --model at that folder"
            )
        missing = sorted({str(p.name) for p in self.files.values() if not p.is_file()})
        if missing:
            raise DexError(
                f"{self.folder}: the index names {', '.join(missing[:3])}, which are missing; download "
                "the model again"
            )

    @staticmethod
    def _keys(path: Path) -> list[str]:
        try:
            with safe_open(str(path), "pt") as fh:
                return list(fh.keys())
        except (SafetensorError, OSError) as err:
            raise DexError(
                f"{path} is not a readable safetensors file ({err}); download the model again"
            ) from None

    def keys(self) -> list[str]:
        return list(self.files)

    @cached_property
    def shapes(self) -> dict[str, tuple[tuple[int, ...], str]]:
        """Every key's (shape, safetensors dtype), from the files' headers alone."""
        out = {}
        for path in sorted(set(self.files.values())):
            with safe_open(str(path), "pt") as fh:
                for key in fh.keys():
                    piece = fh.get_slice(key)
                    out[key] = (tuple(piece.get_shape()), piece.get_dtype())
        return out

    def read(self, key: str, rows=None) -> torch.Tensor:
        """Tensor ``key`` (memory-mapped, on the CPU), or only its rows ``rows`` in that order (one read per
        run of consecutive rows)."""
        if key not in self.files:
            raise DexError(f"{self.folder} has no tensor {key!r}; the checkpoint does not match its config")
        with safe_open(str(self.files[key]), "pt") as fh:
            if rows is None:
                return fh.get_tensor(key)
            piece = fh.get_slice(key)
            order = sorted(set(rows))
            runs, start = [], 0
            for i in range(1, len(order) + 1):
                if i == len(order) or order[i] != order[i - 1] + 1:
                    runs.append(piece[order[start] : order[i - 1] + 1])
                    start = i
        sorted_rows = torch.cat(runs)  # (len(order), ...), a copy of just these rows
        where = {r: i for i, r in enumerate(order)}
        return sorted_rows[torch.tensor([where[r] for r in rows], dtype=torch.long, device="cpu")]
