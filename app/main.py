"""The DEX visual debugger: ``gradio app/main.py`` (or ``python app/main.py --model … --port …``).

Four tabs: Live (stream a generation round by round: a status line, coloured text, the depth × position
lattice, the FSM panel, live numbers), Race (AR vs DEX side by side), Debugger (the whole-run timeline
and a step-through of a recorded, loaded or bundled trace, with exports) and Analysis (token
readiness: EAD and the speedups it predicts). Building ``demo`` is cheap; the model loads on first use.
Each page load shows the bundled example trace (``?trace=NAME`` another one from ``assets/traces``)
without a model. Model work runs one request at a time (queue); traces are per session.

Uploaded traces are untrusted: every launch of ``demo`` (``app.host.server.SessionBlocks``) sets
``max_file_size`` to ``TraceLimits.max_file_bytes`` (64 MB, in ``dex_core.trace.schema``), so Gradio
refuses larger files, and the Debugger validates every file it loads against the trace schema and its
limits. What a visitor holds is bounded too: memory (``app.host.sessions``: a closed tab frees its session,
one budget for all traces) and disk (``app.host.files``: uploads, downloads only while their session lasts).
"""

from __future__ import annotations

import os
import sys

if __name__ == "__main__":  # gradio app/main.py too: its CLI runs this file as python -u app/main.py
    from app.host.gradio_cli import serve_plain

    serve_plain()  # no reload watcher, and gone with the gradio process (app/host/gradio_cli.py)

if __name__ == "__main__" and sys.platform.startswith("linux") and "PYTHONMALLOC" not in os.environ:
    # A closed session's trace must give its memory back. CPython's small-object allocator keeps a 1 MiB arena
    # while one object in it lives, so four closed sessions of a 17 MB trace left 50-150 MB; with the system
    # allocator and the sweep's malloc_trim, 0-2 MB (README, Memory). glibc gives each worker thread that
    # allocates an arena of its own (up to 8 a core), whose freed pages stay scattered: with those the same
    # sessions left 42-47 MB; two arenas, -1 MB. Both are read only at start-up.
    env = {"MALLOC_ARENA_MAX": "2", **os.environ, "PYTHONMALLOC": "malloc"}
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)

import argparse
import functools
from dataclasses import asdict
from pathlib import Path
from urllib.parse import quote

import gradio as gr

from app.host.server import SessionBlocks
from app.host.settings import AppSettings
from app.host.state import Runtime
from app.ui import controls as ctl
from app.ui import debugger as dbg
from app.ui import debugger_compare as cmp
from app.ui import live, page, race, tools
from app.ui.analysis import analyse
from app.ui.browser import DEPTH_COLOURS_JS, FIT_PLOTS_JS, ROUND_ENTER_JS, TIMELINE_JS
from app.ui.handlers import HUSH, QUIET, StopRequests, bind, busy, idle
from app.ui.inputs import LIVE, PRUNE_CHOICES, RACE, Inputs
from app.ui.style import PAGE_CSS
from dex_core import DecoderOptions, DexConfig
from dex_core.device import exact_float32_matmuls
from dex_core.flags import add_flags, from_args
from dex_core.runtime.settings import AUTO_ROWS
from dex_core.trace.schema import TRACE_LIMITS

EXAMPLES = [  # prompts the 135M default model answers correctly (checked greedy, 96 tokens)
    "Give three tips for staying focused while studying.",
    "Write a Python function that returns the sum of a list of numbers.",
    "What is the capital of France? Answer in one sentence.",
]


UPLOAD_LIMIT = TRACE_LIMITS.max_file_bytes  # bytes; Gradio refuses larger uploads before they reach a handler
# dex paper's report for the default model (docs/results/), served as a static file and linked from Analysis
PAPER_REPORT = Path(__file__).resolve().parents[1] / "docs" / "results" / "paper-default" / "paper.html"
PLAY_PERIOD = 0.6  # seconds between two rounds while the Debugger plays
RACE_HINT = (
    "Press Race to run this prompt through plain autoregressive decoding and through DEX side by side: "
    "both texts, their clocks and whether the outputs are identical appear here."
)
ANALYSIS_HINT = (
    "Press Analyse to see, for each token of the model's greedy answer, the earliest layer that already "
    "predicts it (EAD), the speedup that predicts for K = 2..8, and the token's probability at every layer."
)
VISITORS = (
    "[dex-app] a visitor is a client address: the peer's own, or the one X-Forwarded-For names when the peer is "
    "trusted (FORWARDED_ALLOW_IPS={}); behind another proxy every visitor shares its address (docs/HOSTING.md)"
)
PRUNE_INFO = f"rows per stage a round; auto: {AUTO_ROWS['cpu']} on CPU, {AUTO_ROWS['accelerator']} on GPUs"


