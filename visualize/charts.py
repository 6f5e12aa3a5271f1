"""Summary charts: the token race between decoders, the earliest-available-depth (EAD) histogram, the
predicted depth-side speedup against the number of explorers, and the ``dex bench`` comparison.
Plotly renders a subset of HTML in names, labels and hover texts: values from results and reports
pass ``markup.plot_text``."""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .fit import LINE_EM, corner_title, text_px, wrap
from .markup import plot_text
from .palette import INK, OKABE_ITO, SERIES, stage_tick

_LAYOUT = dict(
    plot_bgcolor="white", margin=dict(l=60, r=20, t=50, b=50), legend=dict(orientation="h", y=-0.2)
)


def race_figure(series: list[dict]) -> go.Figure:
    """Tokens against seconds, one step line per series ``{"name", "times", "dash"?}``, where
    ``times[i]`` is when token i became available; measured series solid, a projected one (``dash``) dashed,
    and the title says which is which."""
    traces = [
        go.Scatter(
            x=[0.0] + list(s["times"]),
            y=list(range(len(s["times"]) + 1)),
            mode="lines",
            name=plot_text(s["name"]),
            line=dict(
                shape="hv",
                width=2,
                dash="dash" if s.get("dash") else "solid",
                color=OKABE_ITO[(4, 0, 2, 6)[i % 4]],
            ),
        )
        for i, s in enumerate(series)
    ]
    fig = go.Figure(data=traces)
    projected = any(s.get("dash") for s in series)
    fig.update_layout(
        title=dict(text="Tokens over time" + (": solid measured, dashed projected" if projected else "")),
        uirevision="race",
        xaxis=dict(title=dict(text="seconds"), rangemode="tozero", gridcolor="#eaecee"),
        yaxis=dict(title=dict(text="tokens"), rangemode="tozero", gridcolor="#eaecee"),
        **_LAYOUT,
    )
    return fig


def _counts(values: list[int], num_layers: int) -> list[int]:
    counts = [0] * num_layers
    for v in values:
        counts[v - 1] += 1
    return counts


def _bar(i: int) -> dict:
    """Bars of the i-th non-stage series (``palette.SERIES``: greys, outlined; colours name stages)."""
    return dict(color=SERIES[i % len(SERIES)][0], line=dict(color=INK, width=1))


def _line(i: int) -> dict:
    color, dash, _ = SERIES[i % len(SERIES)]
    return dict(color=color, dash=dash)


def _symbol(i: int) -> dict:
    return dict(symbol=SERIES[i % len(SERIES)][2], size=8)


def ead_figure(analysis: dict) -> go.Figure:
    """Histogram over layers 1..L of the stable EAD (bars) with the plain EAD overlaid."""
    L = analysis["num_layers"]
    layers = list(range(1, L + 1))
    fig = go.Figure(
        data=[
            go.Bar(x=layers, y=_counts(analysis["ead_stable"], L), name="stable EAD", marker=_bar(0)),
            go.Bar(x=layers, y=_counts(analysis["ead"], L), name="EAD", marker=_bar(2)),
        ]
    )
    fig.update_layout(
        title=dict(text="Earliest available depth per token"),
        barmode="group",
        xaxis=dict(title=dict(text="layer"), range=[0.5, L + 0.5]),
        yaxis=dict(title=dict(text="tokens"), gridcolor="#eaecee"),
        **_LAYOUT,
    )
    return fig


def speedup_figure(analysis: dict) -> go.Figure:
    """Predicted depth-side speedup against K, with the oracle S_EAD as a dashed horizontal line."""
    predicted = sorted(analysis["predicted"], key=lambda p: p["explorers"])
    ks = [p["explorers"] for p in predicted]
    traces = [
        go.Scatter(
            x=ks,
            y=[p["speedup"] for p in predicted],
            mode="markers+lines",
            name="S_X (stable EAD)",
            text=[plot_text(f"depths {p['depths']}") for p in predicted],
            hovertemplate="K=%{x}: %{y:.2f}× (%{text})<extra></extra>",
            line=_line(0),
            marker=_symbol(0),
        ),
        go.Scatter(
            x=ks,
            y=[p["uniform"]["depth_speedup"] for p in predicted],
            mode="markers+lines",
            name="DEX K / rounds per token" + (" (DECS)" if predicted and predicted[0]["decs"] else ""),
            hovertemplate="K=%{x}: %{y:.2f}×<extra></extra>",
            line=_line(1),
            marker=_symbol(1),
        ),
    ]
    if predicted and "best" in predicted[0]:
        traces.append(
            go.Scatter(
                x=ks,
                y=[p["best"]["pipeline_speedup"] for p in predicted],
                mode="markers+lines",
                name="best set: L / (rounds × longest stage)",
                text=[plot_text(f"depths {p['best']['depths']}") for p in predicted],
                hovertemplate="K=%{x}: %{y:.2f}× (%{text})<extra></extra>",
                line=_line(2),
                marker=_symbol(2),
            )
        )
    fig = go.Figure(
        data=traces
        + [
            go.Scatter(
                x=[min(ks, default=1), max(ks, default=1)],
                y=[analysis["oracle"]] * 2,
                mode="lines",
                name="oracle S_EAD",
                line=_line(3),
            )
        ]
    )
    fig.update_layout(
        title=dict(text="Predicted depth-side speedup"),
        xaxis=dict(title=dict(text="explorers K"), tickvals=ks, gridcolor="#eaecee"),
        yaxis=dict(title=dict(text="speedup ×"), rangemode="tozero", gridcolor="#eaecee"),
        **_LAYOUT,
    )
    return fig


