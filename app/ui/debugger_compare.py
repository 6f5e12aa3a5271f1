"""The Debugger's comparison of two runs. Run A is pinned: the run the Debugger shows when "Pin this run
for comparison" is pressed, or a trace loaded into the compare slot (validated like every upload,
``debugger.read_upload``). Run B is whatever the Debugger shows later: a live run, a loaded trace, a
bundled one. The panel (``visualize.compare``) puts their settings, numbers, cost per token (the
library's count from the trace, ``dex_core.analysis.run_cost``, with the weights it records) and matched-depth
histograms side by side. The pinned run is per session, like the Debugger's own trace.
"""

from __future__ import annotations

from dataclasses import asdict

import gradio as gr

import visualize as viz
from dex_core import DexError
from dex_core.analysis.run_cost import trace_cost
from dex_core.trace.events import EndEvent
from visualize.markup import esc

from . import debugger as dbg
from .handlers import HUSH, bind

WAITING = (
    "Run A is pinned: {label}. Pin a run, then show another: Generate in the Live tab, load a trace above, or "
    "open a bundled one, and it appears here as run B, next to A."
)
HINT = (
    "Nothing pinned yet. Press “Pin this run for comparison” to keep the run shown above as run A (or load a "
    "trace to compare below); then open another run — Generate in the Live tab, load a trace above, or a "
    "bundled one — and it appears here as run B, next to A. Typical pairs: adapters on vs off, DECS on vs "
    "off, K=2 vs K=4, a loaded trace vs a live one."
)


def _ended(events) -> str | None:
    """The end event's stop reason; None for a run stopped before its end."""
    return events[-1].stop if events and isinstance(events[-1], EndEvent) else None


def side(name: str, run: dict) -> viz.RunSide | None:
    """A run ({"events", "meta", "origin"}) as one side of the comparison; None without explorer rounds."""
    rounds = dbg.views(run["events"])
    if not rounds:
        return None
    return viz.RunSide(
        name,
        run["origin"] or "this session's trace",
        rounds[-1],
        run["meta"] or {},
        _ended(run["events"]),
        asdict(trace_cost(run["events"])),  # cost per token: on K devices, every row counted, AR's
    )


def _pinned(run: dict):
    """Run A pinned: (the run, the compare status line, the opened fold); a stopped run says so."""
    stopped = _ended(run["events"]) in (None, "cancelled")
    line = f"run A pinned: {viz.run_label(side('A', run))}"
    return run, viz.status_html("stopped" if stopped else "finished", line), gr.Accordion(open=True)


def pin(events, meta, origin):
    """Pin the run the Debugger shows as run A; opens the comparison."""
    dbg.need(events)
    if not dbg.views(events):
        raise gr.Error(
            "this trace has no explorer rounds (an AR trace?): nothing to compare", print_exception=False
        )
    return _pinned({"events": events, "meta": meta or {}, "origin": origin or "this session's trace"})


def load_pinned(runtime, file, request: gr.Request = None):
    """A trace file as run A, validated and admitted like the Debugger's (``debugger.open_upload``); a refused
    file changes only the compare status line. The upload box is emptied either way, ready for another file."""
    try:
        opened = dbg.open_upload(runtime, file, request)
    except DexError as err:
        return (
            gr.skip(),
            viz.status_html("error", f"this trace was not loaded: {err}; run A is unchanged"),
            gr.skip(),
            None,
        )
    if not dbg.views(opened.events):
        return (
            gr.skip(),
            viz.status_html("error", "this trace has no explorer rounds (an AR trace?): run A is unchanged"),
            gr.skip(),
            None,
        )
    return *_pinned({"events": opened.events, "meta": opened.meta, "origin": opened.origin}), None


def same_run(a: list, b: list) -> bool:
    """Whether two traces are one run (the one pinned, shown again): the same events."""
    return a is b or (len(a) == len(b) and a == b)


def update(pinned, events, meta, origin):
    """The comparison of the pinned run A and the Debugger's run B: (table HTML, histogram plot). Until the
    Debugger shows another run than A, it says what to do instead of comparing A with itself."""
    if not pinned:
        return f"<p id='dbg-compare-empty'>{esc(HINT)}</p>", gr.Plot(visible=False)
    if same_run(pinned["events"], events or []):
        waiting = WAITING.format(label=viz.run_label(side("A", pinned)))
        return f"<p id='dbg-compare-waiting'>{esc(waiting)}</p>", gr.Plot(visible=False)
    sides = [
        s for s in (side("A", pinned), side("B", {"events": events, "meta": meta, "origin": origin})) if s
    ]
    return viz.compare_html(sides), gr.Plot(value=viz.compare_figure(sides), visible=True)


def section(runtime, trace: gr.State, meta: gr.State, origin: gr.State, pin_button: gr.Button) -> tuple:
    """The comparison's layout (a folded accordion the pin opens) and its events; returns the event
    (fn, inputs, outputs) that redraws it, for whatever changes the Debugger's run."""
    pinned = gr.State(None, time_to_live=runtime.settings.session_ttl)
    with gr.Accordion(
        "Compare two runs: A (pinned) and B (the run shown above)", open=False, elem_id="dbg-compare"
    ) as fold:
        status = gr.HTML(elem_id="dbg-compare-status")
        panel = gr.HTML(f"<p id='dbg-compare-empty'>{esc(HINT)}</p>", elem_id="dbg-compare-table")
        plot = gr.Plot(label="Matched depth of both runs", elem_id="dbg-compare-plot", visible=False)
        slot = gr.File(
            label="Load a trace to compare (run A)",
            file_types=[".json"],
            elem_id="dbg-compare-load",
            height=100,
        )
    refresh = (update, [pinned, trace, meta, origin], [panel, plot])
    pin_button.click(pin, [trace, meta, origin], [pinned, status, fold], **HUSH).then(*refresh, **HUSH)
    slot.upload(
        bind(load_pinned, runtime),
        slot,
        [pinned, status, fold, slot],
        preprocess=False,  # no temp file
        **HUSH,
    ).then(*refresh, **HUSH)
    return refresh
