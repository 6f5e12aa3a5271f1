"""``dex paper``'s standalone HTML report (plotly.js inlined: it opens from disk, offline): per figure of the
paper, its claim and this run's finding side by side, then the figure, titled with the paper's number.

``python -m visualize.paper paper.json paper.html`` (``dex paper`` runs it). Every value from the file is
escaped (``markup``); series are greys and dash patterns (``palette.SERIES``), as in every chart here.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .markup import esc, num, plot_text
from .palette import SERIES
from .report import _figure, standalone_html

_LAYOUT = dict(
    plot_bgcolor="white", legend=dict(orientation="h", y=-0.25), margin=dict(l=60, r=20, t=70, b=60)
)
_NAMES = {"self-spec": "self-speculation", "adadecode": "AdaDecode-style", "del": "DEL-style", "ar-hf": "AR"}


def _style(i: int) -> dict:
    colour, dash, symbol = SERIES[i % len(SERIES)]
    return {"colour": colour, "dash": dash, "symbol": symbol}


def _label(row: dict) -> str:
    return f"DEX K={row['explorers']}" if row["method"] == "dex" else _NAMES.get(row["method"], row["method"])


def fig3_figure(data: dict) -> go.Figure:
    """Fig. 3: per set, DEX at each K and the selectors in layer forwards and cost per token; the oracle."""
    fig = make_subplots(
        rows=2,
        cols=1,
        vertical_spacing=0.14,
        subplot_titles=(
            "critical-path layer forwards per token (layers only; lower is better)",
            "cost per token, layer-equivalents, memory-bound, heads and adapters included (lower is better)",
        ),
    )
    for i, (name, panel) in enumerate(data["fig3"].items()):
        rows, s = panel["rows"], _style(i)
        labels = [plot_text(_label(r)) for r in rows]
        for row, key in ((1, "layer_forwards_per_token"), (2, "cost_per_token")):
            bar = go.Bar(
                x=labels, y=[r[key] for r in rows], name=plot_text(name), legendgroup=plot_text(name)
            )
            fig.add_trace(bar.update(marker_color=s["colour"], showlegend=row == 1), row=row, col=1)
        oracle = go.Scatter(
            x=[labels[0], labels[-1]],
            y=[panel["oracle"]] * 2,
            mode="lines",
            name=plot_text(f"EAD oracle ({name})"),
            line=dict(color=s["colour"], dash="dash"),
        )
        fig.add_trace(oracle, row=1, col=1)
    fig.update_layout(
        title=plot_text("Fig. 3: exploration against selection"), barmode="group", height=760, **_LAYOUT
    )
    return fig.update_yaxes(rangemode="tozero", gridcolor="#eaecee")


def fig4_figure(data: dict) -> go.Figure:
    """Fig. 4: resolution (measured and predicted), single exit against full exploration (replayed), DECS."""
    fig = make_subplots(
        rows=1,
        cols=3,
        horizontal_spacing=0.08,
        subplot_titles=(  # in lines a third of the figure wide: on one line each covered the next
            "left: depth-side speedup by K<br>(measured solid, predicted dotted,<br>uniform replayed dash-dot)",
            "right-top: full exploration<br>against single exit (replayed)",
            "right-bottom: DECS on and off",
        ),
    )
    for i, (name, panel) in enumerate(data["fig4"].items()):
        rows, s = panel["rows"], _style(i)
        ks = [r["explorers"] for r in rows]
        for col, key, dash, label in (
            (1, "depth_speedup", "solid", "measured"),
            (1, "predicted_depth_speedup", "dot", "predicted"),
            (1, "uniform_replayed_depth_speedup", "dashdot", "uniform, plain lens (replayed)"),
            (2, "replayed_depth_speedup", "solid", "full exploration"),
            (2, "single_exit_replayed_depth_speedup", "dash", "single exit"),
        ):
            trace = go.Scatter(
                x=ks,
                y=[r[key] for r in rows],
                mode="lines+markers",
                name=plot_text(f"{name}: {label}"),
                line=dict(color=s["colour"], dash=dash),
                marker=dict(symbol=s["symbol"]),
            )
            fig.add_trace(trace, row=1, col=col)
    for j, decs in enumerate((True, False)):
        rows = [r for r in data["decs"] if r["decs"] == decs]
        bar = go.Bar(
            x=[plot_text(f"{r['mode']}, K={r['explorers']}") for r in rows],
            y=[r["depth_speedup"] for r in rows],
            name="DECS" if decs else "vanilla",
            marker=dict(color=_style(j)["colour"], pattern_shape="" if decs else "/"),
        )
        fig.add_trace(bar, row=1, col=3)
    fig.update_layout(title=plot_text("Fig. 4: resolution, single exit and DECS"), height=560, **_LAYOUT)
    fig.update_layout(margin=dict(t=120))  # the title, then the panels' titles of up to three lines
    for col in (1, 2):
        fig.update_xaxes(title_text="K explorers", dtick=1, col=col)
    return fig.update_yaxes(title_text="× (K / rounds per token)", rangemode="tozero", gridcolor="#eaecee")


def fig6_figure(data: dict) -> go.Figure:
    """Fig. 6: stable-EAD histograms per set, the plain lens against the adapters."""
    sets = list(data["fig6"])
    fig = make_subplots(
        rows=1, cols=len(sets), subplot_titles=[plot_text(s) for s in sets], shared_yaxes=True
    )
    layers = list(range(1, data["num_layers"] + 1))
    for col, name in enumerate(sets, start=1):
        for i, (lens, counts) in enumerate(data["fig6"][name].items()):
            bar = go.Bar(
                x=layers,
                y=counts,
                name=plot_text(lens),
                legendgroup=plot_text(lens),
                showlegend=col == 1,
                marker_color=_style(i)["colour"],
                opacity=0.75,
            )
            fig.add_trace(bar, row=1, col=col)
    fig.update_layout(
        title=plot_text("Fig. 6: stable EAD per data set"), barmode="overlay", height=420, **_LAYOUT
    )
    return fig.update_xaxes(title_text="layer").update_yaxes(gridcolor="#eaecee")


def _table(header, rows) -> str:
    cells = "".join("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in row) + "</tr>" for row in rows)
    head = "".join(f"<th>{esc(h)}</th>" for h in header)
    return (
        "<table class='paper-table' border='1' cellpadding='5' style='border-collapse: collapse;'>"
        f"<tr>{head}</tr>{cells}</table>"
    )


def fig5_html(data: dict) -> str:
    """Fig. 5's multi-device baseline on this machine: AR, tensor-parallel AR and DEX, measured."""
    rows = [
        (
            name,
            _label(r) if r["method"] != "ar-tp" else "tensor-parallel AR",
            r["devices"],
            f"{r['tokens_per_second']:.2f}",
            f"{r['speedup_vs_ar']:.3f}",
            f"{r['certified']}/{r['tokens']}",
        )
        for name, panel in data["fig5"].items()
        for r in panel
    ]
    return _table(("set", "method", "devices", "tokens/s (measured)", "× AR", "certified"), rows)


