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

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Literal

import gradio as gr

import visualize as viz
from dex_core import DexError, ExplorerError
from dex_core.analysis.forecast import Forecast, RoundCost
from dex_core.runtime.request import check_text, no_chat_template
from dex_core.trace.events import EndEvent, Event, RoundEvent

from ..host.state import Runtime
from . import debugger as dbg
from .estimate import Pace
from .handlers import Deadline, Stopping, StopRequests, explorer_line, loading, session_of
from .inputs import Inputs

PREVIOUS = "the panels below still show the previous run"
LIVE = "this session's live run"  # the origin of a Live run's trace
TIMING = (
    "timing a round at these settings on this machine, for the first estimate (once; a few seconds at most)"
)


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
    slow: str | None = None  # the pace's notice once it came (``Pace.notice``)
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


class Frames:
    """How much of a Live run goes to drawing it: the seconds the run's steps took (the model's and DEX's own work,
    from its prefill on: loading the model and timing a first round are the host's, not the run's, and buy no
    drawing) and the seconds its frames cost. A frame costs the time it held the run (drawing, then Gradio until
    it asks for the next) and the time it slowed the step after it: Gradio encodes and sends a frame while the next
    round runs, and on a machine of few cores that round's threads wait for it (a tiny model's rounds ran 10x
    slower under a frame a round). So a step after a drawn frame counts as the run's only as long as its steps take
    undrawn (their running mean), the rest as the frame's. A running frame is drawn only while frames cost within
    ``DRAW_SHARE`` of the whole, so a page slower than the model shows fewer rounds, not a slower run. ``clock`` is
    injectable (tests)."""

    def __init__(self, clock=None):
        self.clock, self.working, self.drawing = clock or time.perf_counter, 0.0, 0.0
        self.undrawn: float | None = None  # seconds a step takes with no frame before it (a running mean)
        self.after_frame = False  # the step under way follows a drawn frame

    def steps(self, steps: Iterator[Step]) -> Iterator[Step]:
        """``steps``, each timed as the run's own work (and a drawn frame's, past its usual time); closing this
        closes them."""
        try:
            while True:
                tic = self.clock()
                step = next(steps, None)
                if step is None:
                    return
                self._count(self.clock() - tic, step)
                yield step
        finally:
            steps.close()

    def _count(self, seconds: float, step: Step) -> None:
        """A step's seconds: the run's, but for what a round after a drawn round frame took past the usual; none of
        a status line's before the run began (loading, timing a round)."""
        if step.run is None:
            return
        if not _round(step):  # the last frame: the run's own, however long
            self.working += seconds
        elif self.after_frame and self.undrawn is not None:
            own = min(seconds, self.undrawn)
            self.working, self.drawing = self.working + own, self.drawing + seconds - own
        else:
            self.working += seconds
            self.undrawn = seconds if self.undrawn is None else 0.8 * self.undrawn + 0.2 * seconds
        self.after_frame = False

    def due(self, step: Step) -> bool:
        """Whether ``step`` is drawn: every status line and last frame; a running round while drawing is in budget."""
        return not _round(step) or self.drawing <= self.working * DRAW_SHARE / (1 - DRAW_SHARE)

    def drawn(self, frame, step: Step) -> Iterator:
        """Yield ``frame`` (a callable making ``step``'s), counting its drawing and the time until the next one is
        asked."""
        tic = self.clock()
        try:
            yield frame()
        finally:
            if (
                step.run is not None
            ):  # a status line's before the run is the host's, as that step's seconds are
                self.drawing += self.clock() - tic
            self.after_frame = _round(step)


def _round(step: Step) -> bool:
    """Whether ``step`` is a running round's (not a status line, not the last frame)."""
    return step.state == "running" and step.run is not None


# of a Live run's time at most goes to drawing its running frames (benchmarks/live_estimate.py)
DRAW_SHARE = 0.25


def live_frames(runtime: Runtime, stops: StopRequests, inputs: Inputs, request: gr.Request = None):
    """Generate with DEX, yielding (text, lattice, fsm, stats, trace, meta, origin, status) once per explorer round
    while drawing keeps up (``Frames``: when it falls behind, rounds are coalesced into the next frame); Stop
    (``stops``) or the host's bound on model time ends the run after the round in progress."""
    frames = Frames()
    for step in frames.steps(live_steps(runtime, stops, inputs, request)):
        if not frames.due(step):
            continue
        yield from frames.drawn(lambda: _frame(step), step)


def _frame(step: Step) -> tuple:
    """What the page shows of ``step``."""
    if step.state == "error":
        tail = (
            "; the panels show this run up to its last round" if step.run else f" — nothing ran; {PREVIOUS}"
        )
        return _status_only("error", step.detail + tail)
    if step.run is None:
        return _status_only(step.state, step.detail)
    return step.run.frame(step.state, step.detail)


def live_steps(runtime: Runtime, stops: StopRequests, inputs: Inputs, request: gr.Request = None):
    """The Live run of ``inputs``, one ``Step`` per status line and per explorer round; bad input is one error step
    and nothing runs. Stop (``stops``) or the host's bound on model time ends the run after the round in progress.
    Live runs share the model, and with the same settings their rounds (``Runtime.sharing``, ``DexDecoder.share``)."""
    with runtime.sharing.shared():
        yield from _live_steps(runtime, stops, inputs, request)


def _live_steps(runtime: Runtime, stops: StopRequests, inputs: Inputs, request: gr.Request | None):
    session = session_of(request)
    stops.take(session)  # a Stop pressed before this run started does not apply to it
    yield Step("running", "starting")
    try:
        config = inputs.config()
        prompt = check_text(inputs.prompt)  # bad input is told before a first use loads the model; once
        for line in loading(runtime):
            yield Step("running", line)
        if not runtime.round_timed(runtime.decoder(config)):
            yield Step("running", TIMING)
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


def page_seconds(cost: RoundCost) -> float:
    """The seconds the page adds to a round of a run like ``cost``'s: drawing one frame of its last round (the
    second of two draws, timed here), at most the share ``Frames`` lets drawing take of a round."""
    panels(cost.events)
    tic = time.perf_counter()
    panels(cost.events)
    return min(time.perf_counter() - tic, cost.round_seconds * DRAW_SHARE / (1 - DRAW_SHARE))


def _live_start(runtime: Runtime, config, prompt: str) -> LiveRun:
    """The run of ``config`` on the prompt: its decoder's stream, its first time estimate and what the status line
    says of the prompt (without a chat template it goes in as written), after warning about slow settings and what
    the model's generation config asks for that DEX does not apply."""
    decoder = runtime.decoder(config)
    request = decoder.request(
        runtime.encode(prompt, config.chat), options=config.generation()
    )  # checked once
    first = runtime.forecast(decoder, config.max_new_tokens, page=page_seconds)
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
        stream=decoder.stream(request, node_text=True),  # the lattice is drawn
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
            run.slow = (
                run.pace.notice() or run.slow
            )  # said from then on in the status line, gone when the run ends
        left = f" · {run.pace.status()}" if run.pace else ""
        left += f" · {run.slow}" if run.slow else ""
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