def _hint(elem_id: str, text: str) -> str:
    """What an empty tab does, in one line, until its first result replaces it."""
    return f"<p id='{elem_id}' style='color: #5a5a5a; margin: 4px 0;'>{text}</p>"


def _debugger_tab(runtime: Runtime, trace: gr.State, meta: gr.State, origin: gr.State):
    """The Debugger's layout and events; returns (the 5 frame outputs, the timeline, the status line, the
    comparison's redraw event)."""
    status = gr.HTML(elem_id="dbg-status")
    with gr.Row(equal_height=True):
        prev_b = gr.Button("◀ Prev", elem_id="dbg-prev", scale=0, min_width=90)
        next_b = gr.Button("Next ▶", elem_id="dbg-next", scale=0, min_width=90)
        play_b = gr.Button("Play", elem_id="dbg-play", scale=0, min_width=80)
        pause_b = gr.Button("Pause", elem_id="dbg-pause", scale=0, min_width=80)
        slider = gr.Slider(0, 1, value=0, step=1, label="Round", elem_id="dbg-round", scale=1)
    timer = gr.Timer(PLAY_PERIOD, active=False)
    playing = gr.State(False)  # what Pause writes and every tick reads
    timeline = gr.Plot(
        label="Whole run: every node (click one to open its round)", elem_id="dbg-timeline", show_label=False
    )  # the figure's title says it; a label would take 100 px over the plot
    goto = gr.Textbox(visible="hidden", elem_id="dbg-goto")
    goto_b = gr.Button("Open round", visible="hidden", elem_id="dbg-goto-go")
    with gr.Row():
        lattice = gr.Plot(
            label="Lattice at this round", elem_id="dbg-lattice", scale=1, show_label=False
        )  # its title names the round; Gradio's label sat on it
        with gr.Column(scale=1):
            fsm = gr.HTML(elem_id="dbg-fsm")
            table = gr.HTML(elem_id="dbg-table")
    text = gr.HTML(elem_id="dbg-text")
    frame = [lattice, table, fsm, text, slider]
    show = bind(dbg.show, runtime)
    raw = {
        **HUSH,
        "preprocess": False,
    }  # round values arrive as sent: the handlers read them (debugger._number)
    said = (dbg.stepped, [trace, meta, origin, slider, status], status)  # the status line says the step
    slider.release(show, [trace, slider], frame, **raw).then(*said, **raw)
    for button, delta in ((prev_b, -1), (next_b, +1)):
        step = button.click(functools.partial(dbg.step, delta=delta), [trace, slider], slider, **raw)
        step.then(show, [trace, slider], frame, **raw).then(*said, **raw)
    goto_b.click(show, [trace, goto], frame, **raw).then(*said, **raw)
    said_too = [meta, origin, status]  # Play and its ticks say the round in the update that shows it
    play_b.click(dbg.play, [trace, slider, *said_too], [playing, timer, *frame, status], **raw)
    pause_b.click(dbg.pause, None, [playing, timer], **HUSH)
    timer.tick(dbg.play_tick, [trace, slider, playing, *said_too], [*frame, timer, status], **raw)
    compare = _debugger_files(runtime, (trace, meta, origin), frame, timeline, status)
    return frame, timeline, status, compare


