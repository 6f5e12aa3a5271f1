"""Event handlers of the DEX app's Live, Race and Analysis tabs and of the page load (the Debugger's own
are in ``app.debugger``): they call ``dex_core`` and draw with ``visualize`` (traces only).

Bad input never raises out of the Live handler: it yields only a status line ("error: …") and leaves
every panel as it was, so the previous run stays on screen, labelled as such, with one message.
"""

from __future__ import annotations

import sys
import threading
import time

import gradio as gr

import visualize as viz
from dex_core import DecoderOptions, DexError, ExplorerError, ar_stream
from dex_core.adapters import choose_depths, resolve_adapters
from dex_core.cost import ModelCost
from dex_core.ead import readiness
from dex_core.lens import depth_view
from dex_core.profile import exchange_seconds
from dex_core.proposal import proposal_rows
from dex_core.request import check_text, ignored_settings

from . import debugger as dbg
from .runtime import Runtime, ui_config

PREVIOUS = "the panels below still show the previous run"
LIVE = "this session's live run"  # the origin of a Live run's trace


def _error(err: Exception):
    return gr.Error(str(err), print_exception=False)


def _explorer_line(err: ExplorerError) -> str:
    """A short message naming the rank (the cause and its traceback go to the server log only)."""
    print(f"[dex] {err}", file=sys.stderr, flush=True)
    line = str(err).splitlines()[0]
    if " failed: " in line:
        line = line.split(" failed: ")[0] + " failed (the cause is in the server log)"
    return f"{line}; the next request starts fresh explorers"


def _guarded(stream):
    """Yield from a decoder's stream; an explorer failure becomes a ``gr.Error`` with a short message."""
    try:
        yield from stream
    except ExplorerError as err:
        raise gr.Error(_explorer_line(err), print_exception=False) from None


def _end(events):
    return events[-1] if events and events[-1]["event"] == "end" else None


def _panels(events) -> tuple:
    view = dbg.views(events)[-1]
    return (viz.tokens_html(view), viz.lattice_figure(view), viz.fsm_html(view),
            viz.stats_html(view, end=_end(events)))


def _status_only(state: str, detail: str) -> tuple:
    return (gr.skip(),) * 7 + (viz.status_html(state, detail),)


class StopRequests:
    """Sessions whose Stop was pressed. The Live handler checks its session after every round and ends
    itself with a "stopped" frame (a cancelled generator could still deliver a round after the Stop
    handler's "stopped" and overwrite it)."""

    def __init__(self):
        self._sessions: set[str] = set()
        self._lock = threading.Lock()

    def request(self, session: str) -> None:
        with self._lock:
            self._sessions.add(session)

    def take(self, session: str) -> bool:
        with self._lock:
            found = session in self._sessions
            self._sessions.discard(session)
            return found


def _session(request: gr.Request | None) -> str:
    return getattr(request, "session_hash", None) or ""


def live_frames(runtime: Runtime, stops: StopRequests, prompt, chat, explorers, depths, adapters, decs, sample,
                temperature, top_k, top_p, seed, max_new_tokens, prune="auto", request: gr.Request = None):
    """Generate with DEX, yielding (text, lattice, fsm, stats, trace, meta, origin, status) once per explorer round;
    Stop (``stops``) ends the run after the round in progress."""
    session = _session(request)
    stops.take(session)  # a Stop pressed before this run started does not apply to it
    yield _status_only("running", "starting")
    try:
        for line in _loading(runtime):
            yield _status_only("running", line)
        config = ui_config(chat=chat, explorers=explorers, depths=depths, adapters=adapters, decs=decs, sample=sample,
                           temperature=temperature, top_k=top_k, top_p=top_p, seed=seed,
                           max_new_tokens=max_new_tokens, prune=prune)
        check_text(prompt)
        ids = runtime.encode(prompt, config.chat)
        decoder = runtime.decoder(config)
        notices = [runtime.device_notice(decoder.K), runtime.slow_notice(decoder, config.max_new_tokens),
                   *ignored_settings(decoder.model.generation_config, config.generation())]
        for notice in notices:
            if notice:
                gr.Warning(notice)
        stream = decoder.stream(ids, options=config.generation())
        events = [next(stream)]
    except (DexError, ExplorerError) as err:
        yield _status_only("error", f"{err} — nothing ran; {PREVIOUS}")
        return
    meta = {"model": runtime.settings.model, "prompt": prompt}
    tokens, tic = 0, time.monotonic()
    try:
        for event in stream:
            events.append(event)
            if event["event"] != "round":
                continue
            tokens += 1 if event["commit"] else 0
            if stops.take(session):
                stream.close()
                yield _panels(events) + (events, meta, LIVE, viz.status_html(
                    "stopped", f"stopped by you after round {event['round']} ({tokens} tokens): the panels show the "
                               "run so far; the Debugger holds what ran"))
                return
            left = (time.monotonic() - tic) / tokens * (config.max_new_tokens - tokens) if tokens >= 2 else None
            yield _panels(events) + (events, meta, LIVE, viz.status_html(
                "running", f"round {event['round']} · {tokens} tokens · K={decoder.K}"
                           + (f" · about {left:.0f} s left" if left is not None else "")))
    except ExplorerError as err:
        yield _status_only("error", f"{_explorer_line(err)}; the panels show this run up to its last round")
        return
    stats = events[-1]["stats"] if _end(events) else {}
    yield _panels(events) + (events, meta, LIVE, viz.status_html(
        "finished", f"{tokens} tokens in {stats.get('rounds', '?')} rounds · K={decoder.K}"))


