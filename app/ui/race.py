"""The Race tab's handler: one prompt through AR and DEX, with Stop and the host's bound on a request's model time.

Sequential backend: AR is HF-style AR over the whole model (``ar_stream``), interleaved with DEX in this
process. Distributed backend, where no process holds the whole model: AR goes through the same K stages on the
same explorer processes and devices (``stream(pipeline=True)``, pipeline-parallel AR), run first, then DEX
(one group serves one request at a time); both clocks are measured on the devices, nothing is projected.

The clocks start only after the model is loaded and this machine's profile (``dex_core.analysis.profile``, for
the K-device projection) is measured or read from its cache, so neither first-use cost is in either
clock. A race that is stopped (by its visitor, or at the bound) ends with what both made so far. The race itself is
``race_steps`` (status lines, then the ``Race`` after each step; no drawing), which the page draws (``race_frames``)
and the MCP tool reads (``app.ui.tools``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import gradio as gr

import visualize as viz
from dex_core import DexDecoder, DexError, ExplorerError, ar_stream
from dex_core.analysis.profile import projected_round_seconds
from dex_core.analysis.run_cost import run_cost
from dex_core.runtime.request import check_text
from dex_core.trace.events import EndEvent, Event, StartEvent, TokenEvent

from ..host.state import Runtime
from .handlers import (
    Deadline,
    Stopping,
    StopRequests,
    explorer_line,
    in_background,
    loading,
    session_of,
    short_error,
)
from .inputs import Inputs


def _status(line: str) -> tuple:
    return gr.skip(), gr.skip(), gr.skip(), viz.status_html("running", line)


def _profiling(runtime: Runtime, decoder):
    """Measure (or read) the profile in a thread, yielding a status line twice a second while it runs."""
    if runtime.profiled(decoder):
        return
    yield from in_background(
        lambda: runtime.profile(decoder),
        lambda s: (
            f"first race: timing this machine's layers, heads and exchange for the projection (once; outside both "
            f"clocks) ({s:.0f} s)"
        ),
    )


@dataclass
class Lane:
    """One lane of a race: its stream (None for DEX's projection, which follows DEX's rounds), its own clock, its
    tokens and the clock's time at each, and its end event once it ended."""

    name: str
    stream: Iterator[Event] | None = None
    clock: float = 0.0
    tokens: list[int] = field(default_factory=list)
    times: list[float] = field(default_factory=list)
    end: EndEvent | None = None


@dataclass
class Race:
    """A race under way: its AR and DEX lanes, DEX's projected K-device lane, and what the view needs."""

    ar: Lane
    dex: Lane
    decoder: DexDecoder
    tokenizer: object
    start: StartEvent  # DEX's: its depths, adapters and weights, what its cost per token is counted from
    profile: dict | None  # the seconds profile for the projection (None: distributed, measured for real)
    projected: Lane = field(default_factory=lambda: Lane("DEX projected"))
    first: str | None = None  # the lane that finished first (the other then ran alone)
    stopped: str | None = None  # why it ended before both lanes did ("by you", "at this host's limit …")

    @property
    def done(self) -> bool:
        return self.ar.end is not None and self.dex.end is not None

    def step(self) -> None:
        """The next event of the lane whose own clock is behind (the other, once one has ended); distributed, AR
        until it ends, then DEX (both lanes use the same explorer processes)."""
        behind = self.ar.clock <= self.dex.clock or self.profile is None
        lane = self.ar if self.dex.end is not None or (self.ar.end is None and behind) else self.dex
        try:
            event = next(lane.stream)
        except ExplorerError as err:
            raise gr.Error(explorer_line(err), print_exception=False) from None
        if isinstance(event, EndEvent):
            lane.end = event
            self.first = self.first or lane.name
        elif isinstance(event, TokenEvent):  # AR over the whole model
            lane.clock = event.seconds
            lane.tokens.append(event.token)
            lane.times.append(lane.clock)
        else:  # a round: of DEX, or of AR through the stages
            lane.clock += event.timings["prefill"] + event.timings["round"]
            projecting = lane is self.dex and self.profile is not None
            if projecting:
                self.projected.clock += projected_round_seconds(self.profile, event)
            for commit in event.commits:  # several when a draft chain committed
                lane.tokens.append(commit.token)
                lane.times.append(lane.clock)
                if projecting:
                    self.projected.times.append(self.projected.clock)

    def view(self, stopped=None) -> tuple:
        """The Race's panes: both texts, the tokens-vs-time figure and the summary (``stopped``: why it ended)."""
        times = {"ar": self.ar.times, "dex": self.dex.times, "proj": self.projected.times}
        summary = viz.race_summary_html(
            {"ar": self.ar.tokens, "dex": self.dex.tokens}, times, self.done, self.facts(), stopped
        )
        return (
            self.tokenizer.decode(self.ar.tokens, skip_special_tokens=True),
            self.tokenizer.decode(self.dex.tokens, skip_special_tokens=True),
            viz.race_figure(self._series()),
            summary,
        )

    def _series(self) -> list[dict]:
        """Each lane labelled: sequential, AR over the whole model and DEX on one device, and DEX's projected
        K-device clock; distributed, AR through the same K stages and DEX, both on the K devices."""
        K = self.decoder.K
        if self.decoder.group is not None:
            return [
                {
                    "name": f"AR through the same {K} stages on {_devices(K)} (measured)",
                    "times": self.ar.times,
                },
                {"name": f"DEX on {_devices(K)} (measured)", "times": self.dex.times},
            ]
        return [
            {"name": "AR, the whole model on one device (measured)", "times": self.ar.times},
            {"name": "DEX sequential, one device (measured)", "times": self.dex.times},
            {
                "name": f"DEX projected on {_devices(K)} (communication included)",
                "times": self.projected.times,
                "dash": True,
            },
        ]

    def facts(self) -> dict:
        """What the summary states: K, the schedule, who finished first, and once DEX ended its rounds per token
        and its cost per token against AR's (``run_cost``)."""
        facts = {"K": self.decoder.K, "first": self.first, "distributed": self.decoder.group is not None}
        if self.dex.end is not None:
            stats = self.dex.end.stats
            cost = run_cost(self.start, stats.batch_sizes, stats.tokens)
            facts.update(
                depths=list(self.start.depths),
                rounds_per_token=stats.rounds_per_token,
                depth_speedup=stats.depth_speedup,
                ar_cost=cost.ar,
                dex_cost=cost.memory,
                dex_cost_rows=cost.rows,
            )
        return facts