def table1_html(data: dict) -> str:
    """Table 1: the distributed schedule's profiled time per rank-round, by part."""
    table = data.get("table1")
    if not table:
        return "<p>Not run in this report (--quick starts no explorer processes).</p>"
    rows = [(r["part"], f"{r['ms_per_round']:.3f}", f"{r['share']:.2%}") for r in table["rows"]]
    return _table(("part", "ms per rank-round", "share of profiled time"), rows)


def appendix_b_html(data: dict) -> str:
    """Appendix B: per set and DEX row, the walltime model's speedup against the measured one."""
    rows = [
        (
            name,
            r["explorers"],
            f"{r['layer_work_per_token']:.2f}",
            f"{r['delta_x']:.2f}",
            f"{r['predicted_speedup']:.3f}",
            f"{r['measured_speedup']:.3f}",
            f"{r['error']:+.1%}",
        )
        for name, panel in data["appendix_b"].items()
        for r in panel["rows"]
    ]
    header = ("set", "K", "W_X (layer-times/token)", "δ_X (fitted)", "predicted", "measured", "error")
    return _table(header, rows)


SECTIONS = (  # (heading, a figure's or a table's builder, the finding keys it shows)
    ("Fig. 3 — exploration against selection", fig3_figure, ("fig3",)),
    (
        "Fig. 4 — resolution, single exit, DECS",
        fig4_figure,
        ("fig4_resolution", "fig4_single_exit", "fig4_decs"),
    ),
    ("Fig. 5 — the multi-device baseline: tensor parallelism", fig5_html, ("fig5",)),
    ("Fig. 6 — stable EAD per data set", fig6_figure, ("fig6",)),
    ("Table 1 — the distributed schedule's runtime profile", table1_html, ("table1",)),
    ("Appendix B — the calibrated walltime model", appendix_b_html, ("appendix_b",)),
)


def _claims(data: dict, keys) -> str:
    rows = "".join(
        f"<tr><td>{esc(data['claims'][k])}</td><td>{esc(data['findings'][k])}</td></tr>" for k in keys
    )
    return (
        "<table class='paper-claims' style='border-collapse: collapse; width: 100%; margin: 8px 0;' border='1' "
        "cellpadding='6'>"
        f"<tr><th>the paper claims</th><th>this run shows</th></tr>{rows}</table>"
    )


def _header(data: dict) -> str:
    m = data["matrix"]
    return (
        f"<h1>DEX, the paper's evaluation on {esc(data['model'])}</h1>"
        f"<p>Matrix: sets {esc(', '.join(m['sets']))}; {num(m['prompts'])} prompts each; "
        f"{num(m['max_new_tokens'])} new tokens; K = {esc(', '.join(map(str, m['explorers'])))}; selectors' "
        f"candidate exits {esc(', '.join(map(str, m['exits'])))} of {num(data['num_layers'])} layers; adapters "
        f"at {esc(data['adapter_depths'] or 'none')}.</p>"
        "<p><b>Measured</b>: tokens, rounds and layer forwards counted in this run, every row compared with HF "
        "greedy (sampled rows with ar_generate under the same seed). <b>Counted</b>: cost per token in "
        "layer-equivalents, memory-bound (the paper's GPU view), every head and adapter included. "
        "<b>Replayed</b>: the single-exit variant, by the EAD rule on this run's answers. <b>Projected</b>: "
        "K-device tokens/s from this machine's stage seconds (in paper.json), not a measured multi-device clock."
        "</p>"
    )


def paper_html(data: dict) -> str:
    """The whole report."""
    body = [_header(data)]
    for i, (heading, build, keys) in enumerate(SECTIONS):  # figures are paper-fig-0, -1, -3
        made = build(data)
        shown = made if isinstance(made, str) else _figure(made, f"paper-fig-{i}")
        body += [f"<h2>{esc(heading)}</h2>", _claims(data, keys), shown]
    return standalone_html(f"DEX paper report: {data['model']}", "".join(body))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Draw dex paper's JSON as a standalone HTML report.")
    parser.add_argument("json", help="paper.json written by dex paper")
    parser.add_argument("html", help="the HTML file to write")
    args = parser.parse_args(argv)
    Path(args.html).write_text(paper_html(json.loads(Path(args.json).read_text())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