def _loading(runtime: Runtime):
    """Load the model in a thread (when it is not loaded yet), yielding a status line twice a second: the
    loading stage ``load_model`` reports (fetching, converting, loading) and its elapsed time."""
    if runtime.loaded:
        return
    stage, failed, done = [f"loading {runtime.settings.model}"], [], threading.Event()

    def work():
        try:
            runtime.model(log=lambda line: stage.__setitem__(0, line))
        except Exception as err:  # raised again in the request's own thread
            failed.append(err)
        finally:
            done.set()

    threading.Thread(target=work, daemon=True).start()
    tic = time.monotonic()
    while not done.wait(0.5):
        yield f"first use: {stage[0]} ({time.monotonic() - tic:.0f} s)"
    if failed:
        raise failed[0]


def stop(stops: StopRequests, status: str, request: gr.Request = None):
    """Stop: says "stopped" at once; this session's running Live handler ends after its current round and
    says "stopped" too (its last frame), so no late round can leave "running" on screen."""
    if "data-state='running'" not in (status or ""):
        return gr.skip()
    stops.request(_session(request))
    return viz.status_html("stopped", "stopped by you: the run ends after the round in progress")


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
    return (events, opened.meta, opened.origin, *_panels(events), viz.status_html("example", note + hint),
            *dbg.frame(events, dbg.last_round(events)), dbg.timeline(events), viz.status_html("example", note),
            gr.Tabs(selected="debugger") if name else gr.skip())


def race_frames(runtime: Runtime, prompt, chat, explorers, adapters, max_new_tokens):
    """AR and DEX on one prompt, interleaved in this process: the method whose own clock is behind
    takes the next step, so both run under the same load until one finishes.

    Clocks are each method's own compute time, so the two panes fill at their measured speeds. DEX's
    projected K-device clock (each round's slowest explorer, plus the exchange between devices from this
    machine's profile, ``dex_core.profile``) is drawn next to its measured one; the summary adds rounds
    per token, the depth-side speedup and the cost per token of the project's cost model (heads included).
    """
    try:
        config = ui_config(chat=chat, explorers=explorers, adapters=adapters, max_new_tokens=max_new_tokens)
        check_text(prompt)
        for line in _loading(runtime):
            yield gr.skip(), gr.skip(), gr.skip(), viz.status_html("running", line)
        ids = runtime.encode(prompt, config.chat)
        model, tokenizer = runtime.model()
        decoder = runtime.decoder(config)
        distributed = runtime.settings.backend == "distributed"
        if not distributed and not runtime.profiled(decoder):
            yield gr.skip(), gr.skip(), gr.skip(), viz.status_html(
                "running", "first race: timing this machine's layers, heads and exchange for the projection (once)")
        profile = None if distributed else runtime.profile(decoder)
        ar = ar_stream(model, ids, options=config.generation(), tokenizer=tokenizer)
        dex = _guarded(decoder.stream(ids, options=config.generation()))
        next(ar), next(dex)
    except DexError as err:
        raise _error(err) from None
    first = None  # the method that finished first (the other then ran alone)
    clocks = {"ar": 0.0, "dex": 0.0, "proj": 0.0}
    times = {"ar": [], "dex": [], "proj": []}
    tokens = {"ar": [], "dex": []}
    ends = {}
    while len(ends) < 2:
        side = "ar" if "dex" in ends or ("ar" not in ends and clocks["ar"] <= clocks["dex"]) else "dex"
        event = next(ar if side == "ar" else dex)
        if event["event"] == "end":
            ends[side] = event
        elif side == "ar":
            clocks["ar"] = event["seconds"]
            tokens["ar"].append(event["token"])
            times["ar"].append(clocks["ar"])
        else:
            t = event["timings"]
            clocks["dex"] += t["prefill"] + t["round"]
            clocks["proj"] += t["projected"] + (exchange_seconds(profile, [len(b) for b in event["batches"]])
                                                if profile else 0.0)
            if event["commit"]:
                tokens["dex"].append(event["commit"]["token"])
                times["dex"].append(clocks["dex"])
                times["proj"].append(clocks["proj"])
        yield _race_view(tokenizer, tokens, times, ends, distributed, decoder, model, first)
        first = first or side if event["event"] == "end" else first


