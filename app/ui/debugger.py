"""Handlers of the Debugger tab: one round of a trace at a time, the whole-run timeline, the bundled
example traces (``assets/traces/``, shown on page load, ``?trace=NAME`` picks one), loading a saved
trace, and the exports (trace JSON, lattice GraphML, standalone HTML report). Traces only: nothing
here loads a model.

The round control counts the trace's own round numbers (the ones the lattice title, the round table
and the timeline show), from the first round to the last. Every trace opens at its last round: a live
run, a loaded trace and a bundled one alike.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path

import gradio as gr

import visualize as viz
from dex_core import DexError
from dex_core.trace.files import load_trace, save_trace
from visualize.markup import esc

from ..host.sessions import COMPACT_FACTOR, REPLAYS
from ..host.state import Runtime
from ..host.trace_worker import read_trace
from ..host.uploads import request_visitor

TRACES = Path(__file__).resolve().parents[2] / "assets" / "traces"
EXAMPLE = "example"
EMPTY_HINT = (
    "No trace yet: press Generate in the Live tab, load a trace saved by DEX below, or open a bundled "
    "one with ?trace=NAME in the address."
)


def views(events) -> viz.Replay | list:
    """The trace's replay, shared by Prev/Next/slider/Play (``sessions.REPLAYS``: traces sessions hold)."""
    return REPLAYS(events) if events else []


def _session(request: gr.Request | None) -> str:
    return getattr(request, "session_hash", None) or ""


def _number(value) -> int:
    try:
        return int(float(value or 0))
    except (TypeError, ValueError, OverflowError):
        return 0


def _index(views, round_no) -> int:
    """The index of round ``round_no`` (clamped to the trace's rounds)."""
    first = views[0].round
    i = max(0, min(_number(round_no) - first, len(views) - 1))
    if views[i].round != _number(round_no):  # numbering with gaps: search
        i = next((j for j in range(len(views)) if views[j].round >= _number(round_no)), len(views) - 1)
    return i


def frame(events, round_no, gone: str | None = None):
    """Lattice, round table, FSM and text of round ``round_no`` of a trace, and the round control; without
    a trace, what to do (and why the session's trace went, ``gone``)."""
    rounds = views(events)
    if not rounds:
        hint = f"<p id='dbg-empty'>{esc(_gone(gone) + EMPTY_HINT if gone else EMPTY_HINT)}</p>"
        return None, hint, "", "", gr.Slider(minimum=0, maximum=1, value=0, step=1, label="Round")
    view = rounds[_index(rounds, round_no)]
    return (
        viz.lattice_figure(view),
        viz.round_table_html(view),
        viz.fsm_html(view),
        viz.tokens_html(view),
        round_control(rounds, view.round),
    )


def _gone(why: str) -> str:
    return f"{why[:1].upper()}{why[1:]}. "


def show(runtime: Runtime, events, round_no, request: gr.Request = None):
    """``frame`` for a session's step (Prev, Next, slider, timeline): says once why its trace was dropped."""
    return frame(events, round_no, None if events else runtime.sessions.notice(_session(request)))


def stepped(events, meta, source: str, round_no, status: str):
    """The status line after a step (Prev, Next, Play and its ticks, the round box, the timeline): the round shown and
    what the trace is. An error an earlier upload left is cleared, since it no longer says what the Debugger shows."""
    rounds = views(events)
    if not rounds:
        return gr.skip()
    found = re.search(r"data-state='(\w+)'", status or "")
    state = found.group(1) if found and found.group(1) != "error" else "finished"
    shown = rounds[_index(rounds, round_no)].round
    return viz.status_html(
        state, f"round {shown} of {rounds[0].round}..{rounds[-1].round} · {describe(meta or {}, source)}"
    )


def round_control(rounds, value: int) -> gr.Slider:
    """The round control over a trace's rounds (``views``), at round ``value``."""
    first, last = rounds[0].round, rounds[-1].round
    return gr.Slider(
        minimum=first, maximum=max(last, first + 1), value=value, step=1, label=f"Round (of {first}..{last})"
    )


def last_round(events) -> int:
    rounds = views(events)
    return rounds[-1].round if rounds else 0


def step(events, round_no, delta):
    rounds = views(events)
    if not rounds:
        return 0
    return rounds[max(0, min(_index(rounds, round_no) + delta, len(rounds) - 1))].round


