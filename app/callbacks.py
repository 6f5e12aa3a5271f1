"""Event handlers of the DEX app's Live and Analysis tabs and of the page load (the Debugger's own are in
``app.debugger``, the Race's in ``app.race``): they call ``dex_core`` and draw with ``visualize`` (traces only).

The API's events pass their inputs unprocessed (``preprocess=False``): every handler checks its own
inputs (``ui_config``, ``check_text``), so bad input from an API client gets the documented message and
no traceback. The Live handler never raises on it: it yields only a status line ("error: …") and leaves
every panel as it was, so the previous run stays on screen, labelled as such, with one message.
A request's model time is bounded by the host (``Deadline``); a run past it ends with what it made.
"""

from __future__ import annotations

import functools
import inspect
import sys

import gradio as gr

import visualize as viz
from dex_core import DecoderOptions, DexError, ExplorerError, ar_stream
from dex_core.model.adapter_choice import choose_depths, resolve_adapters
from dex_core.model.cost import ModelCost
from dex_core.model.lens import depth_view
from dex_core.model.proposal import proposal_rows
from dex_core.runtime.request import check_text, ignored_settings, no_chat_template
from dex_core.tools.ead import readiness
from dex_core.trace.events import round_commits

from . import debugger as dbg
from .estimate import Pace
from .model_work import Deadline, StopRequests, in_background
from .runtime import Runtime
from .settings import ui_config

PREVIOUS = "the panels below still show the previous run"
LIVE_OPTIONS = (  # the Live inputs that make its config, by name
    *("chat", "explorers", "depths", "adapters", "decs", "sample", "temperature", "top_k", "top_p", "seed"),
    *("max_new_tokens", "prune", "draft"),
)
LIVE = "this session's live run"  # the origin of a Live run's trace


def short_error(err: Exception):
    return gr.Error(str(err), print_exception=False)


def explorer_line(err: ExplorerError) -> str:
    """A short message naming the rank (the cause and its traceback go to the server log only)."""
    print(f"[dex] {err}", file=sys.stderr, flush=True)
    line = str(err).splitlines()[0]
    if " failed: " in line:
        line = line.split(" failed: ")[0] + " failed (the cause is in the server log)"
    return f"{line}; the next request starts fresh explorers"


def _end(events):
    return events[-1] if events and events[-1]["event"] == "end" else None


def _panels(events) -> tuple:
    view = dbg.views(events)[-1]
    return (
        viz.tokens_html(view),
        viz.lattice_figure(view),
        viz.fsm_html(view),
        viz.stats_html(view, end=_end(events)),
    )


def _status_only(state: str, detail: str) -> tuple:
    return (gr.skip(),) * 7 + (viz.status_html(state, detail),)


def bind(fn, *bound):
    """``functools.partial(fn, *bound)`` as Gradio needs it: Gradio fills a ``gr.Request`` parameter only
    when it reads the annotation, which a partial hides (every session then looked the same to Stop), and
    streams only from a generator function."""
    if inspect.isgeneratorfunction(fn):

        def handler(*args, **kwargs):
            yield from fn(*bound, *args, **kwargs)
    else:

        def handler(*args, **kwargs):
            return fn(*bound, *args, **kwargs)

    functools.update_wrapper(handler, fn)
    handler.__signature__ = inspect.signature(functools.partial(fn, *bound))
    return handler


def session_of(request: gr.Request | None) -> str:
    return getattr(request, "session_hash", None) or ""


def live_frames(
    runtime: Runtime,
    stops: StopRequests,
    prompt,
    chat,
    explorers,
    depths,
    adapters,
    decs,
    sample,
    temperature,
    top_k,
    top_p,
    seed,
    max_new_tokens,
    prune="auto",
    draft=True,
    request: gr.Request = None,
):  # the Live tab's inputs, in the order of its API
    """Generate with DEX, yielding (text, lattice, fsm, stats, trace, meta, origin, status) once per explorer round;
    Stop (``stops``) or the host's bound on model time ends the run after the round in progress."""
    session = session_of(request)
    stops.take(session)  # a Stop pressed before this run started does not apply to it
    yield _status_only("running", "starting")
    try:
        config = ui_config(**{k: v for k, v in locals().items() if k in LIVE_OPTIONS})
        check_text(prompt)  # bad input is told before a first use loads the model
        for line in loading(runtime):
            yield _status_only("running", line)
        decoder, stream, first, note = _live_start(runtime, config, prompt)
        if first or note:
            estimate = (
                f"K={decoder.K} × {config.max_new_tokens} tokens: {first.text()}" if first else "starting"
            )
            yield _status_only("running", " · ".join(filter(None, (estimate, note))))
        events = [next(stream)]
    except (DexError, ExplorerError) as err:
        yield _status_only("error", f"{err} — nothing ran; {PREVIOUS}")
        return
    frame = functools.partial(_live_frame, events, {"model": runtime.settings.model, "prompt": prompt})
    bound = runtime.settings.request_seconds
    pace = first and Pace(first, decoder.K, config.max_new_tokens, bound)
    try:
        yield from _live_rounds(
            stream,
            events,
            frame,
            (stops, session, Deadline(bound)),
            (decoder.K, config.max_new_tokens, pace, note),
        )
    except ExplorerError as err:
        yield _status_only("error", f"{explorer_line(err)}; the panels show this run up to its last round")
    runtime.learn(decoder.K, events, pace and pace.elapsed())  # as the page saw it, frames drawn too


