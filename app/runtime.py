"""The app's server-side state and option handling: server settings, UI values to a validated config, and
one shared, read-only model per process, loaded on first use.

Sessions keep only plain trace records (in ``gr.State``); the model, its tokenizer and distributed
explorer groups live here. Model work is serialized by the app's event concurrency settings.
"""

from __future__ import annotations

import atexit
import math
import os
import shutil
import tempfile
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, fields, replace
from pathlib import Path

from dex_core import (DecoderOptions, DexConfig, DexDecoder, DexError, GenerationOptions, encode_prompt, load_model)
from dex_core.adapters import choose_depths
from dex_core.profile import measure_profile
from dex_core.config import DEVICE_HELP, flag, integer, option


@dataclass
class AppSettings:
    """Server settings: command-line flags, else the environment (``env``), else the defaults."""

    model: str = option(DexConfig.model, "model spec (as for dex generate)", env="DEX_MODEL")
    explorers: int = option(DecoderOptions.explorers, "K the controls start at", env="DEX_EXPLORERS")
    backend: str = option(DecoderOptions.backend, "sequential or distributed", env="DEX_BACKEND")
    dtype: str = option(DexConfig.dtype, "model dtype", env="DEX_DTYPE")
    device: str = option(DexConfig.device, DEVICE_HELP + " (distributed: one device of that kind per explorer)",
                         env="DEX_DEVICE")
    host: str | None = option(None, "address to serve on (default: $GRADIO_SERVER_NAME or 127.0.0.1; "
                                    "0.0.0.0 serves a network)")
    port: int | None = option(None, "port (default: $GRADIO_SERVER_PORT or 7860)")
    max_groups: int = option(1, "distributed: explorer groups kept alive at once (least recently used closed first)",
                             env="DEX_MAX_GROUPS")
    queue_size: int = option(16, "requests waiting in the queue at most; more are refused", env="DEX_QUEUE_SIZE")
    session_ttl: int = option(3600, "seconds a browser session's traces are kept after it closes",
                              env="DEX_SESSION_TTL")

    def __post_init__(self):
        self.device = DexConfig(model=self.model, explorers=self.explorers, backend=self.backend, dtype=self.dtype,
                                device=self.device).device
        for name in ("max_groups", "queue_size", "session_ttl"):
            integer(getattr(self, name), name, 1)

    @classmethod
    def from_env(cls, environ=None) -> AppSettings:
        environ = os.environ if environ is None else environ
        values = {}
        for f in fields(cls):
            raw = environ.get(f.metadata.get("env") or "")
            if raw:
                try:
                    values[f.name] = int(raw) if "int" in str(f.type) else raw
                except ValueError:
                    raise DexError(f"{f.metadata['env']} must be an integer; got {raw!r}") from None
        return cls(**values)


def _real(value, name: str, kind: str = "a finite number") -> float:
    """A UI number: sliders and number boxes send floats, API clients may send text; finite, or DexError."""
    number = value
    if isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            number = None
    try:
        finite = not isinstance(number, bool) and isinstance(number, (int, float)) and math.isfinite(number)
    except OverflowError:  # an int too large for a float
        finite = False
    if not finite:
        raise DexError(f"{name} must be {kind}; got {value!r:.80}")
    return float(number)


def _whole(value, name: str, cls=None) -> int:
    """A UI number that must be a whole number, within its control's range when ``cls`` declares one."""
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    else:
        number = _real(value, name, "a whole number")
        if number != int(number):
            raise DexError(f"{name} must be a whole number; got {value!r:.80}")
        number = int(number)
    offered = control(cls, name) if cls else {}
    low, high = offered.get("minimum"), offered.get("maximum")
    if (low is not None and number < low) or (high is not None and number > high):
        raise DexError(f"{name} must be between {low} and {high} in this app; got {value!r:.40}")
    return number


