"""The Race tab's handler: one prompt through AR and DEX, with Stop and the host's bound on a request's model time.

Sequential backend: AR is HF-style AR over the whole model (``ar_stream``), interleaved with DEX in this
process. Distributed backend, where no process holds the whole model: AR goes through the same K stages on the
same explorer processes and devices (``stream(pipeline=True)``, pipeline-parallel AR), run first, then DEX
(one group serves one request at a time); both clocks are measured on the devices, nothing is projected.

The clocks start only after the model is loaded and this machine's profile (``dex_core.tools.profile``, for
the K-device projection) is measured or read from its cache, so neither first-use cost is in either
clock. A race that is stopped (by its visitor, or at the bound) ends with what both made so far.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import gradio as gr

import visualize as viz
from dex_core import DexError, ExplorerError, ar_stream
from dex_core.runtime.request import check_text
from dex_core.tools.profile import exchange_seconds
from dex_core.trace.events import round_commits

from .callbacks import explorer_line, loading, session_of, short_error
from .model_work import Deadline, StopRequests, in_background
from .runtime import Runtime
from .settings import ui_config

NAMES = {"ar": "AR", "dex": "DEX"}


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
class _Race:
    """A race under way: the two streams, and per side its clock, its tokens and when each came."""

    ar: object
    dex: object
    decoder: object
    tokenizer: object
    profile: dict | None  # the seconds profile for the projection (None: distributed, measured for real)
    clocks: dict = field(default_factory=lambda: {"ar": 0.0, "dex": 0.0, "proj": 0.0})
    times: dict = field(default_factory=lambda: {"ar": [], "dex": [], "proj": []})
    tokens: dict = field(default_factory=lambda: {"ar": [], "dex": []})
    ends: dict = field(default_factory=dict)
    first: str | None = None  # the method that finished first (the other then ran alone)

    def view(self, stopped=None) -> tuple:
        return _race_view(
            self.tokenizer, self.tokens, self.times, self.ends, self.decoder, self.first, stopped
        )

    def step(self) -> None:
        """The next event of the side whose own clock is behind (the other, once one has ended); distributed, AR
        until it ends, then DEX (both lanes use the same explorer processes)."""
        behind = self.clocks["ar"] <= self.clocks["dex"] or self.profile is None
        side = "ar" if "dex" in self.ends or ("ar" not in self.ends and behind) else "dex"
        try:
            event = next(self.ar if side == "ar" else self.dex)
        except ExplorerError as err:
            raise gr.Error(explorer_line(err), print_exception=False) from None
        if event["event"] == "end":
            self.ends[side] = event
            self.first = self.first or NAMES[side]
        elif event["event"] == "token":  # AR over the whole model
            self.clocks["ar"] = event["seconds"]
            self.tokens["ar"].append(event["token"])
            self.times["ar"].append(self.clocks["ar"])
        else:  # a round: of DEX, or of AR through the stages
            t = event["timings"]
            self.clocks[side] += t["prefill"] + t["round"]
            if side == "dex" and self.profile is not None:
                self.clocks["proj"] += t["projected"] + exchange_seconds(
                    self.profile, [len(b) for b in event["batches"]]
                )
            for commit in round_commits(event):  # several when a draft chain committed
                self.tokens[side].append(commit["token"])
                self.times[side].append(self.clocks[side])
                if side == "dex" and self.profile is not None:
                    self.times["proj"].append(self.clocks["proj"])


def race_frames(
    runtime: Runtime,
    stops: StopRequests,
    prompt,
    chat,
    explorers,
    adapters,
    max_new_tokens,
    draft=True,
    request: gr.Request = None,
):
    """AR and DEX on one prompt, interleaved in this process: the method whose own clock is behind
    takes the next step, so both run under the same load until one finishes.

    Clocks are each method's own compute time, so the two panes fill at their measured speeds. DEX's
    projected K-device clock (each round's slowest explorer, plus the exchange between devices from this
    machine's profile) is drawn next to its measured one. Stop (``stops``) or the host's bound
    (``request_seconds``) ends the race after the step in progress, keeping both panes.
    """
    session = session_of(request)
    stops.take(session)  # a Stop pressed before this race started does not apply to it
    try:
        config = ui_config(
            chat=chat, explorers=explorers, adapters=adapters, max_new_tokens=max_new_tokens, draft=draft
        )
        check_text(prompt)
        race = yield from _start(runtime, config, prompt)
    except DexError as err:
        raise short_error(err) from None
    deadline = Deadline(
        runtime.settings.request_seconds
    )  # model time from here: loading and profiling are not in it
    while len(race.ends) < 2:
        why = "by you" if stops.take(session) else deadline.reason()
        if why:
            race.ar.close()
            race.dex.close()
            yield race.view(stopped=why)
            return
        race.step()
        yield race.view()


def _start(runtime: Runtime, config, prompt: str):
    """Load the model (first use) and time this machine (first race), yielding status lines; then both streams,
    past their start events: the ``_Race``."""
    for line in loading(runtime):
        yield _status(line)
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
        yield from map(_status, _profiling(runtime, decoder))
        ar = ar_stream(model, ids, options=config.generation(), tokenizer=tokenizer)
        profile = runtime.profile(decoder)
    dex = decoder.stream(ids, options=config.generation())
    next(ar), next(dex)
    return _Race(ar, dex, decoder, tokenizer, profile)


def _devices(K: int) -> str:
    return f"{K} device{'s' * (K != 1)}"


def _race_view(tokenizer, tokens, times, ends, decoder, first, stopped=None):
    """The Race's panes, each lane labelled: sequential, AR over the whole model and DEX on one device, and DEX's
    projected K-device clock; distributed, AR through the same K stages and DEX, both on the K devices."""
    K, distributed = decoder.K, decoder.group is not None
    if distributed:
        series = [
            {"name": f"AR through the same {K} stages on {_devices(K)} (measured)", "times": times["ar"]},
            {"name": f"DEX on {_devices(K)} (measured)", "times": times["dex"]},
        ]
    else:
        series = [
            {"name": "AR, the whole model on one device (measured)", "times": times["ar"]},
            {"name": "DEX sequential, one device (measured)", "times": times["dex"]},
            {
                "name": f"DEX projected on {_devices(K)} (communication included)",
                "times": times["proj"],
                "dash": True,
            },
        ]
    facts = {"K": K, "first": first, "distributed": distributed}
    if "dex" in ends:
        stats = ends["dex"]["stats"]
        cost = decoder.cost_model
        T = max(1, stats["tokens"])
        covered = sorted(decoder.adapters)
        facts.update(
            depths=list(decoder.depths),
            rounds_per_token=stats["rounds_per_token"],
            depth_speedup=stats["depth_speedup"],
            ar_cost=cost.ar(),
            dex_cost=cost.dex(decoder.depths, stats["batch_sizes"], T, "memory", covered),
            dex_cost_rows=cost.dex(decoder.depths, stats["batch_sizes"], T, "rows", covered),
        )
    summary = viz.race_summary_html(tokens, times, len(ends) == 2, facts, stopped)
    return (
        tokenizer.decode(tokens["ar"], skip_special_tokens=True),
        tokenizer.decode(tokens["dex"], skip_special_tokens=True),
        viz.race_figure(series),
        summary,
    )


def stop(stops: StopRequests, request: gr.Request = None) -> None:
    """The Race's Stop: this session's running race ends after its current step and says so."""
    stops.request(session_of(request))
