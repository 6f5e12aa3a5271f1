"""Event handlers of the DEX app: they call ``dex_core`` and draw with ``visualize`` (traces only)."""

from __future__ import annotations

import html
import sys

import gradio as gr

import visualize as viz
from dex_core import DexError, ExplorerError, ar_stream, load_trace, save_trace
from dex_core.adapters import resolve_adapters
from dex_core.ead import readiness
from dex_core.request import check_text

from .runtime import Runtime, ui_config


def _error(err: Exception):
    return gr.Error(str(err), print_exception=False)


def _guarded(stream):
    """Yield from a decoder's stream; an explorer failure becomes a short message naming the rank (the
    cause and its traceback go to the server log only) and the next request starts fresh explorers."""
    try:
        yield from stream
    except ExplorerError as err:
        print(f"[dex] {err}", file=sys.stderr, flush=True)
        line = str(err).splitlines()[0]
        if " failed: " in line:
            line = line.split(" failed: ")[0] + " failed (the cause is in the server log)"
        raise gr.Error(f"{line}; the next request starts fresh explorers", print_exception=False) from None


def _end(events):
    return events[-1] if events and events[-1]["event"] == "end" else None


def live_frames(runtime: Runtime, prompt, chat, explorers, depths, adapters, decs, sample, temperature, top_k,
                top_p, seed, max_new_tokens, progress=gr.Progress()):
    """Generate with DEX, yielding (text, lattice, fsm, stats, trace) once per explorer round."""
    try:
        config = ui_config(chat=chat, explorers=explorers, depths=depths, adapters=adapters, decs=decs, sample=sample,
                           temperature=temperature, top_k=top_k, top_p=top_p, seed=seed,
                           max_new_tokens=max_new_tokens)
        check_text(prompt)
        if not runtime.loaded:
            progress(0.1, desc=f"Loading {runtime.settings.model} (first use: fetched and cached once)")
        ids = runtime.encode(prompt, config.chat)
        decoder = runtime.decoder(config)
        if notice := runtime.device_notice(decoder.K):
            gr.Warning(notice)
        stream = _guarded(decoder.stream(ids, options=config.generation()))
        events = [next(stream)]
    except DexError as err:
        raise _error(err) from None
    for event in stream:
        events.append(event)
        if event["event"] != "round":
            continue
        view = viz.replay(events)[-1]
        yield (viz.tokens_html(view), viz.lattice_figure(view), viz.fsm_html(view), viz.stats_html(view),
               events)
    view = viz.replay(events)[-1]
    yield (viz.tokens_html(view), viz.lattice_figure(view), viz.fsm_html(view),
           viz.stats_html(view, end=_end(events)), events)


def race_frames(runtime: Runtime, prompt, chat, explorers, adapters, max_new_tokens):
    """AR and DEX on one prompt, each advanced while its own clock is behind the other's.

    Clocks are each method's own compute time, so the two panes fill at their measured speeds even
    though they share this process. DEX's projected K-device clock is drawn next to its measured one.
    """
    try:
        config = ui_config(chat=chat, explorers=explorers, adapters=adapters, max_new_tokens=max_new_tokens)
        check_text(prompt)
        ids = runtime.encode(prompt, config.chat)
        model, tokenizer = runtime.model()
        decoder = runtime.decoder(config)
        ar = ar_stream(model, ids, options=config.generation(), tokenizer=tokenizer)
        dex = _guarded(decoder.stream(ids, options=config.generation()))
        next(ar), next(dex)
    except DexError as err:
        raise _error(err) from None
    distributed = runtime.settings.backend == "distributed"
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
            clocks["proj"] += t["projected"]
            if event["commit"]:
                tokens["dex"].append(event["commit"]["token"])
                times["dex"].append(clocks["dex"])
                times["proj"].append(clocks["proj"])
        yield _race_view(tokenizer, tokens, times, ends, distributed, config.explorers)