def _live_start(runtime: Runtime, config, prompt: str):
    """The decoder for ``config``, its stream over the prompt, its first time estimate (None for explorer
    groups) and what the status line says of the prompt (without a chat template it goes in as written), after
    warning about slow settings and what the model's generation config asks for that DEX does not apply."""
    ids = runtime.encode(prompt, config.chat)
    decoder = runtime.decoder(config)
    first = runtime.forecast(decoder, config.max_new_tokens)
    notices = [
        runtime.device_notice(decoder.K),
        runtime.slow_notice(decoder, config.max_new_tokens, first=first),
        *ignored_settings(decoder.view.model.generation_config, config.generation()),
    ]
    for notice in notices:
        if notice:
            gr.Warning(notice)
    note = (
        no_chat_template(runtime.tokenizer(), config.chat)
        and "no chat template: the prompt goes in as written"
    )
    return decoder, decoder.stream(ids, options=config.generation()), first, note


def _live_frame(events: list, meta: dict, state: str, detail: str) -> tuple:
    return _panels(events) + (events, meta, LIVE, viz.status_html(state, detail))


def _live_rounds(stream, events: list, frame, stopping: tuple, run: tuple):
    """A frame per round until the end, or until Stop or the host's bound (``stopping``: the Stop requests, the
    session, the deadline) ends the run after its round. ``run``: K, the token count, the run's ``Pace`` (None:
    no estimate), whose one time-left figure the status line shows and whose notice comes once, and a note on
    the prompt the finished line repeats."""
    stops, session, deadline = stopping
    K, max_new_tokens, pace, note = run
    tokens = 0
    for event in stream:
        events.append(event)
        if event["event"] != "round":
            continue
        tokens += len(round_commits(event))  # several when a draft chain committed
        why = "by you" if stops.take(session) else deadline.reason()
        if why:
            stream.close()
            yield frame(
                "stopped",
                f"stopped {why} after round {event['round']} ({tokens} tokens): the panels show "
                "the run so far; the Debugger holds what ran",
            )
            return
        if pace:
            pace.update(event["round"], tokens)
            notice = pace.notice()
            if notice:
                gr.Info(notice)
        left = f" · {pace.status()}" if pace else ""
        yield frame("running", f"round {event['round']} · {tokens} tokens · K={K}{left}")
    stats = events[-1]["stats"] if _end(events) else {}
    yield frame(
        "finished",
        f"{tokens} tokens in {stats.get('rounds', '?')} rounds · K={K}" + f" · {note}" * bool(note),
    )


def loading(runtime: Runtime):
    """Load the model in a thread (when it is not loaded yet), yielding a status line twice a second: the
    loading stage ``load_model`` reports (fetching, converting, loading) and its elapsed time."""
    if runtime.loaded:
        return
    stage = [f"loading {runtime.settings.model}"]
    yield from in_background(
        lambda: runtime.prepare(log=lambda line: stage.__setitem__(0, line)),
        lambda s: f"first use: {stage[0]} ({s:.0f} s)",
    )


def stop(stops: StopRequests, status: str, request: gr.Request = None):
    """Stop: says "stopped" at once; this session's running Live handler ends after its current round and
    says "stopped" too (its last frame), so no late round can leave "running" on screen."""
    if "data-state='running'" not in (status or ""):
        return gr.skip()
    stops.request(session_of(request))
    return viz.status_html("stopped", "stopped by you: the run ends after the round in progress")


