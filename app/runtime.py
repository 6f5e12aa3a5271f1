"""The app's server-side state and option handling: server settings, UI values to a validated config, and
one shared, read-only model per process, loaded on first use.

Sessions keep only plain trace records (in ``gr.State``), bounded by ``app.sessions`` (memory) and
``app.files`` (disk), which the runtime holds; the model, its tokenizer and distributed explorer groups
live here. Model work is serialized by the app's event concurrency settings.
"""

from __future__ import annotations

import math
import os
import threading
from collections import OrderedDict
from dataclasses import dataclass, fields, replace

import torch

from dex_core import (
    DecoderOptions,
    DexConfig,
    DexDecoder,
    DexError,
    GenerationOptions,
    encode_prompt,
    load_model,
)
from dex_core.config import DEVICE_HELP, flag, integer, option
from dex_core.model.adapter_choice import choose_depths
from dex_core.model.adapters import DEFAULT_ADAPTERS
from dex_core.model.checkpoint import Checkpoint, locate
from dex_core.model.load import load_tokenizer
from dex_core.model.stage_load import checkpoint_identity
from dex_core.tools.profile import measure_profile

from .files import Files
from .sessions import Sessions


@dataclass
class AppSettings:
    """Server settings: command-line flags, else the environment (``env``), else the defaults."""

    model: str = option(DexConfig.model, "model spec (as for dex generate)", env="DEX_MODEL")
    explorers: int = option(DecoderOptions.explorers, "K the controls start at", env="DEX_EXPLORERS")
    backend: str = option(DecoderOptions.backend, "sequential or distributed", env="DEX_BACKEND")
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
SLOW_SECONDS = 60  # a Live run, race or analysis expected to take longer gets a warning
CPU_RATE = 1.5e9  # parameters one CPU thread runs a second when decoding (SmolLM2-135M: ~0.09 s a token)
PRUNE_CHOICES = ("auto", "none", "1", "2", "4")  # the Live tab's lattice pruning menu (DecoderOptions.prune)
QUIET = {"api_visibility": "undocumented"}  # event options: UI plumbing, not part of the documented API
HUSH = {**QUIET, "show_progress": "hidden"}  # and quick: no progress overlay over the panels it redraws


WHOLE_MODEL = (
    "{what} runs the whole model in this server's process, and this server runs DEX distributed "
    "(DEX_BACKEND=distributed): each explorer process holds only its part of the model, and this process "
    "none of it. Serve the app with the sequential backend (DEX_BACKEND=sequential) for {what}."
)


