"""The one way library code reports progress: a ``log`` callback taking one line. Every function that reports takes
``log=`` and defaults to ``stderr``; the CLI passes its own, the app collects lines for its status bar."""

from __future__ import annotations

import sys


def stderr(line: str) -> None:
    """A progress line on stderr (stdout stays for results)."""
    print(f"[dex] {line}", file=sys.stderr, flush=True)


def quiet(line: str) -> None:
    """A log that drops every line."""