def busy():
    """A run button while its request runs or waits in the queue: not clickable (``idle`` after it ends,
    however it ends: finished, stopped, refused or failed)."""
    return gr.Button(interactive=False)


def idle():
    return gr.Button(interactive=True)


def sampling_controls(sample):
    """Temperature, top-k, top-p and the seed count only when sampling: not editable in greedy mode."""
    return (gr.update(interactive=sample is True),) * 4


def page_load(request: gr.Request):
    """The bundled example (or ``?trace=NAME`` from ``assets/traces``) in the Live panels, the Debugger and
    its timeline, without loading a model. Returns (trace, meta, origin, 4 Live panels, Live status, 5
    Debugger outputs, timeline, Debugger status, tabs)."""
    name = request.query_params.get("trace") if request is not None else None
    opened = dbg.bundled(name)
    events, note = opened.events, opened.note
    if not events:
        idle = viz.status_html("idle", dbg.EMPTY_HINT)
        return ([], {}, "", *(gr.skip(),) * 4, idle, *dbg.frame([], 0), None, idle, gr.skip())
    hint = " — press Generate to run your own prompt, or step through this one in the Debugger tab"
    return (
        events,
        opened.meta,
        opened.origin,
        *_panels(events),
        viz.status_html("example", note + hint),
        *dbg.frame(events, dbg.last_round(events)),
        dbg.timeline(events),
        viz.status_html("example", note),
        gr.Tabs(selected="debugger") if name else gr.skip(),
    )


def example_prompt(request: gr.Request):
    """The prompt of the run the page opens on (the bundled example or ``?trace=NAME``) for the Live prompt
    box, so that the box and the panels below it show the same run; unchanged for a trace without one."""
    prompt = dbg.bundled(request.query_params.get("trace") if request is not None else None).meta.get(
        "prompt"
    )
    return prompt if isinstance(prompt, str) and prompt.strip() else gr.skip()


METRICS = ("probability", "rank")  # the Analysis's depth view colours


def _greedy_answer(model, ids, config, deadline: Deadline) -> tuple[list[int], str | None]:
    """The greedy answer's tokens, and why it ended early (the host's bound), or None."""
    tokens = []
    for event in ar_stream(model, ids, options=config.generation()):
        if event["event"] == "token":
            tokens.append(event["token"])
            if deadline.reason():
                return tokens, deadline.reason()
    return tokens, None


def analyse(runtime: Runtime, prompt, chat, adapters, max_new_tokens, metric="probability"):
    """EAD of each token of the greedy answer, the speedups and costs it predicts for K = 2..8, and the
    depth view: the committed token's probability (or rank) at every layer, explored depths marked. An
    answer cut at the host's bound is analysed as far as it got, and the table says so first."""
    try:
        if metric not in METRICS:
            raise DexError(f"metric must be one of {', '.join(METRICS)}; got {str(metric)!r:.40}")
        config = ui_config(chat=chat, adapters=adapters, max_new_tokens=max_new_tokens)
        check_text(prompt)
        runtime.need_whole_model("the Analysis")
        ids = runtime.encode(prompt, config.chat)
        model, tokenizer = runtime.model("the Analysis")
        notice = runtime.slow_notice(None, config.max_new_tokens)
        if notice:
            gr.Warning(notice)
        tokens, cut = _greedy_answer(model, ids, config, Deadline(runtime.settings.request_seconds))
        chosen = resolve_adapters(config.adapters, model)
        cost = ModelCost.of(
            model, chosen, proposal_rows("auto", model.config.vocab_size)
        )  # the decoders' default
        result = readiness(model, ids, tokens, chosen, best=True, cost=cost)
        view = depth_view(model, ids, tokens, chosen)
        depths, _ = choose_depths(
            model, DecoderOptions(explorers=runtime.settings.explorers, adapters=config.adapters)
        )
    except DexError as err:
        raise short_error(err) from None
    seen = {t for row in view["top"] for layer in row for t, _ in layer} | set(view["tokens"])
    texts = {t: tokenizer.decode([t]) for t in seen}
    depth = viz.depth_figure(view, texts, depths[:-1], "rank" if metric == "rank" else "prob")
    table = viz.readiness_table_html(result, chosen)
    if cut:
        table = (
            viz.status_html(
                "stopped",
                f"the answer stopped {cut} after {len(tokens)} of "
                f"{config.max_new_tokens} tokens: this analyses those",
            )
            + table
        )
    return viz.ead_figure(result), viz.speedup_figure(result), table, depth