class Runtime:
    def __init__(self, settings: AppSettings | None = None):
        self.settings = settings or AppSettings.from_env()
        self._lock = threading.Lock()
        self._model = self._tokenizer = self._folder = self._identity = None
        self._groups: OrderedDict[tuple, DexDecoder] = OrderedDict()  # least recently used first
        self.files = Files(self.settings)  # exports, uploads, the file gate
        self.sessions = Sessions(self.settings, self.files)  # what sessions hold in memory, and its budget
        self._profiles: dict[int, dict] = {}  # seconds profiles by proposal-head rows

    @property
    def distributed(self) -> bool:
        return self.settings.backend == "distributed"

    @property
    def loaded(self) -> bool:
        return self._tokenizer is not None

    def prepare(self, log=None) -> None:
        """What a first request needs, loaded once: sequential, the whole model and its tokenizer; distributed,
        the model's folder (the default model and .gguf files converted once) and its tokenizer, and no weights
        (each explorer process reads its own part). ``log`` gets a line per stage (fetch, convert, load)."""
        with self._lock:
            if self._tokenizer is not None:
                return
            more = {"log": log} if log is not None else {}
            if self.distributed:
                # deferred: transformers takes seconds to import (docs/ARCHITECTURE.md, Imports)
                from transformers import AutoConfig

                self._folder = locate(self.settings.model, log or (lambda line: None))
                self._identity = checkpoint_identity(
                    AutoConfig.from_pretrained(self._folder), Checkpoint(self._folder)
                )
                self._tokenizer = load_tokenizer(self._folder, self.settings.model)
            else:
                self._model, self._tokenizer = load_model(
                    self.settings.model, dtype=self.settings.dtype, device=self.settings.device, **more
                )

    def tokenizer(self):
        self.prepare()
        return self._tokenizer

    def need_whole_model(self, what: str) -> None:
        """DexError under the distributed backend, where no process holds the whole model (``what``: the feature
        that needs it)."""
        if self.distributed:
            raise DexError(WHOLE_MODEL.format(what=what))

    def model(self, what: str = "this"):
        """(model, tokenizer) of the sequential backend, loading them on first use (``need_whole_model``)."""
        self.need_whole_model(what)
        self.prepare()
        return self._model, self._tokenizer

    def profiled(self, decoder: DexDecoder) -> bool:
        return decoder.proposal_vocab in self._profiles

    def profile(self, decoder: DexDecoder) -> dict:
        """This machine's seconds profile for the decoder's model and proposal heads (``dex_core.tools.profile``:
        measured once, about half a minute, then cached on disk and here)."""
        model, _ = self.model("the seconds profile")
        with self._lock:
            if decoder.proposal_vocab not in self._profiles:
                self._profiles[decoder.proposal_vocab] = measure_profile(
                    model, decoder.proposal_vocab, log=lambda _: None
                )
            return self._profiles[decoder.proposal_vocab]

    def slow_notice(self, decoder: DexDecoder | None, max_new_tokens: int, ar: bool = False) -> str | None:
        """A warning (not a refusal) for settings that will take over a minute here: DEX with ``decoder`` (Live),
        AR beside it (``ar``: the Race), or AR and the logit lens alone (``decoder`` None: the Analysis). On
        CPU the sequential schedule runs the K explorers one after another: a token costs about K stage
        passes, and one thread does about 1.5 G parameters a second (SmolLM2-135M: ~0.09 s per token per
        explorer); an unpruned lattice at K >= 6 computes several times more rows (counted 4x); the
        Analysis's lens passes are counted as half an AR pass per token. Past the host's bound on a
        request's model time it says that the request will end there."""
        if decoder is not None and decoder.backend != "sequential":
            return None
        model, _ = self.model("the Analysis")
        if model.device.type != "cpu":
            return None
        passes = (
            1.5
            if decoder is None
            else decoder.K * (4 if decoder.prune is None and decoder.K >= 6 else 1) + ar
        )
        seconds = max_new_tokens * passes * sum(p.numel() for p in model.parameters()) / CPU_RATE
        if seconds < SLOW_SECONDS:
            return None
        bound = self.settings.request_seconds
        end = (
            f" This host ends a request after {bound} s of model time, keeping what it made by then."
            if bound and seconds > bound
            else ""
        )
        if decoder is None:
            return f"analysing {max_new_tokens} tokens on CPU: about {seconds:.0f} s; fewer tokens is faster.{end}"
        what = (
            f"K={decoder.K} × {max_new_tokens} tokens on CPU: about {seconds:.0f} s, as the explorers run one "
            "after another here"
        )
        if ar:
            return f"a race of {what} and AR beside them; fewer tokens or a smaller K is faster.{end}"
        return f"{what}; fewer tokens or a smaller K is faster (the status line shows the time left).{end}"

    def encode(self, prompt: str, chat: bool) -> list[int]:
        return encode_prompt(self.tokenizer(), prompt, chat)

    def device_notice(self, count: int) -> str | None:
        """Why a distributed run uses CPU explorers on a machine with too few GPUs (None when it does not)."""

        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if self.settings.backend == "distributed" and self.settings.device != "cpu" and 0 < gpus < count:
            return (
                f"{count} explorers need {count} GPUs (one per explorer) but {gpus} are visible: "
                f"the explorers run on CPU. Choose K ≤ {gpus} to use the GPUs."
            )
        return None

    @property
    def shipped_adapters(self) -> bool:
        """Whether the adapters box can do anything: the default model, and the shipped file is there."""

        return self.settings.model == "default" and DEFAULT_ADAPTERS.is_file()

    def decoder(self, config: DexConfig) -> DexDecoder:
        """A decoder for the config's exploration. Distributed groups are kept, keyed by the resolved depths,
        DECS, adapters and pruning, at most ``max_groups`` at once: the least recently used one is closed first."""
        options = replace(config.decoder(), backend=self.settings.backend)
        if options.backend == "sequential":
            model, tokenizer = self.model()
            return DexDecoder(model, options, tokenizer=tokenizer)
        tokenizer = self.tokenizer()
        depths, _ = choose_depths(self._identity, options)
        key = (depths, options.decs, options.adapters, options.prune, options.draft)
        with self._lock:
            if key in self._groups:
                self._groups.move_to_end(key)
                return self._groups[key]
            while len(self._groups) >= self.settings.max_groups:
                self._groups.popitem(last=False)[1].close()
            # each explorer reads its own part of the checkpoint; DEX_DEVICE=cpu: CPU explorers, even beside GPUs
            self._groups[key] = DexDecoder.from_pretrained(
                str(self._folder),
                replace(options, depths=depths),
                dtype=self.settings.dtype,
                device=self.settings.device,
                tokenizer=tokenizer,
            )
            return self._groups[key]

    def close(self) -> None:
        with self._lock:
            for decoder in self._groups.values():
                decoder.close()
            self._groups.clear()