def play(events, round_no, meta=None, source: str = "", status: str = ""):
    """Play: the session is playing (the flag each tick reads) and the timer runs; at the last round (where
    every trace opens) it starts again from the first. Returns (playing, timer, the 5 frame outputs, the status
    line, which names the round shown); a trace of one round, or none, does not play, and a notice says why."""
    rounds = views(events)
    if len(rounds) < 2:
        gr.Info("nothing to play: " + ("this trace has one round" if rounds else "no trace yet"))
        return (False, gr.Timer(active=False), *(gr.skip(),) * 6)
    restart = _index(rounds, round_no) >= len(rounds) - 1
    shown = rounds[0].round if restart else round_no
    frames = frame(events, shown) if restart else (gr.skip(),) * 5
    return (True, gr.Timer(active=True), *frames, stepped(events, meta, source, shown, status))


def pause():
    """Pause: the flag off first, so a tick already queued does nothing, and the timer stopped."""
    return False, gr.Timer(active=False)


def play_tick(events, round_no, playing, meta=None, source: str = "", status: str = ""):
    """One Play step: the next round's frame (lattice, table, FSM, text, round control), the timer and the status
    line, which names that round (in the same update as its frame). A tick that arrives after Pause changes
    nothing; a tick never starts the timer again (only Play does), and the last round stops it."""
    rounds = views(events)
    if not playing or not rounds:
        return (gr.skip(),) * 5 + (gr.Timer(active=False), gr.skip())
    at_end = _index(rounds, round_no) >= len(rounds) - 2
    shown = step(events, round_no, 1)
    return (
        *frame(events, shown),
        gr.Timer(active=False) if at_end else gr.skip(),
        stepped(events, meta, source, shown, status),
    )


def timeline(events):
    return viz.timeline_figure(events, note="click a node to open its round") if views(events) else None


def describe(meta: dict, source: str) -> str:
    """What the Debugger shows, as one plain line."""
    facts = [f"{k} {meta[k]!r}" for k in ("model", "prompt") if isinstance(meta.get(k), (str, int, float))]
    return f"{source}" + (f": {', '.join(facts)}" if facts else "")


@functools.lru_cache(maxsize=8)
def _bundled(name: str):
    return load_trace(TRACES / f"{name}.json")


def bundled_names() -> list[str]:
    return sorted(p.stem for p in TRACES.glob("*.json")) if TRACES.is_dir() else []


@dataclass(frozen=True)
class Opened:
    """A trace the Debugger opens: its events and metadata, where it came from (``origin``, one short
    phrase) and the status line's text (``note``)."""

    events: list
    meta: dict
    origin: str
    note: str


def bundled(name: str | None) -> Opened:
    """A trace shipped in ``assets/traces``. Only names found in that folder are read (never a path from
    the request); an unknown name falls back to the example, with a note."""
    names = bundled_names()
    note = ""
    if name and name not in names:
        note = f"no bundled trace is named {name[:60]!r}; available: {', '.join(names) or 'none'}. "
        name = None
    name = name or (EXAMPLE if EXAMPLE in names else None)
    if name is None:
        return Opened([], {}, "", note)
    events, meta = _bundled(name)
    origin = f"bundled trace {name!r}"
    return Opened(events, meta, origin, note + describe(meta, origin))


def clean_message(err: Exception, path: str) -> str:
    """An error's text with the server's file path replaced by the file's base name."""
    text = str(err)
    for part in (path, str(Path(path).parent)):
        text = text.replace(part, Path(path).name if part == path else "…")
    return text


def read_upload(file) -> Opened:
    """An uploaded trace file, validated against the trace schema and its limits (``dex_core.trace.schema``:
    uploads are untrusted) in a worker process (``app.host.trace_worker``). Raises ``DexError`` with a message that
    names the file only by its own name."""
    if file is None:
        raise DexError("choose a trace file (JSON saved by DEX) first")
    path = _path(file)
    try:
        events, meta = read_trace(path)  # in a worker process, within its memory and time bounds
    except DexError as err:
        raise DexError(clean_message(err, path)) from None
    origin = f"loaded {Path(path).name!r}"
    return Opened(events, meta, origin, describe(meta, origin))


def _path(file) -> str:
    """An upload's path: a path string, Gradio's file object, or its FileData (an event with ``preprocess=False``)."""
    return file if isinstance(file, str) else file["path"] if isinstance(file, dict) else file.name