def bench_figure(report: dict) -> go.Figure:
    """``dex bench``: per method, the critical-path speedup over AR (L / layer forwards per token) and
    the measured tokens/s ratio over HF generate, one bar group per prompt set; the EAD oracle dashed."""

    fig = make_subplots(
        rows=2,
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.08,
        subplot_titles=(
            "critical path: L / layer forwards per token (hardware-neutral)",
            "measured tokens/s over HF generate (this machine)",
        ),
    )
    for i, (set_name, oracle) in enumerate(report["oracle"].items()):
        rows = [r for r in report["results"] if r["set"] == set_name]
        labels = [plot_text(_bench_label(r)) for r in rows]
        set_name = plot_text(set_name)
        fig.add_trace(
            go.Bar(
                x=labels,
                y=[r["layer_speedup"] for r in rows],
                name=set_name,
                marker=_bar(i),
                legendgroup=set_name,
            ),
            row=1,
            col=1,
        )
        fig.add_trace(
            go.Bar(
                x=labels,
                y=[r["speedup_vs_ar"] for r in rows],
                name=set_name,
                marker=_bar(i),
                legendgroup=set_name,
                showlegend=False,
            ),
            row=2,
            col=1,
        )
        fig.add_trace(
            go.Scatter(
                x=[labels[0], labels[-1]],
                y=[oracle["speedup"]] * 2,
                mode="lines",
                name=f"EAD oracle ({set_name})",
                line=_line(i),
            ),
            row=1,
            col=1,
        )
    fig.update_layout(
        title=dict(text=plot_text(f"dex bench: {report['model']}")), barmode="group", height=720, **_LAYOUT
    )
    fig.update_yaxes(title_text="× AR", rangemode="tozero", gridcolor="#eaecee")
    return fig


def _bench_label(row: dict) -> str:
    if row["method"].startswith("dex"):
        extra = (
            ""
            if row["adapters"] and row["decs"]
            else f" ({'adapters' if row['adapters'] else 'no adapters'}, DECS {'on' if row['decs'] else 'off'})"
        )
        return f"{row['method']} K={row['explorers']}{extra}"
    if "exit" in row:
        return f"{row['method']} E={row['exit']} n={row['draft']}"
    if row["method"] == "ar-pipeline":
        return f"ar-pipeline K={row['explorers']}"
    return row["method"]


def depth_colouring(view: dict, metric: str) -> dict:
    """The depth view's heatmap coloured by ``metric`` ("prob" or "rank") as Plotly restyle values for
    its trace: z (layer, token), the colour range and direction, and the colour bar's title."""
    L = view["num_layers"]
    z = [[row[layer] for row in view[metric]] for layer in range(L)]  # (layer, token)
    zmax = 1 if metric == "prob" else min(50, max(map(max, z), default=1))
    return {
        "z": [z],
        "zmin": [0],
        "zmax": [zmax],
        "reversescale": [metric == "rank"],  # Viridis, 0 = top rank bright
        "colorbar.title.text": ["p(token)" if metric == "prob" else "rank"],
    }


DEPTH_LABELS = 32  # token labels the depth view's axis shows at most (upright, about 20 px apart at 700 px)
DEPTH_TITLE_PX = 14
DEPTH_FIT_PX = 600  # the title's lines at most: Plotly draws a figure of a hidden tab 700 px wide
DEPTH_TITLE_TOP = 44  # px above the title: under the label Gradio lays over the figure's top left
STAGE_LABEL_PX = 11  # "E2 · d=27 ends", right of the plot


