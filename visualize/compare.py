"""Two runs side by side: where each came from and its settings (from the trace's start event), its
numbers (``panels.run_numbers``, as in the Live numbers panel), the cost per token the caller worked out
for it, whether the two outputs are identical, and both runs' matched-depth histograms in one figure
(grouped bars, one Okabe–Ito colour per run, never overlaid). A trace is untrusted input: every value
from one passes ``markup.esc``/``num`` (HTML) or ``plot_text`` (Plotly text)."""

from __future__ import annotations

from dataclasses import dataclass

import plotly.graph_objects as go

from .fit import LINE_EM, text_px, wrap
from .markup import esc, num, plot_text
from .palette import INK, NOTE, RUN_COLORS, WHITE
from .panels import run_numbers, stage_counts
from .replay import RoundView
from .run_settings import sampling_text, settings

_CELL = "border: 1px solid #d5d8dc; padding: 2px 8px; text-align: left; vertical-align: top;"
_DIFFERS = f" background: #FFF4DC; color: {INK};"  # a setting or number that differs between the runs
PROMPT_CHARS = 80


@dataclass(frozen=True)
class RunSide:
    """One run of a comparison."""

    name: str  # "A" (pinned) or "B" (the run the Debugger shows)
    origin: str  # where it came from: a live run, a loaded file, a bundled trace
    view: RoundView  # its last round
    meta: dict  # the trace's metadata (model, prompt), untrusted
    ended: str | None = None  # the end event's stop reason; None for a run stopped before its end
    cost: dict | None = (
        None  # layer-equivalents per token: {"memory", "rows", "ar", "whole"} (the caller's cost model)
    )


def _meta(side: RunSide, key: str) -> str:
    value = side.meta.get(key)
    text = str(value) if isinstance(value, (str, int, float)) else "—"
    return text if len(text) <= PROMPT_CHARS else text[: PROMPT_CHARS - 1] + "…"


def _cost(side: RunSide) -> str:
    c = side.cost
    if not c:
        return "—"
    return (
        f"{num(c['memory'], '.1f')} on K devices ({num(c['memory'] / c['ar'], '.2f')} of AR's "
        f"{num(c['ar'], '.1f')}); {num(c['rows'], '.1f')} when every row counts"
        + ("" if c.get("whole") else " (decoder layers only: an older trace without the heads' weights)")
    )


def run_label(side: RunSide) -> str:
    """A run named by its source and settings, in one line of plain text: ``live run · K=4 (8, 15, 23, 30),
    adapters off, DECS on, greedy, 12 tokens`` (two live runs of a session read apart)."""
    start = side.view.start
    depths = ", ".join(str(d) for d in start.depths)
    adapters = "adapters " + ("on" if start.adapter_depths else "off")
    decs = "DECS " + ("on" if start.decs else "off")
    chains = "draft chains" if isinstance(start.draft, dict) else "no chains"
    stopped = "" if side.ended else ", stopped"
    chosen = f"K={len(start.depths)} ({depths}), {adapters}, {decs}, {chains}, {sampling_text(start)}"
    return f"{side.origin} · {chosen}, {len(side.view.tokens)} tokens{stopped}"


def _rows(side: RunSide) -> list[tuple[str, str]]:
    """(label, escaped value) of one run, in table order."""
    start, n = side.view.start, run_numbers(side.view)
    return [
        ("from", esc(side.origin)),
        ("model", esc(_meta(side, "model"))),
        ("prompt", esc(_meta(side, "prompt"))),
        *((label, esc(text)) for label, text in settings(start)),
        ("ended", esc(side.ended or "stopped before its end")),
        ("tokens", esc(n.tokens)),
        ("rounds", esc(n.rounds)),
        (
            "rounds/token",
            num(n.rounds_per_token, ".3f")
            + esc(
                f" ({n.tokens / n.rounds:.2f} tokens per round, "
                f"{sum(c.drafted for c in side.view.token_commits)} "
                "drafted)"
                if n.rounds
                else ""
            ),
        ),
        ("depth-side speedup K/(rounds/token)", num(n.depth_speedup, ".3f") + "×"),
        ("cost per token (layer-equivalents, all the work)", _cost(side)),
    ]


def _outputs_line(a: RunSide, b: RunSide) -> str:
    ta, tb = a.view.tokens, b.view.tokens
    same_prompt = a.view.start.prompt == b.view.start.prompt
    empty = [side.name for side in (a, b) if not side.view.tokens]
    if empty:
        return (
            f"<div id='dbg-compare-same' data-same='none'>– no outputs to compare: run {esc(' and '.join(empty))} "
            f"committed no tokens{' (stopped before its first commit)' if len(empty) == 1 else ''}</div>"
        )
    first = next((i for i, (x, y) in enumerate(zip(ta, tb)) if x != y), min(len(ta), len(tb)))
    if ta != tb and first == min(len(ta), len(tb)) and same_prompt:
        shorter = a if len(ta) < len(tb) else b
        return (
            f"<div id='dbg-compare-same' data-same='prefix'>= the first {esc(first)} tokens are identical; run "
            f"{esc(shorter.name)} ended there ({esc(len(ta))} vs {esc(len(tb))} tokens: "
            f"{esc('stopped' if not shorter.ended else shorter.ended)})</div>"
        )
    if ta == tb:
        return (
            f"<div id='dbg-compare-same' data-same='yes'>✓ identical outputs: both runs committed the same "
            f"{esc(len(ta))} tokens{'' if same_prompt else ' (from different prompts)'}</div>"
        )
    why = "the prompts differ" if not same_prompt else "same prompt: sampling, settings or the model differ"
    return (
        f"<div id='dbg-compare-same' data-same='no'>✗ outputs differ from token {esc(first)} on "
        f"({esc(len(ta))} vs {esc(len(tb))} tokens; {esc(why)})</div>"
    )


