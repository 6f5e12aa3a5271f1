"""Summary charts: the token race between decoders, the earliest-available-depth (EAD) histogram, the
predicted depth-side speedup against the number of explorers, and the ``dex bench`` comparison.
Plotly renders a subset of HTML in names, labels and hover texts: values from results and reports
pass ``markup.plot_text``."""

from __future__ import annotations

import plotly.graph_objects as go

from .markup import plot_text
from .palette import CUT_COLOR, OKABE_ITO

_LAYOUT = dict(plot_bgcolor="white", margin=dict(l=60, r=20, t=50, b=50), legend=dict(orientation="h", y=-0.2))


def race_figure(series: list[dict]) -> go.Figure:
    """Tokens against seconds, one step line per series ``{"name", "times", "dash"?}``, where
    ``times[i]`` is when token i became available."""
    traces = [go.Scatter(x=[0.0] + list(s["times"]), y=list(range(len(s["times"]) + 1)), mode="lines",
                         name=plot_text(s["name"]), line=dict(shape="hv", width=2, dash="dash" if s.get("dash") else "solid",
                                                              color=OKABE_ITO[(4, 0, 2, 6)[i % 4]]))
              for i, s in enumerate(series)]
    fig = go.Figure(data=traces)
    fig.update_layout(title=dict(text="Tokens over time"), uirevision="race",
                      xaxis=dict(title=dict(text="seconds"), rangemode="tozero", gridcolor="#eaecee"),
                      yaxis=dict(title=dict(text="tokens"), rangemode="tozero", gridcolor="#eaecee"), **_LAYOUT)
    return fig


def _counts(values: list[int], num_layers: int) -> list[int]:
    counts = [0] * num_layers
    for v in values:
        counts[v - 1] += 1
    return counts


def ead_figure(analysis: dict) -> go.Figure:
    """Histogram over layers 1..L of the stable EAD (bars) with the plain EAD overlaid."""
    L = analysis["num_layers"]
    layers = list(range(1, L + 1))
    fig = go.Figure(data=[
        go.Bar(x=layers, y=_counts(analysis["ead_stable"], L), name="stable EAD", marker=dict(color=OKABE_ITO[4])),
        go.Bar(x=layers, y=_counts(analysis["ead"], L), name="EAD", marker=dict(color=OKABE_ITO[0])),
    ])
    fig.update_layout(title=dict(text="Earliest available depth per token"), barmode="group",
                      xaxis=dict(title=dict(text="layer"), range=[0.5, L + 0.5]),
                      yaxis=dict(title=dict(text="tokens"), gridcolor="#eaecee"), **_LAYOUT)
    return fig


def speedup_figure(analysis: dict) -> go.Figure:
    """Predicted depth-side speedup against K, with the oracle S_EAD as a dashed horizontal line."""
    predicted = sorted(analysis["predicted"], key=lambda p: p["explorers"])
    ks = [p["explorers"] for p in predicted]
    traces = [
        go.Scatter(x=ks, y=[p["speedup"] for p in predicted], mode="markers+lines", name="S_X (stable EAD)",
                   text=[plot_text(f"depths {p['depths']}") for p in predicted],
                   hovertemplate="K=%{x}: %{y:.2f}× (%{text})<extra></extra>", line=dict(color=OKABE_ITO[4])),
        go.Scatter(x=ks, y=[p["uniform"]["depth_speedup"] for p in predicted], mode="markers+lines",
                   name="DEX K / rounds per token" + (" (DECS)" if predicted and predicted[0]["decs"] else ""),
                   hovertemplate="K=%{x}: %{y:.2f}×<extra></extra>", line=dict(color=OKABE_ITO[2])),
    ]
    if predicted and "best" in predicted[0]:
        traces.append(go.Scatter(
            x=ks, y=[p["best"]["pipeline_speedup"] for p in predicted], mode="markers+lines",
            name="best set: L / (rounds × longest stage)", text=[plot_text(f"depths {p['best']['depths']}") for p in predicted],
            hovertemplate="K=%{x}: %{y:.2f}× (%{text})<extra></extra>", line=dict(color=OKABE_ITO[6], dash="dot")))
    fig = go.Figure(data=traces + [
        go.Scatter(x=[min(ks, default=1), max(ks, default=1)], y=[analysis["oracle"]] * 2, mode="lines",
                   name="oracle S_EAD", line=dict(color=CUT_COLOR, dash="dash")),
    ])
    fig.update_layout(title=dict(text="Predicted depth-side speedup"),
                      xaxis=dict(title=dict(text="explorers K"), tickvals=ks, gridcolor="#eaecee"),
                      yaxis=dict(title=dict(text="speedup ×"), rangemode="tozero", gridcolor="#eaecee"), **_LAYOUT)
    return fig


