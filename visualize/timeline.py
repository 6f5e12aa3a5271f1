"""The timeline: every node of a run on one canvas, laid out from the run's lattice DAG (``graph``).

x is the node's absolute position, y its stage (stage 0 at the top); the nodes that shared a
(position, stage) cell over the run sit on a small grid inside it, in round order. Colour is the
node's fate (``palette.FATE_COLORS``: matched, final, committed, discarded, pending). Each collapse
is drawn as a cut: a dashed line after the committed position across the stages whose branches it
dropped, and a marker above the lattice whose hover says what it kept and dropped. Hover on a node
shows its round, stage, candidate, top-k with text and fate; every point carries its round in
``customdata`` so a click can open that round (the app does). Surviving edges are drawn, the edges
into discarded nodes sit behind a legend toggle. Trace values in Plotly text pass ``plot_text``.
"""

from __future__ import annotations

import math

import plotly.graph_objects as go

from .graph import FATES, lattice_graph
from .markup import plot_text
from .palette import CUT_COLOR, FATE_COLORS, stage_tick
from .replay import event_texts

PLOT_WIDTH_PX = 1100   # nominal width used to fit marker sizes
STAGE_PX = 28
CUT_ROW = -0.8         # y of the collapse markers, above stage 0


def _describe(token: int, vocab: dict[int, str]) -> str:
    text = vocab.get(token)
    return f"{text!r} ({token})" if text is not None else f"#{token}"


def _hover(node: dict, record: dict, depths, vocab: dict[int, str]) -> str:
    top = ", ".join(f"{_describe(t, vocab)} {p:.3f}" for t, p, *_ in record.get("top") or []) or "not recorded"
    fate = node["fate"] + (f" (cut in round {node['cut_round']})" if node["fate"] == "discarded" else "")
    lines = [f"node {record['id']} · round {node['round']}",
             f"E{node['stage']} · d={depths[node['stage']]} · position {node['position']}",
             f"candidate {_describe(node['token'], vocab)}", f"top: {top}", f"fate: {fate}"]
    return "<br>".join(plot_text(line) for line in lines)


def _place(graph) -> dict[int, tuple[float, float, float]]:
    """Per node: (x, y, marker size), same-cell nodes on a grid in (round, id) order."""
    cells: dict[tuple[int, int], list[int]] = {}
    for i, node in graph.nodes(data=True):
        cells.setdefault((node["position"], node["stage"]), []).append(i)
    positions = {p for p, _ in cells}
    cell_w = PLOT_WIDTH_PX / max(len(positions), 1)
    place = {}
    for (position, stage), ids in cells.items():
        ids.sort(key=lambda i: (graph.nodes[i]["round"], i))
        cols = math.ceil(math.sqrt(len(ids)))
        rows = math.ceil(len(ids) / cols)
        size = max(4.0, min(12.0, 0.7 * min(cell_w / cols, STAGE_PX / rows)))
        for k, i in enumerate(ids):
            r, c = divmod(k, cols)
            place[i] = (position + (c - (cols - 1) / 2) * (0.8 / cols), stage + (r - (rows - 1) / 2) * (0.8 / rows), size)
    return place


def _cuts(events: list[dict], graph) -> tuple[dict, dict]:
    """Collapse lines (x, y with None breaks) and one marker per collapse (x, round, hover)."""
    lines: dict[str, list] = {"x": [], "y": []}
    marks: dict[str, list] = {"x": [], "round": [], "hover": []}
    for event in events:
        collapse, commit = event.get("collapse"), event.get("commit")
        if event.get("event") != "round" or not collapse or not commit:
            continue
        x = commit["position"] + 0.5
        stages = [graph.nodes[i]["stage"] for i in collapse.get("dropped", []) if i in graph]
        if stages:
            lines["x"] += [x, x, None]
            lines["y"] += [min(stages) - 0.45, max(stages) + 0.45, None]
        marks["x"].append(x)
        marks["round"].append(event["round"])
        marks["hover"].append(plot_text(f"round {event['round']}: collapse after position {commit['position']}, "
                                        f"kept {len(collapse.get('kept', []))}, dropped {len(stages)}"))
    return lines, marks


def timeline_figure(events: list[dict]) -> go.Figure:
    """The whole run's lattice as one figure (an AR trace or a run without rounds gives an empty one)."""
    start = events[0] if events and events[0].get("event") == "start" else {}
    depths = start.get("depths", [])
    K = len(depths)
    graph = lattice_graph(events)
    records, vocab = {}, {}
    for event in events:
        if event.get("event") == "round":
            records.update((n["id"], n) for n in event["nodes"])
            vocab.update(event_texts(event))
    place = _place(graph)
    traces = []
    for name, keep in (("edges", True), ("edges into discarded nodes", False)):
        xs, ys = [], []
        for a, b in graph.edges:
            if (graph.nodes[b]["fate"] != "discarded") == keep:
                xs += [place[a][0], place[b][0], None]
                ys += [place[a][1], place[b][1], None]
        traces.append(go.Scatter(x=xs, y=ys, mode="lines", name=name, hoverinfo="skip",
                                 visible=True if keep else "legendonly", line=dict(color="#c8cfd4", width=1)))
    for fate in FATES:
        ids = [i for i, n in graph.nodes(data=True) if n["fate"] == fate]
        nodes = [graph.nodes[i] for i in ids]
        traces.append(go.Scatter(
            x=[place[i][0] for i in ids], y=[place[i][1] for i in ids], mode="markers", name=fate,
            customdata=[n["round"] for n in nodes], hovertext=[_hover(n, records[i], depths, vocab) for i, n in zip(ids, nodes)],
            hovertemplate="%{hovertext}<extra></extra>", opacity=0.45 if fate == "discarded" else 1.0,
            marker=dict(color=FATE_COLORS[fate], size=[place[i][2] for i in ids], line=dict(color="#5d6d7e", width=0.5))))
    lines, marks = _cuts(events, graph)
    traces.append(go.Scatter(x=lines["x"], y=lines["y"], mode="lines", name="collapse cuts", hoverinfo="skip",
                             line=dict(color=CUT_COLOR, width=1, dash="dot")))
    traces.append(go.Scatter(x=marks["x"], y=[CUT_ROW] * len(marks["x"]), mode="markers", name="collapses",
                             customdata=marks["round"], hovertext=marks["hover"], hovertemplate="%{hovertext}<extra></extra>",
                             marker=dict(color=CUT_COLOR, symbol="triangle-down", size=7)))
    fig = go.Figure(data=traces)
    rounds = sum(1 for e in events if e.get("event") == "round")
    fig.update_layout(
        title=dict(text=f"Whole run: {graph.number_of_nodes()} nodes in {rounds} rounds"),
        uirevision="timeline", height=90 + STAGE_PX * max(K, 1), plot_bgcolor="white", hovermode="closest",
        margin=dict(l=90, r=20, t=40, b=35), legend=dict(title=dict(text="fate")),
        xaxis=dict(title=dict(text="absolute position"), showgrid=False, zeroline=False),
        yaxis=dict(tickvals=list(range(K)), ticktext=[stage_tick(k, d) for k, d in enumerate(depths)],
                   range=[K - 0.5, CUT_ROW - 0.4], showgrid=False, zeroline=False))
    return fig