def ui_config(*, chat=True, explorers=DecoderOptions.explorers, depths="", adapters=True, decs=True,
              sample=False, temperature=1.0, top_k=0, top_p=1.0, seed=0,
              max_new_tokens=DexConfig.max_new_tokens, prune=DecoderOptions.prune) -> DexConfig:
    """The app's control values -> a validated DexConfig (DexError on bad input).

    Off-values of the controls: greedy unless ``sample``; ``top_k`` 0 and ``top_p`` 1 mean off; an
    empty ``depths`` box means a uniform split of ``explorers``; the adapters box picks 'auto' or 'none';
    ``prune`` is one of ``PRUNE_CHOICES``.
    Explorers and max_new_tokens must lie in the range their sliders offer (``ui_min``/``ui_max``).
    """
    if prune not in PRUNE_CHOICES:
        raise DexError(f"lattice pruning must be one of {', '.join(PRUNE_CHOICES)}; got {str(prune)!r:.40}")
    sample = flag(sample, "sample")
    top_k = _whole(top_k, "top_k") if sample else 0
    top_p = _real(top_p, "top_p") if sample else 1.0
    return DexConfig(
        chat=chat, explorers=_whole(explorers, "explorers", DecoderOptions),
        depths=depths.strip() or None if isinstance(depths, str) else depths,
        adapters="auto" if flag(adapters, "adapters") else "none", decs=decs,
        temperature=_real(temperature, "temperature") if sample else 0.0, top_k=top_k or None,
        top_p=None if top_p == 1.0 else top_p, seed=_whole(seed, "seed"),
        max_new_tokens=_whole(max_new_tokens, "max_new_tokens", GenerationOptions), trace_top=TRACE_TOP, prune=prune)


def control(cls, name: str) -> dict:
    """What a UI control for field ``name`` of ``cls`` shows: default, help, and the offered range."""
    f = cls.__dataclass_fields__[name]
    return {"value": f.default, "info": f.metadata["help"], "minimum": f.metadata.get("ui_min"),
            "maximum": f.metadata.get("ui_max")}


TRACE_TOP = 5  # top candidates per lattice node the Debugger shows
SLOW_SECONDS = 60  # a Live run expected to take longer gets a warning
PRUNE_CHOICES = ("auto", "none", "1", "2", "4")  # the Live tab's lattice pruning menu (DecoderOptions.prune)
QUIET = {"api_visibility": "undocumented"}  # event options: UI plumbing, not part of the documented API
HUSH = {**QUIET, "show_progress": "hidden"}  # and quick: no progress overlay over the panels it redraws


