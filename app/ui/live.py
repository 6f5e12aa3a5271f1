"""The Live tab's handlers: one DEX generation streamed round by round into the text, lattice, FSM and numbers
panels and the status line, with Stop; the panels a trace's last round shows (``panels``, the page's first view's
too). They call ``dex_core`` and draw with ``visualize`` (traces only).

The API's events pass their inputs unprocessed (``preprocess=False``): the handler checks its own inputs
(``Inputs.config``, ``check_text``), so bad input from an API client gets the documented message and no
traceback. It never raises on it: it yields only a status line ("error: …") and leaves every panel as it was, so
the previous run stays on screen, labelled as such, with one message. A request's model time is bounded by the
host (``Deadline``); a run past it ends with what it made. The run itself is ``live_steps`` (typed ``Step``s, no
drawing), which the page draws (``live_frames``) and the MCP tool reads (``app.ui.tools``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Literal

import gradio as gr

import visualize as viz
from dex_core import DexError, ExplorerError
from dex_core.analysis.forecast import Forecast
from dex_core.runtime.request import check_text, no_chat_template
from dex_core.trace.events import EndEvent, Event, RoundEvent

from ..host.state import Runtime
from . import debugger as dbg
from .estimate import Pace
from .handlers import Deadline, Stopping, StopRequests, explorer_line, loading, session_of
from .inputs import Inputs

PREVIOUS = "the panels below still show the previous run"
LIVE = "this session's live run"  # the origin of a Live run's trace


def _end(events) -> EndEvent | None:
    return events[-1] if events and isinstance(events[-1], EndEvent) else None


def panels(events) -> tuple:
    """The text, lattice, FSM and numbers panels at a trace's last round."""
    view = dbg.views(events)[-1]
    return (
        viz.tokens_html(view),
        viz.lattice_figure(view),
        viz.fsm_html(view),
        viz.stats_html(view, end=_end(events)),
    )


def _status_only(state: str, detail: str) -> tuple:
    return (gr.skip(),) * 7 + (viz.status_html(state, detail),)


@dataclass
class LiveRun:
    """A Live run under way: its stream and the events it gave so far, the Debugger's meta for it (model and
    prompt), K and its token count, its first time estimate (None for explorer groups) and its ``Pace`` once it
    runs, and a note on the prompt that the status line says (None: nothing to say)."""

    stream: Iterator[Event]
    meta: dict
    K: int
    max_new_tokens: int
    first: Forecast | None = None
    note: str | None = None
    pace: Pace | None = None
    events: list = field(default_factory=list)
    tokens: int = 0

    def frame(self, state: str, detail: str) -> tuple:
        return panels(self.events) + (self.events, self.meta, LIVE, viz.status_html(state, detail))


@dataclass(frozen=True)
class Step:
    """One update of a Live run: its state (running, stopped, finished, error), what the status line says, and the
    run when the panels show it (None: only the status line changes; an error's run: it failed after it began)."""

    state: Literal["running", "stopped", "finished", "error"]
    detail: str
    run: LiveRun | None = None


def live_frames(runtime: Runtime, stops: StopRequests, inputs: Inputs, request: gr.Request = None):
    """Generate with DEX, yielding (text, lattice, fsm, stats, trace, meta, origin, status) once per explorer round;
    Stop (``stops``) or the host's bound on model time ends the run after the round in progress."""
    for step in live_steps(runtime, stops, inputs, request):
        if step.state == "error":
            tail = (
                "; the panels show this run up to its last round"
                if step.run
                else f" — nothing ran; {PREVIOUS}"
            )
            yield _status_only("error", step.detail + tail)
        elif step.run is None:
            yield _status_only(step.state, step.detail)
        else:
            yield step.run.frame(step.state, step.detail)


