"""Two runs side by side: where each came from and its settings (from the trace's start event), its
numbers (``panels.run_numbers``, as in the Live numbers panel), the cost per token the caller worked out
for it, whether the two outputs are identical, and both runs' matched-depth histograms in one figure
(grouped bars, one Okabe–Ito colour per run, never overlaid). A trace is untrusted input: every value
from one passes ``markup.esc``/``num`` (HTML) or ``plot_text`` (Plotly text)."""

from __future__ import annotations

from dataclasses import dataclass

import plotly.graph_objects as go

from dex_core.trace.events import StartEvent

from .markup import esc, join, num, plot_text
from .palette import RUN_COLORS
from .panels import run_numbers, stage_counts
from .replay import RoundView

_CELL = "border: 1px solid #d5d8dc; padding: 2px 8px; text-align: left; vertical-align: top;"
_DIFFERS = " background: #FFF4DC;"  # a setting or number that differs between the runs
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


def _sampling(start: StartEvent) -> str:
    s = start.sampling or {}
    if not s.get("temperature"):
        return "greedy"
    parts = [f"temperature {s['temperature']}"] + [
        f"{k.replace('_', '-')} {s[k]}" for k in ("top_k", "top_p") if s.get(k) is not None
    ]
    return ", ".join(parts + [f"seed {s.get('seed')}"])


def _adapters(start: StartEvent) -> str:
    """Where inducing adapters were used ("off": none, or a trace made before they were recorded)."""
    return f"on, at depths {', '.join(map(str, start.adapter_depths))}" if start.adapter_depths else "off"


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


def _draft(start: StartEvent) -> str:
    d = start.draft
    return (
        "off (or a trace made before them)"
        if not isinstance(d, dict)
        else f"chains of up to {d.get('length')} looked-up tokens, n-grams {d.get('min_ngram')}–{d.get('ngram')}"
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
    settings = f"K={len(start.depths)} ({depths}), {adapters}, {decs}, {chains}, {_sampling(start)}"
    return f"{side.origin} · {settings}, {len(side.view.tokens)} tokens{stopped}"


def _rows(side: RunSide) -> list[tuple[str, str]]:
    """(label, escaped value) of one run, in table order."""
    start, n = side.view.start, run_numbers(side.view)
    depths = start.depths
    proposal = start.proposal_vocab
    choice = f" ({start.depth_choice})" if isinstance(start.depth_choice, str) else ""
    return [
        ("from", esc(side.origin)),
        ("model", esc(_meta(side, "model"))),
        ("prompt", esc(_meta(side, "prompt"))),
        ("explorers K", esc(len(depths))),
        ("depths", join(depths) + esc(choice)),
        ("inducing adapters", esc(_adapters(start))),
        ("DECS", esc("on" if start.decs else "off")),
        ("sampling", esc(_sampling(start))),
        ("proposal heads (rows)", esc(proposal) if proposal is not None else "not recorded"),
        (
            "lattice pruning",
            esc(
                f"at most {start.prune} new branch{'es' * (start.prune > 1)} a round"
                if start.prune
                else "none"
            ),
        ),
        ("draft chains", esc(_draft(start))),
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
        f"<th style='{_CELL} background: {RUN_COLORS[i % 2]}; color: #fff;'>run {esc(side.name)}<div "
        f"style='font-weight: normal; font-size: 11px;'>{esc(run_label(side))}</div></th>"
        for i, side in enumerate(sides)
    )
    body = []
    for r, (label, _) in enumerate(columns[0]):
        values = [col[r][1] for col in columns]
        shade = _DIFFERS if len(set(values)) > 1 else ""
        body.append(
            f"<tr><th style='{_CELL} font-weight: normal; color: #566573;'>{esc(label)}</th>"
            + "".join(f"<td style='{_CELL}{shade}'>{v}</td>" for v in values)
            + "</tr>"
        )
    table = (
        f"<table class='dex-compare' style='border-collapse: collapse; margin: 4px 0;'><tr><th "
        f"style='{_CELL}'></th>{head}</tr>{''.join(body)}</table>"
    )
    same = _outputs_line(*sides) if len(sides) == 2 else ""
    note = (
        "<div style='font-size: 11px; color: #7f8c8d;'>Cost per token from the project's cost model, in "
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
                name=plot_text(f"run {side.name}: {run_label(side)}"[:90]),
                marker=dict(color=RUN_COLORS[i % 2]),
            )
        )
    fig = go.Figure(data=traces)
    fig.update_layout(
        title=dict(text="Where tokens matched: share of each run's tokens by depth"),
        barmode="group",
        height=380,
        plot_bgcolor="white",
        margin=dict(l=60, r=20, t=50, b=120),  # the axis title, then the legend's two rows under it
        legend=dict(orientation="h", x=0, y=-0.3, yanchor="top"),
        xaxis=dict(title=dict(text="depth (layer) of the explorer that matched"), type="category"),
        yaxis=dict(
            title=dict(text="share of tokens"), tickformat=".0%", rangemode="tozero", gridcolor="#eaecee"
        ),
    )
    return fig