class Runtime:
    def __init__(self, settings: AppSettings | None = None):
        self.settings = settings or AppSettings.from_env()
        self._lock = threading.Lock()
        self._model = self._tokenizer = None
        self._groups: OrderedDict[tuple, DexDecoder] = OrderedDict()  # least recently used first
        self._files: Path | None = None  # saved traces and graphs handed to browsers, pruned by age
        self._profiles: dict[int, dict] = {}  # seconds profiles by proposal-head rows

    @property
    def loaded(self) -> bool:
        return self._model is not None

    def model(self, log=None):
        """(model, tokenizer), loading them on first use (the default model is fetched and cached once);
        ``log`` gets a line per loading stage (fetch, convert, load) when this call loads the model."""
        with self._lock:
            if self._model is None:
                more = {"log": log} if log is not None else {}
                self._model, self._tokenizer = load_model(self.settings.model, dtype=self.settings.dtype,
                                                          device=self.settings.device, **more)
            return self._model, self._tokenizer

    def profiled(self, decoder: DexDecoder) -> bool:
        return decoder.proposal_vocab in self._profiles

    def profile(self, decoder: DexDecoder) -> dict:
        """This machine's seconds profile for the decoder's model and proposal heads (``dex_core.profile``:
        measured once, about half a minute, then cached on disk and here)."""
        model, _ = self.model()
        with self._lock:
            if decoder.proposal_vocab not in self._profiles:
                self._profiles[decoder.proposal_vocab] = measure_profile(model, decoder.proposal_vocab, log=lambda _: None)
            return self._profiles[decoder.proposal_vocab]

    def slow_notice(self, decoder: DexDecoder, max_new_tokens: int) -> str | None:
        """A warning (not a refusal) for settings that will take over a minute here. On CPU the sequential
        schedule runs the K explorers one after another: a token costs about K stage passes, and one
        thread does about 1.5 G parameters a second (SmolLM2-135M: ~0.09 s per token per explorer); an
        unpruned lattice at K >= 6 computes several times more rows (counted 4x)."""
        if decoder.backend != "sequential" or decoder.view.device.type != "cpu":
            return None
        params = sum(p.numel() for p in decoder.model.parameters())
        seconds = max_new_tokens * decoder.K * params / 1.5e9 * (4 if decoder.prune is None and decoder.K >= 6 else 1)
        if seconds < SLOW_SECONDS:
            return None
        return (f"K={decoder.K} × {max_new_tokens} tokens on CPU: about {seconds:.0f} s, as the explorers run one after "
                "another here; fewer tokens or a smaller K is faster (the status line shows the time left).")

    def encode(self, prompt: str, chat: bool) -> list[int]:
        _, tokenizer = self.model()
        return encode_prompt(tokenizer, prompt, chat)

    def device_notice(self, count: int) -> str | None:
        """Why a distributed run uses CPU explorers on a machine with too few GPUs (None when it does not)."""
        import torch

        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if self.settings.backend == "distributed" and self.settings.device != "cpu" and 0 < gpus < count:
            return (f"{count} explorers need {count} GPUs (one per explorer) but {gpus} are visible: "
                    f"the explorers run on CPU. Choose K ≤ {gpus} to use the GPUs.")
        return None

    @property
    def shipped_adapters(self) -> bool:
        """Whether the adapters box can do anything: the default model, and the shipped file is there."""
        from dex_core.adapters import DEFAULT_ADAPTERS

        return self.settings.model == "default" and DEFAULT_ADAPTERS.is_file()

    def decoder(self, config: DexConfig) -> DexDecoder:
        """A decoder for the config's exploration. Distributed groups are kept, keyed by the resolved depths,
        DECS, adapters and pruning, at most ``max_groups`` at once: the least recently used one is closed first."""
        model, tokenizer = self.model()
        options = replace(config.decoder(), backend=self.settings.backend)
        if options.backend == "sequential":
            return DexDecoder(model, options, tokenizer=tokenizer)
        depths, _ = choose_depths(model, options)
        if model.device.type == "cpu":  # DEX_DEVICE=cpu: CPU explorers, even where GPUs are visible
            options = replace(options, devices=("cpu",) * len(depths))
        key = (depths, options.decs, options.adapters, options.prune)
        with self._lock:
            if key in self._groups:
                self._groups.move_to_end(key)
                return self._groups[key]
            while len(self._groups) >= self.settings.max_groups:
                self._groups.popitem(last=False)[1].close()
            self._groups[key] = DexDecoder(model, options, tokenizer=tokenizer, depths=depths)
            return self._groups[key]

    def file(self, name: str) -> Path:
        """A fresh path for a file handed to a browser (the folder keeps files for ``session_ttl`` seconds)."""
        with self._lock:
            if self._files is None:
                self._files = Path(tempfile.mkdtemp(prefix="dex-app-"))
                atexit.register(shutil.rmtree, self._files, True)
        now = time.time()
        for old in self._files.glob("*/*"):
            if now - old.stat().st_mtime > self.settings.session_ttl:
                shutil.rmtree(old.parent, ignore_errors=True)
        return Path(tempfile.mkdtemp(dir=self._files)) / name

    def close(self) -> None:
        with self._lock:
            for decoder in self._groups.values():
                decoder.close()
            self._groups.clear()
