"""Trace files: ``save_trace`` writes a run's typed events as one JSON document (``dex_core.trace.events``),
``load_trace`` reads one back, validated (``dex_core.trace.validate``) and typed."""

from __future__ import annotations

import json
from pathlib import Path

from ..config import DexError
from .events import Event, parse_events
from .schema import TRACE_FORMAT, TRACE_LIMITS, TRACE_VERSION, TraceLimits
from .validate import parse_trace


def save_trace(path: str | Path, events: list[Event], meta: dict | None = None) -> None:
    """Write events (and optional metadata such as the model name) as one JSON document."""
    doc = {"format": TRACE_FORMAT, "version": TRACE_VERSION, "meta": meta or {}, "events": records(events)}
    Path(path).write_text(json.dumps(doc, separators=(",", ":")))


def records(events: list[Event]) -> list[dict]:
    """The events' JSON form."""
    return [e.record() for e in events]


def read_records(path: str | Path, limits: TraceLimits = TRACE_LIMITS) -> tuple[list[dict], dict]:
    """Read and validate a saved trace; returns ``(records, meta)`` as the file holds them.

    A missing, oversized, foreign, newer or malformed file raises ``DexError``; the size is checked
    before the file is read, and messages name the file only by its base name.
    """
    path = Path(path)
    try:
        if path.stat().st_size > limits.max_file_bytes:
            raise DexError(
                f"the trace is larger than {limits.max_file_bytes} bytes (TraceLimits.max_file_bytes)"
            )
        with path.open("rb") as f:
            data = f.read(limits.max_file_bytes + 1)
    except OSError:
        raise DexError(
            f"cannot read the trace file {path.name!r}; give the path of a JSON file saved by DEX"
        ) from None
    return parse_trace(data, limits)


def load_trace(path: str | Path, limits: TraceLimits = TRACE_LIMITS) -> tuple[list[Event], dict]:
    """Read, validate and type a saved trace; returns ``(events, meta)`` (see ``read_records``)."""
    found, meta = read_records(path, limits)
    return parse_events(found), meta