def bench_figure(report: dict) -> go.Figure:
    """``dex bench``: per method, the critical-path speedup over AR (L / layer forwards per token) and
    the measured tokens/s ratio over HF generate, one bar group per prompt set; the EAD oracle dashed."""
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08,
                        subplot_titles=("critical path: L / layer forwards per token (hardware-neutral)",
                                        "measured tokens/s over HF generate (this machine)"))
    palette = [OKABE_ITO[4], OKABE_ITO[0], OKABE_ITO[2], OKABE_ITO[6]]
    for i, (set_name, oracle) in enumerate(report["oracle"].items()):
        rows = [r for r in report["results"] if r["set"] == set_name]
        labels = [plot_text(_bench_label(r)) for r in rows]
        set_name = plot_text(set_name)
        color = palette[i % len(palette)]
        fig.add_trace(go.Bar(x=labels, y=[r["layer_speedup"] for r in rows], name=set_name, marker_color=color,
                             legendgroup=set_name), row=1, col=1)
        fig.add_trace(go.Bar(x=labels, y=[r["speedup_vs_ar"] for r in rows], name=set_name, marker_color=color,
                             legendgroup=set_name, showlegend=False), row=2, col=1)
        fig.add_trace(go.Scatter(x=[labels[0], labels[-1]], y=[oracle["speedup"]] * 2,
                                 mode="lines", name=f"EAD oracle ({set_name})",
                                 line=dict(color=color, dash="dash")), row=1, col=1)
    fig.update_layout(title=dict(text=plot_text(f"dex bench: {report['model']}")), barmode="group", height=720, **_LAYOUT)
    fig.update_yaxes(title_text="× AR", rangemode="tozero", gridcolor="#eaecee")
    return fig


def _bench_label(row: dict) -> str:
    if row["method"].startswith("dex"):
        extra = "" if row["adapters"] and row["decs"] else \
            f" ({'adapters' if row['adapters'] else 'no adapters'}, DECS {'on' if row['decs'] else 'off'})"
        return f"{row['method']} K={row['explorers']}{extra}"
    if "exit" in row:
        return f"{row['method']} E={row['exit']} n={row['draft']}"
    return row["method"]


def depth_figure(view: dict, texts: dict, depths=(), metric: str = "prob") -> go.Figure:
    """The logit lens as a heatmap (``dex_core.lens.depth_view``): token (x) by layer (y), coloured by the
    committed token's probability (``metric="prob"``) or rank (``"rank"``, 0 = top) at that layer; the
    explored ``depths`` as dashed lines, each token's earliest stable layer (EAD) as a dot; hovering a
    cell shows that layer's top candidates with their text. ``texts``: token id -> text."""
    L, tokens = view["num_layers"], view["tokens"]
    labels = [plot_text(f"{i}: {texts.get(t, str(t))!r}") for i, t in enumerate(tokens)]
    z = [[row[l] for row in view[metric]] for l in range(L)]  # (layer, token)
    hover = [[plot_text(f"token {i} {texts.get(tokens[i], tokens[i])!r}, layer {l + 1}: p {view['prob'][i][l]:.3f}, "
                        f"rank {view['rank'][i][l]}<br>top: " + ", ".join(
                            f"{texts.get(c, str(c))!r} {p:.3f}" for c, p in view["top"][i][l]))
              for i in range(len(tokens))] for l in range(L)]
    stable = [next((l + 1 for l in range(L) if all(r == 0 for r in view["rank"][i][l:])), L)
              for i in range(len(tokens))]  # a sampled token need not be the last layer's top
    colorscale = "Viridis" if metric == "prob" else "Viridis_r"
    fig = go.Figure(data=[
        go.Heatmap(z=z, x=list(range(len(tokens))), y=list(range(1, L + 1)), text=hover, hoverinfo="text",
                   colorscale=colorscale, zmin=0, zmax=1 if metric == "prob" else min(50, max(map(max, z), default=1)),
                   colorbar=dict(title=dict(text="p(token)" if metric == "prob" else "rank"))),
        go.Scatter(x=list(range(len(tokens))), y=stable, mode="markers", name="stable EAD (top from here on)",
                   marker=dict(color="white", size=6, line=dict(color="black", width=1)), hoverinfo="skip"),
    ])
    for d in depths:
        fig.add_hline(y=d + 0.5, line=dict(color=CUT_COLOR, dash="dash", width=1))
    fig.update_layout(title=dict(text="Depth view: the final token at every layer (logit lens"
                                      + (", adapters at " + ", ".join(map(str, view["adapter_depths"])) if view["adapter_depths"] else "")
                                      + "); dashed: explored depths"),
                      xaxis=dict(title=dict(text="generated token"), tickvals=list(range(len(tokens))),
                                 ticktext=labels, tickangle=-60),
                      yaxis=dict(title=dict(text="layer")), height=520, **_LAYOUT)
    return fig