def open_upload(runtime: Runtime, file, request: gr.Request = None) -> Opened:
    """An uploaded trace (a path or the FileData of an event with ``preprocess=False``), validated; the memory
    budget makes room for it first (``Sessions.admit``) and the upload is deleted once read. Raises DexError."""
    path = None if file is None else Path(_path(file))
    size = path.stat().st_size if path is not None and path.is_file() else 0
    try:
        runtime.sessions.admit(_session(request), int(COMPACT_FACTOR * size), request_visitor(request))
        opened = read_upload(file)
    finally:
        if path is not None:
            runtime.uploads.consumed(path)
    runtime.sessions.record(opened.events, size)
    return opened


def load(runtime: Runtime, file, request: gr.Request = None):
    """A saved trace, validated: (events, meta, origin, round, status, the upload box); a rejected one changes
    only the status line. The upload box is emptied either way, ready for another file."""
    try:
        opened = open_upload(runtime, file, request)
    except DexError as err:
        return (
            *(gr.skip(),) * 4,
            viz.status_html(
                "error", f"this trace was not loaded: {err}; the Debugger still shows the previous trace"
            ),
            None,
        )
    rounds = views(opened.events)  # it opens at its last round, as a live run does
    control = round_control(rounds, rounds[-1].round) if rounds else 0
    return opened.events, opened.meta, opened.origin, control, viz.status_html("finished", opened.note), None


# After an export's handler, the page downloads the file it made (the hidden file component's value): one
# click on Save or Export. The file is served like every export (``app.host.files``: its session's, for a while).
DOWNLOAD_JS = """(file) => {
  if (!file || !file.url) return;
  const link = document.createElement('a');
  link.href = file.url;
  link.download = file.orig_name || '';
  document.body.appendChild(link);
  link.click();
  link.remove();
}"""


def _download(path: Path) -> str:
    """The hidden download component's value: the export's path (``DOWNLOAD_JS`` downloads it)."""
    return str(path)


def need(events, gone: str | None = None):
    if not events:
        raise gr.Error(
            _gone(gone) + "Load it again or generate in the Live tab"
            if gone
            else "no trace yet: generate in the Live tab or load a saved trace",
            print_exception=False,
        )


def _export(runtime: Runtime, events, request, name: str) -> Path:
    """A path for an export of the session's trace (``Files.export``: the session's own, short-lived)."""
    session = _session(request)
    need(events, None if events else runtime.sessions.notice(session))
    return runtime.files.export(session, name)


def save(runtime: Runtime, events, meta, request: gr.Request = None):
    """The trace as a JSON file, downloadable until its session ends (at most ``file_ttl`` seconds)."""
    path = _export(runtime, events, request, "dex-trace.json")
    save_trace(path, events, meta or {})
    return _download(path)


def export_lattice(runtime: Runtime, events, request: gr.Request = None):
    """The run's whole lattice as a GraphML file (networkx; opens in Gephi, yEd, networkx)."""
    return _download(viz.export_graph(events, _export(runtime, events, request, "dex-lattice.graphml")))


def export_report(runtime: Runtime, events, meta, request: gr.Request = None):
    """The run as one standalone HTML file (plotly.js inlined; opens from disk, offline)."""
    if events and not views(events):
        raise gr.Error(
            "this trace has no explorer rounds (an AR trace?): nothing to draw", print_exception=False
        )
    return _download(viz.write_run_report(events, meta, _export(runtime, events, request, "dex-run.html")))


def after_load(events, round_no, status: str):
    """The Debugger after an upload: its last round and the timeline, or nothing changed after an error."""
    if "data-state='error'" in (status or "") or not views(events):
        return (gr.skip(),) * 6
    return (*frame(events, round_no), timeline(events))


def refresh(events, meta, status: str, source: str):
    """The Debugger after a trace changed: its last round, the timeline and the status line; nothing
    changes when ``status`` says the change failed (an error keeps the previous trace on screen)."""
    if "data-state='error'" in (status or "") or not views(events):
        return (gr.skip(),) * 7
    state = "stopped" if "data-state='stopped'" in status else "finished"
    return (
        *frame(events, last_round(events)),
        timeline(events),
        viz.status_html(state, describe(meta, source)),
    )
