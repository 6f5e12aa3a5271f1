"""What a page shows when it opens, without loading a model: the bundled example trace (or ``?trace=NAME`` from
``assets/traces``) in the Live panels and in the Debugger with its timeline, and its prompt in the Live prompt box,
so that the box and the panels below it show the same run."""

from __future__ import annotations

import gradio as gr

import visualize as viz

from . import debugger as dbg
from .live import panels


def page_load(request: gr.Request):
    """Returns (trace, meta, origin, 4 Live panels, Live status, 5 Debugger outputs, timeline, Debugger status,
    tabs): the Debugger's tab is opened for ``?trace=NAME``."""
    name = request.query_params.get("trace") if request is not None else None
    opened = dbg.bundled(name)
    events, note = opened.events, opened.note
    if not events:
        idle = viz.status_html("idle", dbg.EMPTY_HINT)
        return ([], {}, "", *(gr.skip(),) * 4, idle, *dbg.frame([], 0), None, idle, gr.skip())
    example = name not in dbg.bundled_names() or name == dbg.EXAMPLE  # an unknown name falls back to it
    made = _made_with(events[0]) if example else ""
    hint = f" — {made}press Generate to run your own prompt, or step through this one in the Debugger tab"
    return (
        events,
        opened.meta,
        opened.origin,
        *panels(events),
        viz.status_html("example", note + hint),
        *dbg.frame(events, dbg.last_round(events)),
        dbg.timeline(events),
        viz.status_html("example", note),
        gr.Tabs(selected="debugger") if name else gr.skip(),
    )


def _made_with(start) -> str:
    """How the bundled example was made: with the page's default settings (tests/app/test_example_trace.py holds it
    to them) on the kind of machine and in the dtype its trace records. "auto" pruning and dtype resolve per machine
    (more rows and half precision on a GPU): Generate on its prompt repeats the example on a machine of that kind."""
    return f"made with the page's default settings ({start.made_on.upper()}, {start.dtype}); "


def opening_prompt(fallback: str) -> str:
    """The Live prompt box's value as the page is built: the bundled example's prompt (``fallback`` without one), so
    that a page opened without ``?trace=`` shows the box and the panels on one run before any load event answers."""
    return _trace_prompt(None) or fallback


def example_prompt(request: gr.Request):
    """The prompt of the run the page opens on for the Live prompt box, written only where it differs from the box's
    opening value (``?trace=`` naming another bundled trace): a load event that answers late on a busy server must
    not overwrite a prompt the visitor has already typed."""
    name = request.query_params.get("trace") if request is not None else None
    prompt = _trace_prompt(name)
    return prompt if prompt and prompt != _trace_prompt(None) else gr.skip()


def _trace_prompt(name: str | None) -> str | None:
    prompt = dbg.bundled(name).meta.get("prompt")
    return prompt if isinstance(prompt, str) and prompt.strip() else None


CONTROLS = ("slider", "number", "checkbox", "dropdown", "radio")  # the kinds of component a visitor sets


def appearance(demo: gr.Blocks) -> dict:
    """What README's screenshots show of the app besides a run: the header, every control's default (by its
    element id) and the palette. ``scripts/app_screenshots.py`` records it beside the pictures, and a test fails
    when the app's differs, so that the pictures are made again when the app changes."""
    components = demo.get_config_file()["components"]
    header = next(c["props"]["value"] for c in components if c["type"] == "markdown")
    controls = {
        c["props"]["elem_id"]: c["props"].get("value")
        for c in components
        if c["type"] in CONTROLS and c["props"].get("elem_id") and c["props"].get("visible") is not False
    }
    return {
        "header": header,
        "controls": dict(sorted(controls.items())),
        "stage_colours": list(viz.palette.OKABE_ITO),
        "status_colours": viz.palette.STATUS_COLORS,
        "fate_colours": viz.palette.FATE_COLORS,
    }