def live_steps(runtime: Runtime, stops: StopRequests, inputs: Inputs, request: gr.Request = None):
    """The Live run of ``inputs``, one ``Step`` per status line and per explorer round; bad input is one error step
    and nothing runs. Stop (``stops``) or the host's bound on model time ends the run after the round in progress."""
    session = session_of(request)
    stops.take(session)  # a Stop pressed before this run started does not apply to it
    yield Step("running", "starting")
    try:
        config = inputs.config()
        prompt = check_text(inputs.prompt)  # bad input is told before a first use loads the model; once
        for line in loading(runtime):
            yield Step("running", line)
        run = _live_start(runtime, config, prompt)
        if run.first or run.note:
            estimate = (
                f"K={run.K} × {run.max_new_tokens} tokens: {run.first.text()}" if run.first else "starting"
            )
            yield Step("running", " · ".join(filter(None, (estimate, run.note))))
        run.events.append(next(run.stream))  # the start event
    except (DexError, ExplorerError) as err:
        yield Step("error", str(err))
        return
    bound = runtime.settings.request_seconds
    run.pace = run.first and Pace(run.first, run.K, run.max_new_tokens, bound)
    try:
        yield from _live_rounds(run, Stopping(stops, session, Deadline(bound)))
    except ExplorerError as err:
        yield Step("error", explorer_line(err), run)
    runtime.learn(
        run.K, run.events, run.pace and run.pace.elapsed()
    )  # as its reader saw it (the page: drawn too)


def _live_start(runtime: Runtime, config, prompt: str) -> LiveRun:
    """The run of ``config`` on the prompt: its decoder's stream, its first time estimate and what the status line
    says of the prompt (without a chat template it goes in as written), after warning about slow settings and what
    the model's generation config asks for that DEX does not apply."""
    decoder = runtime.decoder(config)
    request = decoder.request(
        runtime.encode(prompt, config.chat), options=config.generation()
    )  # checked once
    first = runtime.forecast(decoder, config.max_new_tokens)
    notices = [
        runtime.device_notice(decoder.K),
        runtime.slow_notice(decoder, config.max_new_tokens, first=first),
        *request.notes,  # what the model's generation config asks for that DEX does not apply
    ]
    for notice in notices:
        if notice:
            gr.Warning(notice)
    note = (
        no_chat_template(runtime.tokenizer(), config.chat)
        and "no chat template: the prompt goes in as written"
    )
    return LiveRun(
        stream=decoder.stream(request),
        meta={"model": runtime.settings.model, "prompt": prompt},
        K=decoder.K,
        max_new_tokens=config.max_new_tokens,
        first=first,
        note=note or None,
    )


def _live_rounds(run: LiveRun, stopping: Stopping):
    """A step per round until the end, or until Stop or the host's bound (``stopping``) ends the run after its
    round; the status line shows the run's one time-left figure (its ``Pace``), whose notice comes once, and the
    finished line repeats the note on the prompt."""
    for event in run.stream:
        run.events.append(event)
        if not isinstance(event, RoundEvent):
            continue
        run.tokens += len(event.commits)  # several when a draft chain committed
        why = stopping.reason()
        if why:
            run.stream.close()
            yield Step(
                "stopped",
                f"stopped {why} after round {event.round} ({run.tokens} tokens): the panels show "
                "the run so far; the Debugger holds what ran",
                run,
            )
            return
        if run.pace:
            run.pace.update(event.round, run.tokens)
            notice = run.pace.notice()
            if notice:
                gr.Info(notice)
        left = f" · {run.pace.status()}" if run.pace else ""
        yield Step("running", f"round {event.round} · {run.tokens} tokens · K={run.K}{left}", run)
    end = _end(run.events)
    yield Step(
        "finished",
        f"{run.tokens} tokens in {end.stats.rounds if end else '?'} rounds · K={run.K}"
        + f" · {run.note}" * bool(run.note),
        run,
    )


def stop(stops: StopRequests, status: str, request: gr.Request = None):
    """Stop: says "stopped" at once; this session's running Live handler ends after its current round and
    says "stopped" too (its last frame), so no late round can leave "running" on screen."""
    if "data-state='running'" not in (status or ""):
        return gr.skip()
    stops.request(session_of(request))
    return viz.status_html("stopped", "stopped by you: the run ends after the round in progress")
