"""Event handlers of the DEX app: they call ``dex_core`` and draw with ``visualize`` (traces only)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import gradio as gr

import visualize as viz
from dex_core import DexError, ar_stream, load_trace, save_trace
from dex_core.adapters import resolve_adapters
from dex_core.ead import readiness

from .runtime import Runtime, ui_config


def _error(err: Exception):
    return gr.Error(str(err), print_exception=False)


def _end(events):
    return events[-1] if events and events[-1]["event"] == "end" else None


def live_frames(runtime: Runtime, prompt, chat, explorers, depths, adapters, decs, sample, temperature, top_k,
                top_p, seed, max_new_tokens, progress=gr.Progress()):
    """Generate with DEX, yielding (text, lattice, fsm, stats, trace) once per explorer round."""
    try:
        config = ui_config(chat=chat, explorers=explorers, depths=depths, adapters=adapters, decs=decs, sample=sample,
                           temperature=temperature, top_k=top_k, top_p=top_p, seed=seed,
                           max_new_tokens=max_new_tokens)
        if not (prompt or "").strip():
            raise DexError("the prompt is empty; type something to continue")
        if not runtime.loaded:
            progress(0.1, desc=f"Loading {runtime.settings.model} (first use: fetched and cached once)")
        ids = runtime.encode(prompt, config.chat)
        decoder = runtime.decoder(config)
        if notice := runtime.device_notice(decoder.K):
            gr.Warning(notice)
        stream = decoder.stream(ids, options=config.generation())
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
        if not (prompt or "").strip():
            raise DexError("the prompt is empty; type something to continue")
        ids = runtime.encode(prompt, config.chat)
        model, tokenizer = runtime.model()
        decoder = runtime.decoder(config)
        ar = ar_stream(model, ids, options=config.generation(), tokenizer=tokenizer)
        dex = decoder.stream(ids, options=config.generation())
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


def debug_frame(events, index):
    """Lattice, round table, FSM and text of round ``index`` of a recorded trace."""
    views = viz.replay(events or [])
    if not views:
        empty = "<p>No trace yet: generate in the Live tab or load a saved trace.</p>"
        return None, empty, "", "", gr.Slider(minimum=0, maximum=1, value=0, step=1)
    i = max(0, min(int(index or 0), len(views) - 1))
    view = views[i]
    return (viz.lattice_figure(view), viz.round_table_html(view), viz.fsm_html(view), viz.tokens_html(view),
            gr.Slider(minimum=0, maximum=max(1, len(views) - 1), value=i, step=1,
                      label=f"Round index (0..{len(views) - 1}; round {view.round} shown)"))


def step(events, index, delta):
    n = len(viz.replay(events or []))
    return max(0, min(int(index or 0) + delta, max(0, n - 1)))


def play_tick(events, index):
    """One Play step; stops the timer at the last round."""
    n = len(viz.replay(events or []))
    nxt = int(index or 0) + 1
    if nxt >= n:
        return max(0, n - 1), gr.Timer(active=False)
    return nxt, gr.Timer(active=True)


def save(events, meta):
    if not events:
        raise gr.Error("no trace to save yet: generate in the Live tab first", print_exception=False)
    path = Path(tempfile.mkdtemp(prefix="dex-trace-")) / "dex-trace.json"
    save_trace(path, events, meta or {})
    return str(path)


def export_lattice(events):
    """The run's whole lattice as a GraphML file (networkx; opens in Gephi, yEd, networkx)."""
    if not events:
        raise gr.Error("no trace yet: generate in the Live tab or load a saved trace", print_exception=False)
    path = Path(tempfile.mkdtemp(prefix="dex-graph-")) / "dex-lattice.graphml"
    return str(viz.export_graph(events, path))


def load(file):
    if file is None:
        raise gr.Error("choose a trace file (JSON saved by DEX) first", print_exception=False)
    try:
        events, meta = load_trace(file if isinstance(file, str) else file.name)
    except (ValueError, OSError, json.JSONDecodeError) as err:
        raise gr.Error(str(err), print_exception=False) from None
    return events, meta, 0


def analyse(runtime: Runtime, prompt, chat, adapters, max_new_tokens):
    """EAD of each token of the greedy answer, and the speedups it predicts for K = 2..8."""
    try:
        config = ui_config(chat=chat, adapters=adapters, max_new_tokens=max_new_tokens)
        if not (prompt or "").strip():
            raise DexError("the prompt is empty; type something to analyse")
        ids = runtime.encode(prompt, config.chat)
        model, _ = runtime.model()
        *_, end = ar_stream(model, ids, options=config.generation())
        chosen = resolve_adapters(config.adapters, model)
        result = readiness(model, ids, end["tokens"], chosen, best=True)
    except DexError as err:
        raise _error(err) from None
    return viz.ead_figure(result), viz.speedup_figure(result), viz.readiness_table_html(result, chosen)
