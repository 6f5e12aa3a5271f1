"""The app's settings: the server's (flags, else the environment, else the defaults) and the UI's values turned
into a validated ``DexConfig`` (``ui_config``), with what a control for an option shows (``control``)."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, fields

from dex_core import DecoderOptions, DexConfig, DexError, GenerationOptions
from dex_core.config import DEVICE_HELP, flag, integer, option


@dataclass
class AppSettings:
    """Server settings: command-line flags, else the environment (``env``), else the defaults."""

    model: str = option(DexConfig.model, "model spec (as for dex generate)", env="DEX_MODEL")
    explorers: int = option(DecoderOptions.explorers, "K the controls start at", env="DEX_EXPLORERS")
    backend: str = option(
        DecoderOptions.backend,
        "sequential, distributed, or torchrun (torchrun ... app/main.py --backend torchrun: rank 0 serves the "
        "app, every rank one explorer, across nodes too)",
        env="DEX_BACKEND",
    )
    dtype: str = option(DexConfig.dtype, "model dtype", env="DEX_DTYPE")
    device: str = option(
        DexConfig.device,
        DEVICE_HELP + " (distributed: one device of that kind per explorer)",
        env="DEX_DEVICE",
    )
    host: str | None = option(
        None, "address to serve on (default: $GRADIO_SERVER_NAME or 127.0.0.1; 0.0.0.0 serves a network)"
    )
    port: int | None = option(None, "port (default: $GRADIO_SERVER_PORT or 7860)")
    max_groups: int = option(
        1,
        "distributed: explorer groups kept alive at once (least recently used closed first)",
        env="DEX_MAX_GROUPS",
    )
    queue_size: int = option(
        16, "requests waiting in the queue at most; more are refused", env="DEX_QUEUE_SIZE"
    )
    session_ttl: int = option(
        3600,
        "seconds an idle browser session keeps its traces (a closed tab frees them at once)",
        env="DEX_SESSION_TTL",
    )
    trace_memory_mb: int = option(
        1024,
        "MB of server memory for all sessions' traces together; the least recently used session's go first",
        env="DEX_TRACE_MEMORY_MB",
    )
    upload_mb: int = option(
        256,
        "MB of uploads not yet loaded, all visitors together; more are refused until "
        "they are loaded or expire",
        env="DEX_UPLOAD_MB",
    )
    file_ttl: int = option(
        600,
        "seconds a download (saved trace, export) or an upload never loaded stays on the "
        "server; a download also goes when its session ends",
        env="DEX_FILE_TTL",
    )
    request_seconds: int = option(
        180,
        "seconds of model time one request may take (Live, Race, Analysis); a run "
        "past it ends with what it made so far (0: no bound)",
        env="DEX_REQUEST_SECONDS",
    )

    def __post_init__(self):
        self.device = DexConfig(
            model=self.model,
            explorers=self.explorers,
            backend=self.backend,
            dtype=self.dtype,
            device=self.device,
        ).device
        for name in ("max_groups", "queue_size", "session_ttl", "trace_memory_mb", "upload_mb", "file_ttl"):
            integer(getattr(self, name), name, 1)
        integer(self.request_seconds, "request_seconds", 0)

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


def ui_config(
    *,
    chat=True,
    explorers=DecoderOptions.explorers,
    depths="",
    adapters=True,
    decs=True,
    sample=False,
    temperature=1.0,
    top_k=0,
    top_p=1.0,
    seed=0,
    max_new_tokens=DexConfig.max_new_tokens,
    prune=DecoderOptions.prune,
    draft=True,
) -> DexConfig:
    """The app's control values -> a validated DexConfig (DexError on bad input).

    Off-values of the controls: greedy unless ``sample``; ``top_k`` 0 and ``top_p`` 1 mean off; an
    empty ``depths`` box means a uniform split of ``explorers``; the adapters box picks 'auto' or 'none';
    ``prune`` is one of ``PRUNE_CHOICES``; ``draft`` turns draft chains on ('auto') or off ('none').
    Explorers and max_new_tokens must lie in the range their sliders offer (``ui_min``/``ui_max``).
    """
    if prune not in PRUNE_CHOICES:
        raise DexError(f"lattice pruning must be one of {', '.join(PRUNE_CHOICES)}; got {str(prune)!r:.40}")
    sample = flag(sample, "sample")
    top_k = _whole(top_k, "top_k") if sample else 0
    top_p = _real(top_p, "top_p") if sample else 1.0
    return DexConfig(
        chat=chat,
        explorers=_whole(explorers, "explorers", DecoderOptions),
        depths=depths.strip() or None if isinstance(depths, str) else depths,
        adapters="auto" if flag(adapters, "adapters") else "none",
        decs=decs,
        temperature=_real(temperature, "temperature") if sample else 0.0,
        top_k=top_k or None,
        top_p=None if top_p == 1.0 else top_p,
        seed=_whole(seed, "seed"),
        max_new_tokens=_whole(max_new_tokens, "max_new_tokens", GenerationOptions),
        trace_top=TRACE_TOP,
        prune=prune,
        draft="auto" if flag(draft, "draft chains") else "none",
    )


def control(cls, name: str) -> dict:
    """What a UI control for field ``name`` of ``cls`` shows: default, help, and the offered range."""
    f = cls.__dataclass_fields__[name]
    return {
        "value": f.default,
        "info": f.metadata["help"],
        "minimum": f.metadata.get("ui_min"),
        "maximum": f.metadata.get("ui_max"),
    }


TRACE_TOP = 5  # top candidates per lattice node the Debugger shows
PRUNE_CHOICES = ("auto", "none", "1", "2", "4")  # the Live tab's lattice pruning menu (DecoderOptions.prune)
QUIET = {"api_visibility": "undocumented"}  # event options: UI plumbing, not part of the documented API
HUSH = {**QUIET, "show_progress": "hidden"}  # and quick: no progress overlay over the panels it redraws