def _race_view(tokenizer, tokens, times, ends, distributed, decoder, model, first):
    K = decoder.K
    series = [{"name": "AR (measured)", "times": times["ar"]},
              {"name": "DEX " + ("distributed (measured)" if distributed else "sequential, one device (measured)"),
               "times": times["dex"]}]
    projected = None if distributed else f"DEX projected on {K} devices (communication included)"
    if projected:
        series.append({"name": projected, "times": times["proj"], "dash": True})
    facts = None
    if "dex" in ends:
        stats = ends["dex"]["stats"]
        cost = ModelCost.of(model, decoder.adapters, decoder.proposal_vocab)
        T = max(1, stats["tokens"])
        covered = sorted(decoder.adapters)
        facts = {"K": K, "depths": list(decoder.depths), "rounds_per_token": stats["rounds_per_token"],
                 "depth_speedup": stats["depth_speedup"], "ar_cost": cost.ar(), "first": first,
                 "dex_cost": cost.dex(decoder.depths, stats["batch_sizes"], T, "memory", covered),
                 "dex_cost_rows": cost.dex(decoder.depths, stats["batch_sizes"], T, "rows", covered)}
    summary = viz.race_summary_html(tokens, times, len(ends) == 2, projected and projected + " — a projection", facts)
    return (tokenizer.decode(tokens["ar"], skip_special_tokens=True),
            tokenizer.decode(tokens["dex"], skip_special_tokens=True), viz.race_figure(series), summary)


def analyse(runtime: Runtime, prompt, chat, adapters, max_new_tokens, metric="probability"):
    """EAD of each token of the greedy answer, the speedups and costs it predicts for K = 2..8, and the
    depth view: the committed token's probability (or rank) at every layer, explored depths marked."""
    try:
        config = ui_config(chat=chat, adapters=adapters, max_new_tokens=max_new_tokens)
        check_text(prompt)
        ids = runtime.encode(prompt, config.chat)
        model, tokenizer = runtime.model()
        *_, end = ar_stream(model, ids, options=config.generation())
        chosen = resolve_adapters(config.adapters, model)
        cost = ModelCost.of(model, chosen, proposal_rows("auto", model.config.vocab_size))  # the decoders' default
        result = readiness(model, ids, end["tokens"], chosen, best=True, cost=cost)
        view = depth_view(model, ids, end["tokens"], chosen)
        depths, _ = choose_depths(model, DecoderOptions(explorers=runtime.settings.explorers, adapters=config.adapters))
    except DexError as err:
        raise _error(err) from None
    seen = {t for row in view["top"] for layer in row for t, _ in layer} | set(view["tokens"])
    texts = {t: tokenizer.decode([t]) for t in seen}
    depth = viz.depth_figure(view, texts, depths[:-1], "rank" if metric == "rank" else "prob")
    return viz.ead_figure(result), viz.speedup_figure(result), viz.readiness_table_html(result, chosen), depth