def _debugger_files(runtime: Runtime, states: tuple, frame: list, timeline, status):
    """The Debugger's files: load a trace, save it, export it (GraphML, HTML), pin it for the comparison; returns
    the comparison's redraw event."""
    trace, meta, origin = states
    slider = frame[-1]
    with gr.Row():
        loaded = gr.File(
            label=f"Load a trace (JSON, up to {UPLOAD_LIMIT // 2**20} MB)",
            file_types=[".json"],
            elem_id="dbg-load",
            height=120,
            scale=2,
        )
        with gr.Column(scale=1):
            save_b = gr.Button("Save trace (JSON)", elem_id="dbg-save", size="sm")
            graph_b = gr.Button("Export lattice graph (GraphML)", elem_id="dbg-graph", size="sm")
            html_b = gr.Button("Export run as HTML (works offline)", elem_id="dbg-html", size="sm")
            pin_b = gr.Button("Pin this run for comparison (run A)", elem_id="dbg-pin", size="sm")
        download = gr.File(
            interactive=False, elem_id="dbg-download", visible=False
        )  # what DOWNLOAD_JS fetches
    compare = cmp.section(runtime, trace, meta, origin, pin_b)
    for button, export, inputs in (
        (save_b, dbg.save, [trace, meta]),
        (graph_b, dbg.export_lattice, [trace]),
        (html_b, dbg.export_report, [trace, meta]),
    ):  # one click: the handler writes the file, then the page downloads it
        made = button.click(bind(export, runtime), inputs, download, **HUSH)
        made.success(None, download, None, js=dbg.DOWNLOAD_JS, **QUIET)
    # a rejected file changes only the status line: the session keeps its trace and the panels stay; the box is
    # emptied either way, ready for another file; the file as uploaded (Gradio's preprocess leaves an empty temp
    # file per upload)
    loaded.upload(
        bind(dbg.load, runtime),
        loaded,
        [trace, meta, origin, slider, status, loaded],
        preprocess=False,
        **HUSH,
    ).then(dbg.after_load, [trace, slider, status], [*frame, timeline], show_progress_on=status, **HUSH).then(
        *compare, **HUSH
    )
    return compare


def _run_on(button: gr.Button, fn, inputs, outputs, **event):
    """``button`` runs ``fn`` (a model request), greyed out from its click until the request ends, however
    it ends; returns the request's event."""
    run = button.click(busy, None, button, queue=False, **HUSH).then(fn, inputs, outputs, **event)
    run.then(idle, None, button, queue=False, **HUSH)
    return run


def _live_tab(runtime: Runtime, states: list):
    """The Live tab: prompt, controls, the streamed panels; returns (its run event, the prompt box, the four
    panels, the status line). ``states``: the session's trace, meta and origin, which a run fills."""
    with gr.Row():
        prompt = gr.Textbox(
            label="Prompt", value=page.opening_prompt(EXAMPLES[0]), lines=2, scale=4, elem_id="live-prompt"
        )
        with gr.Column(scale=1):
            generate = gr.Button("Generate", variant="primary", elem_id="live-generate")
            stop = gr.Button("Stop", elem_id="live-stop")
    with gr.Accordion("Exploration and sampling", open=False):
        with gr.Row():
            chat = gr.Checkbox(label="Chat template", value=DexConfig.chat)
            explorers = ctl.explorers(runtime, "live-k")
            depths = gr.Textbox(label="Depths (optional, e.g. 8,15,23,30)", value="", **ctl.launched(runtime))
            adapters = ctl.adapters_box(runtime)
            with gr.Column(min_width=160):  # stacked: one more control in the row, no wider
                decs = gr.Checkbox(label="DECS", value=DexConfig.decs, **ctl.launched(runtime))
                draft = ctl.draft_box(runtime, "live-draft")
            max_new = ctl.max_new("Max new tokens", "live-new")
            prune = gr.Dropdown(
                list(PRUNE_CHOICES),
                value=DecoderOptions.prune,
                label="Lattice pruning",
                elem_id="live-prune",
                **{"info": PRUNE_INFO, **ctl.launched(runtime)},
            )
        sampling = ctl.sampling_controls()
    gr.Examples(EXAMPLES, inputs=prompt)
    status = gr.HTML(elem_id="live-status")
    text = gr.HTML(label="Output", elem_id="live-text")
    with gr.Row():
        lattice = gr.Plot(
            label="Depth × position lattice", elem_id="live-lattice", scale=3, show_label=False
        )  # its title names the round; Gradio's label sat on it
        with gr.Column(scale=2):
            fsm = gr.HTML(elem_id="live-fsm")
            numbers = gr.HTML(elem_id="live-stats")
    panels = [text, lattice, fsm, numbers]
    stops = StopRequests()
    run = _run_on(
        generate,
        bind(live.live_frames, runtime, stops, record=Inputs, names=LIVE),  # the inputs, in LIVE's order
        [prompt, chat, explorers, depths, adapters, decs, *sampling, max_new, prune, draft],
        [*panels, *states, status],
        api_name="generate",
        concurrency_id="live",  # Live runs share rounds (Runtime.sharing: a Race or an Analysis waits for them)
        concurrency_limit=runtime.live_batch,
        show_progress="hidden",
        preprocess=False,
    )  # the handlers check their inputs (app.ui.live)
    stop.click(bind(live.stop, stops), status, status, **QUIET)
    return run, prompt, panels, status


