"""The server's settings (``AppSettings``): command-line flags, else the environment, else the defaults. What a
page's controls send: ``app.ui.inputs``."""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass, fields

from dex_core import DecoderOptions, DexConfig, DexError
from dex_core.config import DEVICE_HELP, integer, option

TRACE_TOP = 5  # top candidates per lattice node the Debugger shows (every run the host makes records them)

HOSTED_SECONDS = 180  # the bound on one request's model time where the app is hosted (a Space)


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
    live_batch: int = option(
        4, "Live runs with the same settings that share each round", env="DEX_LIVE_BATCH"
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
    visitor_trace_mb: int = option(
        640,
        "MB of trace memory the sessions of one visitor (client address) may hold; a load past it drops that "
        "visitor's own least recently used trace first",
        env="DEX_VISITOR_TRACE_MB",
    )
    upload_mb: int = option(
        256,
        "MB of uploads not yet loaded, all visitors together; more are refused until "
        "they are loaded or expire",
        env="DEX_UPLOAD_MB",
    )
    visitor_upload_mb: int = option(
        96,
        "MB of uploads not yet loaded that one visitor (client address) may hold; more are refused until "
        "they are loaded or expire",
        env="DEX_VISITOR_UPLOAD_MB",
    )
    file_ttl: int = option(
        600,
        "seconds a download (saved trace, export) or an upload never loaded stays on the "
        "server; a download also goes when its session ends",
        env="DEX_FILE_TTL",
    )
    request_seconds: int | None = option(
        None,
        "seconds of model time one request may take (Live, Race, Analysis); a run past it ends with what it made "
        f"so far (0: no bound; default: {HOSTED_SECONDS} on a Hugging Face Space, none on your own machine)",
        env="DEX_REQUEST_SECONDS",
    )
    openai_api: bool = option(
        False,
        "also serve dex serve --http's OpenAI-compatible API on the app's server, under /openai (the sequential "
        "backend only; one request per visitor; docs/SERVING.md)",
        env="DEX_OPENAI_API",
    )
    mcp_server: bool = option(
        False,
        "also serve the app as an MCP server at /gradio_api/mcp/ (streamable HTTP): Generate, Race and Analyse as "
        "tools for agents, with the page's bounds; each caller counts as the visitor it is (docs/HOSTING.md)",
        env="DEX_MCP_SERVER",
    )

    def __post_init__(self):
        self.device = DexConfig(
            model=self.model,
            explorers=self.explorers,
            backend=self.backend,
            dtype=self.dtype,
            device=self.device,
        ).device
        for name in (
            "max_groups",
            "live_batch",
            "queue_size",
            "session_ttl",
            "trace_memory_mb",
            "visitor_trace_mb",
            "upload_mb",
            "visitor_upload_mb",
            "file_ttl",
        ):
            integer(getattr(self, name), name, 1)
        if self.request_seconds is None:  # a bound for strangers sharing a Space; none for one's own run
            self.request_seconds = HOSTED_SECONDS if os.environ.get("SPACE_ID") else 0
        integer(self.request_seconds, "request_seconds", 0)
        if self.openai_api and self.backend != "sequential":
            raise DexError(
                "openai_api serves on a decoder of its own beside the app's runs, which only the sequential "
                f"backend allows (an explorer group runs one request at a time); got backend {self.backend!r}: "
                "run dex serve --http --backend distributed beside the app instead"
            )
        if self.mcp_server and importlib.util.find_spec("mcp") is None:  # Gradio would only print a line
            raise DexError(
                "mcp_server needs the PyPI package mcp, which this install lacks: pip install 'mcp>=1.24,<2' "
                "(a dependency of dex-decoding: pip install -e . brings it)"
            )

    @classmethod
    def from_env(cls, environ=None) -> AppSettings:
        environ = os.environ if environ is None else environ
        values = {}
        for f in fields(cls):
            raw = environ.get(f.metadata.get("env") or "")
            if raw:
                try:
                    values[f.name] = _parsed(raw, str(f.type))
                except ValueError:
                    what = "1 or 0" if str(f.type) == "bool" else "an integer"
                    raise DexError(f"{f.metadata['env']} must be {what}; got {raw!r}") from None
        return cls(**values)


def _parsed(raw: str, kind: str):
    """An environment variable's text as the setting's type (``kind``: its annotation); ValueError if it is not."""
    if kind == "bool":
        if raw.lower() not in ("1", "true", "yes", "0", "false", "no"):
            raise ValueError(raw)
        return raw.lower() in ("1", "true", "yes")
    return int(raw) if "int" in kind else raw
