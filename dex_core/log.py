"""The one way library code reports progress: a ``log`` callback taking one line. Every function that reports takes
``log=`` and defaults to ``stderr``; the CLI passes its own, the app collects lines for its status bar.

Also what the libraries under DEX print: ``quiet_libraries`` turns off their progress bars, log lines and
warnings while a command runs (``dex ... --verbose`` keeps them); ``libraries_quiet`` tells the output DEX
starts itself (pip's, the GGUF reader's bar) to follow the same switch."""

from __future__ import annotations

import contextlib
import io
import os
import sys
import warnings

import huggingface_hub.utils as hub

NOT_DEX = r"(?!(dex_core|app|visualize)(\.|$))"  # module names of third-party code, for warnings filters


def stderr(line: str) -> None:
    """A progress line on stderr (stdout stays for results)."""
    print(f"[dex] {line}", file=sys.stderr, flush=True)


def quiet(line: str) -> None:
    """A log that drops every line."""


def libraries_quiet() -> bool:
    """Whether third-party progress output is off: huggingface_hub's progress-bar switch, which
    ``quiet_libraries`` flips and a user can set with HF_HUB_DISABLE_PROGRESS_BARS=1."""
    return hub.are_progress_bars_disabled()


@contextlib.contextmanager
def quiet_libraries(on: bool = True):
    """While the block runs (when ``on``): no progress bars from transformers or huggingface_hub, no
    transformers log line below an error, no warning attributed to a third-party module and no deprecation
    warning (DEX's own warnings still show). Their own switches: transformers' verbosity and progress bars
    (TRANSFORMERS_VERBOSITY when transformers is not imported yet: it reads that when it starts, and it is
    not imported here, which costs seconds; docs/ARCHITECTURE.md, Imports), huggingface_hub's progress
    bars. Everything is as before once the block ends."""
    if not on:
        yield
        return
    tf = sys.modules.get("transformers.utils.logging")
    saved = hub.are_progress_bars_disabled(), os.environ.get("TRANSFORMERS_VERBOSITY")
    tf_saved = (tf.get_verbosity(), tf.is_progress_bar_enabled()) if tf else None
    hub.disable_progress_bars()
    os.environ["TRANSFORMERS_VERBOSITY"] = "error"
    if tf:
        tf.set_verbosity_error()
        tf.disable_progress_bar()
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", module=NOT_DEX)
            warnings.filterwarnings("ignore", category=DeprecationWarning)
            warnings.filterwarnings("ignore", category=FutureWarning)
            yield
    finally:
        if tf_saved:
            tf.set_verbosity(tf_saved[0])
            if tf_saved[1]:
                tf.enable_progress_bar()
        if saved[0]:  # after transformers': its switch sets the hub's too
            hub.disable_progress_bars()
        else:
            hub.enable_progress_bars()
        if saved[1] is None:
            os.environ.pop("TRANSFORMERS_VERBOSITY", None)
        else:
            os.environ["TRANSFORMERS_VERBOSITY"] = saved[1]


@contextlib.contextmanager
def library_output():
    """Around a third-party call DEX has no switch for (the GGUF reader's progress bar): what it writes to
    stderr is dropped while ``libraries_quiet()``, shown otherwise."""
    if not libraries_quiet():
        yield
        return
    with contextlib.redirect_stderr(io.StringIO()):
        yield