def race_frames(runtime: Runtime, stops: StopRequests, inputs: Inputs, request: gr.Request = None):
    """The Race's panes (AR text, DEX text, tokens-vs-time figure, summary) after each step of ``race_steps``, a status
    line before the race starts."""
    for step in race_steps(runtime, stops, inputs, request):
        yield _status(step) if isinstance(step, str) else step.view(stopped=step.stopped)


def race_steps(runtime: Runtime, stops: StopRequests, inputs: Inputs, request: gr.Request = None):
    """``_race_steps`` with the model to itself (``Runtime.sharing``): no Live run shares its rounds or its cores."""
    with runtime.sharing.alone():
        yield from _race_steps(runtime, stops, inputs, request)


def _race_steps(runtime: Runtime, stops: StopRequests, inputs: Inputs, request: gr.Request | None):
    """AR and DEX on one prompt, interleaved in this process: the method whose own clock is behind
    takes the next step, so both run under the same load until one finishes. Yields status lines (str) while the
    model loads and the machine is timed, then the ``Race`` after each step.

    Clocks are each method's own compute time, so the two panes fill at their measured speeds. DEX's
    projected K-device clock (each round's slowest explorer, plus the exchange between devices from this
    machine's profile) is drawn next to its measured one. Stop (``stops``) or the host's bound
    (``request_seconds``) ends the race after the step in progress, keeping both panes.
    """
    session = session_of(request)
    stops.take(session)  # a Stop pressed before this race started does not apply to it
    try:
        config = inputs.config()
        race = yield from _start(runtime, config, check_text(inputs.prompt))
    except DexError as err:
        raise short_error(err) from None
    # model time from here: loading and profiling are not in it
    stopping = Stopping(stops, session, Deadline(runtime.settings.request_seconds))
    while not race.done:
        why = stopping.reason()
        if why:
            race.ar.stream.close()
            race.dex.stream.close()
            race.stopped = why
            yield race
            return
        race.step()
        yield race


def _start(runtime: Runtime, config, prompt: str):
    """Load the model (first use) and time this machine (first race), yielding status lines; then both streams,
    past their start events: the ``Race``."""
    yield from loading(runtime)
    ids = runtime.encode(prompt, config.chat)
    decoder = runtime.decoder(config)
    notice = runtime.slow_notice(decoder, config.max_new_tokens, ar=True)
    if notice:
        gr.Warning(notice)
    if runtime.distributed:  # no process holds the whole model: AR through the same stages and devices
        ar, profile = decoder.stream(ids, options=config.generation(), pipeline=True), None
        tokenizer = runtime.tokenizer()
    else:
        model, tokenizer = runtime.model("the Race (its AR lane)")
        yield from _profiling(runtime, decoder)
        ar = ar_stream(model, ids, options=config.generation(), tokenizer=tokenizer)
        profile = runtime.profile(decoder)
    dex = decoder.stream(ids, options=config.generation())
    next(ar)
    start = next(dex)
    return Race(
        ar=Lane("AR", ar),
        dex=Lane("DEX", dex),
        decoder=decoder,
        tokenizer=tokenizer,
        start=start,
        profile=profile,
    )


def _devices(K: int) -> str:
    return f"{K} device{'s' * (K != 1)}"


def stop(stops: StopRequests, request: gr.Request = None) -> None:
    """The Race's Stop: this session's running race ends after its current step and says so."""
    stops.request(session_of(request))