def _race_view(tokenizer, tokens, times, ends, distributed, K):
    series = [{"name": "AR (measured)", "times": times["ar"]},
              {"name": "DEX " + ("distributed (measured)" if distributed else "sequential, one device (measured)"),
               "times": times["dex"]}]
    projected = None if distributed else f"DEX projected on {K} devices"
    if projected:
        series.append({"name": projected, "times": times["proj"], "dash": True})
    summary = viz.race_summary_html(tokens, times, len(ends) == 2, projected and projected + " — a projection")
    return (tokenizer.decode(tokens["ar"], skip_special_tokens=True),
            tokenizer.decode(tokens["dex"], skip_special_tokens=True), viz.race_figure(series), summary)


# Prev/Next/slider/Play reuse one replay per trace; small, since an entry keeps its trace alive (a trace
# at the limits is a few hundred MB in memory) and re-indexing one costs tens of milliseconds
_REPLAYS = viz.ReplayCache(size=2)


def _views(events) -> viz.Replay | list:
    return _REPLAYS(events) if events else []


def _index(index) -> int:
    try:
        return int(float(index or 0))
    except (TypeError, ValueError, OverflowError):
        return 0


def debug_frame(events, index):
    """Lattice, round table, FSM and text of round ``index`` of a recorded trace."""
    views = _views(events)
    if not views:
        empty = "<p>No trace yet: generate in the Live tab or load a saved trace.</p>"
        return None, empty, "", "", gr.Slider(minimum=0, maximum=1, value=0, step=1)
    i = max(0, min(_index(index), len(views) - 1))
    view = views[i]
    return (viz.lattice_figure(view), viz.round_table_html(view), viz.fsm_html(view), viz.tokens_html(view),
            gr.Slider(minimum=0, maximum=max(1, len(views) - 1), value=i, step=1,
                      label=f"Round index (0..{len(views) - 1}; round {view.round} shown)"))


def step(events, index, delta):
    n = len(_views(events))
    return max(0, min(_index(index) + delta, max(0, n - 1)))


def play_tick(events, index):
    """One Play step; stops the timer at the last round."""
    n = len(_views(events))
    nxt = _index(index) + 1
    if nxt >= n:
        return max(0, n - 1), gr.Timer(active=False)
    return nxt, gr.Timer(active=True)


def save(runtime: Runtime, events, meta):
    """The trace as a JSON file (in the server's file folder, removed after the session time-to-live)."""
    if not events:
        raise gr.Error("no trace to save yet: generate in the Live tab first", print_exception=False)
    path = runtime.file("dex-trace.json")
    save_trace(path, events, meta or {})
    return str(path)


def export_lattice(runtime: Runtime, events):
    """The run's whole lattice as a GraphML file (networkx; opens in Gephi, yEd, networkx)."""
    if not events:
        raise gr.Error("no trace yet: generate in the Live tab or load a saved trace", print_exception=False)
    return str(viz.export_graph(events, runtime.file("dex-lattice.graphml")))


def load(file):
    """A saved trace, validated (``dex_core.trace_schema``). A rejected file raises ``gr.Error`` with what
    is wrong and changes nothing: the session keeps the trace it had."""
    if file is None:
        raise gr.Error("choose a trace file (JSON saved by DEX) first", print_exception=False)
    try:
        events, meta = load_trace(file if isinstance(file, str) else file.name)
    except DexError as err:
        raise gr.Error(html.escape(f"this trace was not loaded: {err}"), print_exception=False) from None
    return events, meta, 0


def analyse(runtime: Runtime, prompt, chat, adapters, max_new_tokens):
    """EAD of each token of the greedy answer, and the speedups it predicts for K = 2..8."""
    try:
        config = ui_config(chat=chat, adapters=adapters, max_new_tokens=max_new_tokens)
        check_text(prompt)
        ids = runtime.encode(prompt, config.chat)
        model, _ = runtime.model()
        *_, end = ar_stream(model, ids, options=config.generation())
        chosen = resolve_adapters(config.adapters, model)
        result = readiness(model, ids, end["tokens"], chosen, best=True)
    except DexError as err:
        raise _error(err) from None
    return viz.ead_figure(result), viz.speedup_figure(result), viz.readiness_table_html(result, chosen)