def _race_tab(runtime: Runtime) -> None:
    with gr.Row():
        prompt = gr.Textbox(label="Prompt", value=EXAMPLES[1], lines=2, scale=4, elem_id="race-prompt")
        with gr.Column(scale=1):
            explorers = ctl.explorers(runtime)
            max_new = ctl.max_new("Max new tokens", "race-new")
            go = gr.Button("Race", variant="primary", elem_id="race-go")
            stop = gr.Button("Stop", elem_id="race-stop")
    with gr.Row():
        chat = gr.Checkbox(label="Chat template", value=DexConfig.chat)
        adapters = ctl.adapters_box(runtime)
        draft = ctl.draft_box(runtime, "race-draft")
    summary = gr.HTML(_hint("race-empty", RACE_HINT), elem_id="race-summary")
    with gr.Row():
        ar_text = gr.Textbox(label="Autoregressive", lines=8, interactive=False)
        dex_text = gr.Textbox(label="DEX", lines=8, interactive=False)
    plot = gr.Plot(label="Tokens vs time", elem_id="race-plot")
    stops = StopRequests()
    _run_on(
        go,
        bind(race.race_frames, runtime, stops, record=Inputs, names=RACE),  # the inputs, in RACE's order
        [prompt, chat, explorers, adapters, max_new, draft],
        [ar_text, dex_text, plot, summary],
        api_name="race",
        concurrency_id="model",
        concurrency_limit=1,
        preprocess=False,
    )
    stop.click(bind(race.stop, stops), None, None, **QUIET)


def _analysis_tab(runtime: Runtime) -> None:
    with gr.Row():
        prompt = gr.Textbox(label="Prompt", value=EXAMPLES[0], lines=2, scale=4)
        with gr.Column(scale=1):
            max_new = ctl.max_new("Tokens to analyse", "an-new")
            go = gr.Button("Analyse", variant="primary", elem_id="an-go")
    with gr.Row():
        chat = gr.Checkbox(label="Chat template", value=DexConfig.chat)
        adapters = ctl.adapters_box(runtime)
        metric = gr.Radio(
            ["probability", "rank"], value="probability", label="Depth view colours", elem_id="an-metric"
        )
    with gr.Row():
        ead_plot = gr.Plot(label="Earliest available depth", elem_id="an-ead")
        speed_plot = gr.Plot(label="Predicted depth-side speedup vs K", elem_id="an-speedup")
    table = gr.HTML(_hint("an-empty", ANALYSIS_HINT), elem_id="an-table")
    if PAPER_REPORT.is_file():
        gr.set_static_paths([PAPER_REPORT.parent])
        gr.HTML(
            f"<a id='an-paper' href='gradio_api/file={quote(str(PAPER_REPORT))}' target='_blank' "
            "rel='noopener'>Paper "
            "figures</a>: <code>dex paper</code>'s report on the default model (the paper's Fig. 3–6, Table 1 "
            "and Appendix B, measured on a 2-core CPU; opens in a new tab)"
        )
    depth_plot = gr.Plot(label="Depth view (logit lens): the final token at every layer", elem_id="an-depth")
    _run_on(
        go,
        bind(analyse, runtime),
        [prompt, chat, adapters, max_new, metric],
        [ead_plot, speed_plot, table, depth_plot],
        api_name="analyse",
        concurrency_id="model",
        concurrency_limit=1,
        preprocess=False,
    )
    metric.change(None, metric, None, js=DEPTH_COLOURS_JS, **QUIET)  # in the page, no model call