def compare_html(sides: list[RunSide]) -> str:
    """A table with one column per run (a value that differs between two runs is shaded), then whether
    the outputs are identical. With one side, its column alone."""
    columns = [_rows(side) for side in sides]
    head = "".join(
        f"<th style='{_CELL} background: {RUN_COLORS[i % 2]}; color: {WHITE};'>run {esc(side.name)}<div "
        f"style='font-weight: normal; font-size: 11px; color: {WHITE};'>{esc(run_label(side))}</div></th>"
        for i, side in enumerate(sides)
    )
    body = []
    for r, (label, _) in enumerate(columns[0]):
        values = [col[r][1] for col in columns]
        shade = _DIFFERS if len(set(values)) > 1 else ""
        body.append(
            f"<tr><th style='{_CELL} font-weight: normal; color: {NOTE};'>{esc(label)}</th>"
            + "".join(f"<td style='{_CELL}{shade}'>{v}</td>" for v in values)
            + "</tr>"
        )
    table = (
        f"<table class='dex-compare' style='border-collapse: collapse; margin: 4px 0;'><tr><th "
        f"style='{_CELL}'></th>{head}</tr>{''.join(body)}</table>"
    )
    same = _outputs_line(*sides) if len(sides) == 2 else ""
    note = (
        f"<div style='font-size: 11px; color: {NOTE};'>Cost per token from the project's cost model, in "
        "layer-equivalents (one decoder layer's weights): layers, LM heads (light ones at non-final depths) "
        "and adapters. On K devices a round costs its slowest explorer (a batch costs its weights once, as on "
        "a GPU); AR = every layer and the head once per token.</div>"
    )
    return (
        f"<div style='font-family: system-ui, sans-serif; font-size: 13px; overflow-x: auto;'>{table}{same}{note}"
        "</div>"
    )


def compare_figure(sides: list[RunSide]) -> go.Figure:
    """Matched-depth histograms of the runs in one figure: x = the depth of the explorer that matched a
    token, y = the share of the run's tokens matched there (the count on the bar), grouped per run; no
    bar at a depth the run did not explore."""
    depths = sorted({d for side in sides for d in side.view.start.depths})
    traces = []
    for i, side in enumerate(sides):
        run_depths = side.view.start.depths
        counts = dict(zip(run_depths, stage_counts(side.view.matched, len(run_depths))))
        total = max(1, len(side.view.matched))
        ys = [
            counts[d] / total if d in counts else None for d in depths
        ]  # no bar where the run has no explorer
        hover = [
            plot_text(f"run {side.name}: {counts.get(d, 0)} of {total} tokens matched at depth {d}")
            for d in depths
        ]
        traces.append(
            go.Bar(
                x=[str(d) for d in depths],
                y=ys,
                text=[str(counts[d]) if d in counts else "" for d in depths],
                textposition="outside",
                cliponaxis=False,
                hovertext=hover,
                hovertemplate="%{hovertext}<extra></extra>",
                name="<br>".join(plot_text(line) for line in _legend_lines(side)),
                marker=dict(color=RUN_COLORS[i % 2]),
            )
        )
    fig = go.Figure(data=traces)
    bottom = _legend_px([_legend_lines(side) for side in sides]) + AXIS_PX
    fig.update_layout(
        title=dict(text="Where tokens matched: share of each run's tokens by depth"),
        barmode="group",
        height=PLOT_PX + bottom,
        plot_bgcolor="white",
        margin=dict(l=60, r=20, t=50, b=bottom),  # the axis title, then the legend's rows under it
        legend=dict(
            orientation="h", x=0, y=0, yref="container", yanchor="bottom", font=dict(size=LEGEND_FONT_PX)
        ),
        xaxis=dict(title=dict(text="depth (layer) of the explorer that matched"), type="category"),
        yaxis=dict(
            title=dict(text="share of tokens"), tickformat=".0%", rangemode="tozero", gridcolor="#eaecee"
        ),
    )
    return fig


PLOT_PX = 270  # the title and the plot area
AXIS_PX = 55  # under the plot: the depths and the axis title
LEGEND_FONT_PX = 12
LEGEND_LINE_PX = 420  # a legend entry's lines at most: two entries side by side in a figure 1,000 px wide
NARROW_PX = (
    640  # the narrowest plot the figure is drawn at (Plotly's 700 px for a hidden tab, less the margins)
)


def _legend_lines(side: RunSide) -> list[str]:
    """A run's legend entry, its source and settings (``run_label``) in lines: never cut."""
    return wrap([f"run {side.name}: {run_label(side)}"], LEGEND_LINE_PX, LEGEND_FONT_PX)


def _legend_px(entries: list[list[str]]) -> int:
    """The height the legend under the plot takes at ``NARROW_PX``: its entries side by side when they fit, else
    one under another; each as many lines as its longest entry."""
    widths = [40 + max(text_px(line, LEGEND_FONT_PX) for line in lines) for lines in entries]
    rows = 1 if sum(widths) <= NARROW_PX else len(entries)
    lines = max(len(lines) for lines in entries)
    return round(rows * (lines * LINE_EM * LEGEND_FONT_PX + 10))