def depth_figure(view: dict, texts: dict, depths=(), metric: str = "prob") -> go.Figure:
    """The logit lens as a heatmap (``dex_core.model.lens.depth_view``): token (x) by layer (y), coloured by the
    committed token's probability (``metric="prob"``) or rank (``"rank"``, 0 = top) at that layer; the
    explored ``depths`` (where stages 0, 1, … end) as dashed lines labelled with their stage, each token's
    earliest stable layer (EAD) as a white dot named in the legend; hovering a cell shows that layer's top
    candidates with their text. ``texts``: token id -> text. ``layout.meta["colourings"]`` holds both
    colourings (``depth_colouring``), so a page switches between them without asking the server."""
    L, tokens = view["num_layers"], view["tokens"]
    colourings = {m: depth_colouring(view, m) for m in ("prob", "rank")}
    shown = {key: value[0] for key, value in colourings[metric].items()}
    stable = [
        next((layer + 1 for layer in range(L) if all(r == 0 for r in view["rank"][i][layer:])), L)
        for i in range(len(tokens))
    ]  # a sampled token need not be the last layer's top
    heat = go.Heatmap(
        z=shown["z"],
        x=list(range(len(tokens))),
        y=list(range(1, L + 1)),
        text=_depth_hovers(view, texts),
        hoverinfo="text",
        colorscale="Viridis",
        reversescale=shown["reversescale"],
        zmin=0,
        zmax=shown["zmax"],
        colorbar=dict(
            title=dict(text=shown["colorbar.title.text"]), x=1, xref="container", xanchor="right", xpad=12
        ),  # at the figure's right edge: the stage labels sit between it and the plot
    )
    dots = go.Scatter(
        x=list(range(len(tokens))),
        y=stable,
        mode="markers",
        name="white dot: the token's stable EAD, the layer from which it stays the top candidate",
        marker=dict(color="white", size=7, line=dict(color="black", width=1)),
        hovertemplate="token %{x}: top candidate from layer %{y} on<extra></extra>",
    )
    fig = go.Figure(data=[heat, dots])
    for k, d in enumerate(depths):
        fig.add_hline(y=d + 0.5, line=dict(color="white", dash="dash", width=1.5))
        fig.add_annotation(  # right of the plot, on its line: over the heatmap it covered the last tokens
            x=1,
            xref="paper",
            xanchor="left",
            xshift=4,
            y=d + 0.5,
            yanchor="middle",
            showarrow=False,
            text=stage_tick(k, depths) + " ends",
            font=dict(size=STAGE_LABEL_PX, color=INK),
        )
    return _depth_layout(fig, view, texts, colourings, depths)


def _depth_layout(fig: go.Figure, view: dict, texts: dict, colourings: dict, depths) -> go.Figure:
    adapters, tokens = view["adapter_depths"], view["tokens"]
    lens = "logit lens" + (", adapters at " + ", ".join(map(str, adapters)) if adapters else "")
    every = -(-len(tokens) // DEPTH_LABELS)  # a label every ``every`` tokens: at most DEPTH_LABELS, apart
    shown = list(range(0, len(tokens), every))
    labels = [plot_text(f"{i}: {texts.get(tokens[i], str(tokens[i]))!r}") for i in shown]
    title = [  # what it shows, then its key: each on lines of its own
        line
        for part in (
            f"Depth view: the final token at every layer ({lens})",
            "dashed lines: the explored depths",
        )
        for line in wrap([part], DEPTH_FIT_PX, DEPTH_TITLE_PX)
    ]
    labels_px = max(
        (text_px(f"■ E{k} · d={d} ends", STAGE_LABEL_PX) for k, d in enumerate(depths)), default=0
    )
    top = round(DEPTH_TITLE_TOP + LINE_EM * DEPTH_TITLE_PX * len(title) + 28)  # the title's lines, the legend
    fig.update_layout(
        title=corner_title([plot_text(line) for line in title], DEPTH_TITLE_PX, DEPTH_TITLE_TOP),
        xaxis=dict(
            title=dict(
                text="generated token"
                + (f" (a label every {every} tokens; hover shows each)" if every > 1 else "")
            ),
            tickvals=shown,
            ticktext=labels,
            tickangle=-90,  # upright: slanted labels of a long answer covered each other
        ),
        yaxis=dict(title=dict(text="layer")),
        height=520,
        showlegend=True,
        meta={"colourings": colourings},
        **{
            **_LAYOUT,
            "legend": dict(orientation="h", x=0, y=1.0, yanchor="bottom"),
            "margin": dict(l=60, r=round(labels_px) + 12, t=top, b=50),  # Plotly adds the colour bar's width
        },
    )
    return fig


def _depth_hovers(view: dict, texts: dict) -> list[list[str]]:
    """Per layer and token: the token's probability and rank there, and that layer's top candidates."""
    tokens = view["tokens"]
    return [
        [
            plot_text(
                f"token {i} {texts.get(tokens[i], tokens[i])!r}, layer {layer + 1}: "
                f"p {view['prob'][i][layer]:.3f}, rank {view['rank'][i][layer]}<br>top: "
                + ", ".join(f"{texts.get(c, str(c))!r} {p:.3f}" for c, p in view["top"][i][layer])
            )
            for i in range(len(tokens))
        ]
        for layer in range(view["num_layers"])
    ]