def _host_bound(seconds: int) -> str:
    """What the header says of the host's bound on a request's model time (nothing where there is none)."""
    if not seconds:
        return ""
    return f" This host ends a request after {seconds} s of model time, with what it made (`DEX_REQUEST_SECONDS`)."


def build_demo(settings: AppSettings | None = None, runtime: Runtime | None = None) -> gr.Blocks:
    runtime = runtime or Runtime(settings)
    ttl = runtime.settings.session_ttl
    with SessionBlocks(
        runtime, PAGE_CSS, title="DEX — Depth Exploration Decoding", delete_cache=(ttl, ttl)
    ) as demo:
        trace = gr.State(
            [], time_to_live=ttl
        )  # ttl s after it was set; a closed tab frees it at once (app.host.sessions)
        meta = gr.State({}, time_to_live=ttl)
        origin = gr.State("", time_to_live=ttl)  # where the trace came from: live, loaded, bundled
        live_source = gr.State(
            live.LIVE
        )  # outside gr.Tabs: a State between two tabs doubled the last tab's label
        gr.Markdown(
            "# DEX — Depth Exploration Decoding\nLossless, depth-parallel decoding: explorers at several "
            "depths propose, the final layer commits AR's token (exactly in float32; in bfloat16 AR's or a "
            "near-tie, marked ≈, checked by `dex verify`). **The answers are the model's own**: a weak answer "
            "is the model's, not DEX's. "
            f"Model: `{runtime.settings.model}`, backend: `{runtime.settings.backend}`."
            + _host_bound(runtime.settings.request_seconds)
        )
        with gr.Tabs() as tabs:
            with gr.Tab("Live", id="live"):
                run, prompt, live_panels, live_status = _live_tab(runtime, [trace, meta, origin])
            with gr.Tab("Race", id="race"):
                _race_tab(runtime)
            with gr.Tab("Debugger", id="debugger"):
                dbg_frame, dbg_timeline, dbg_status, compare = _debugger_tab(runtime, trace, meta, origin)
            after_run = (
                dbg.refresh,
                [trace, meta, live_status, live_source],
                [*dbg_frame, dbg_timeline, dbg_status],
            )
            run.then(*after_run, **HUSH).then(
                *compare, **HUSH
            )  # the debugger at the last round (stopped runs too)
            with gr.Tab("Analysis", id="analysis"):
                _analysis_tab(runtime)
        demo.load(
            page.page_load,
            None,
            [trace, meta, origin, *live_panels, live_status, *dbg_frame, dbg_timeline, dbg_status, tabs],
            show_progress="hidden",
            **QUIET,
        )
        demo.load(page.example_prompt, None, prompt, **HUSH)  # the prompt of the run the Live panels show
        demo.load(None, js=TIMELINE_JS, **QUIET)
        demo.load(None, js=FIT_PLOTS_JS, **QUIET)
        demo.load(None, js=ROUND_ENTER_JS, **QUIET)
        if runtime.settings.mcp_server:  # Generate, Race and Analyse for agents (app.ui.tools)
            tools.register(demo, runtime)
    return demo.queue(max_size=runtime.settings.queue_size, default_concurrency_limit=4)


exact_float32_matmuls()  # once per process (gradio app/main.py too): float32 stays float32 (dex_core/device.py)
demo = build_demo()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description="DEX visual debugger (Gradio app)")
    add_flags(parser, AppSettings)
    parser.set_defaults(**asdict(AppSettings.from_env()))
    settings = from_args(AppSettings, parser.parse_args(argv))
    runtime = Runtime(settings)
    if (
        settings.backend == "torchrun"
    ):  # every rank joins; ranks other than 0 serve rank 0's requests, then exit
        runtime.join_torchrun()
    app = build_demo(runtime=runtime)
    app.runtime.files.exit_on_sigterm()  # SIGTERM removes the app's folder too
    print(VISITORS.format(os.environ.get("FORWARDED_ALLOW_IPS") or "127.0.0.1"), flush=True)
    app.launch(
        server_name=settings.host, server_port=settings.port, show_error=True, max_file_size=UPLOAD_LIMIT
    )


if __name__ == "__main__":
    main()
