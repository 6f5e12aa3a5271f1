"""The timeline: every node of a run on one canvas, laid out from the run's lattice DAG (``graph``).

x is the node's absolute position, y its stage (stage 0 at the top); the nodes that shared a
(position, stage) cell over the run sit on a small grid inside it, in round order, their markers at least
``MIN_MARK_PX`` wide. A long run does not fit one screen at that size: the figure opens at its first positions,
as many as ``PLOT_WIDTH_PX`` holds with the most crowded cell's markers apart (``Placed.px_per_position``), and
the rest is a pan or a zoom away. A drag zooms along x (``dragmode``, a layout setting, so it travels in the
figure: Gradio's ``gr.Plot`` builds plotly's config itself, where scroll zoom would have to be switched on, and
a wheel over the figure keeps scrolling the page), shift-drag or a drag on the axis pans, a double-click goes
back; the x axis's title says so. The node's fate is its mark (``palette.FATE_MARKS``, greys and shapes:
matched, final, committed, discarded, cut (named only where draft chains cut nodes), pending), named in a
legend above the plot, in view at every K; the plot's height grows with K. Each collapse
is drawn as a cut: a dashed line after the committed position across the stages whose branches it
dropped, and a marker above the lattice whose hover says what it kept and dropped. A round that
committed several tokens (along a draft chain) cuts after its last one, and its marker is labelled
×N. Every node of a draft-chain slot is framed by a dotted outline over its fate mark, and the chain's
edges run dashed along the position axis (``palette.CHAIN_LINE``, ``CHAIN_EDGE``). Hover on a node
shows its round, stage, candidate, top-k with text and fate; every point carries its round in
``customdata`` so a click can open that round (the app does). Surviving edges are drawn, the edges
into discarded (or cut) nodes sit behind a legend toggle. Trace values in Plotly text pass ``plot_text``.
It draws a run's typed events (``dex_core.trace.events``), as the graph does.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass

import plotly.graph_objects as go

from dex_core.trace.events import Event, NodeRecord, RoundEvent, StartEvent

from .graph import FATES, lattice_graph
from .markup import plot_text
from .palette import CHAIN_EDGE, CHAIN_LINE, CUT_COLOR, FATE_MARKS, frames, stage_tick
from .replay import event_texts

PLOT_WIDTH_PX = 1100  # nominal plot width the opening window of positions is fitted to
MIN_MARK_PX, MAX_MARK_PX = 5.0, 12.0  # a node's marker size
SLOT = 0.8  # the share of its (position, stage) cell a grid of nodes spans, on each axis
FILL = 0.875  # a marker's size over its grid's pitch: neighbours stay apart
MIN_WINDOW = 6  # the fewest positions the timeline opens at, however crowded a cell
TOP_PX = 70  # the title, then the legend in one row, above the plot
BOTTOM_PX = 55  # the x axis and its title
ROW_PX = 22  # per y unit (a stage row) when K is large: stage labels stay apart
MIN_PLOT_PX = 150  # the plot area at small K, so its few rows and stage labels stay apart
EDGE_COLOR = "#C8C8C8"
CUT_ROW = -0.8  # y of the collapse markers, above stage 0
GONE_EDGES, CHAIN_FRAMES = "edges into discarded nodes", "draft chain"
Y_TOP = CUT_ROW - 0.4  # the y axis runs from K - 0.5 (below the last stage) up to here
X_TITLE = "absolute position · drag: zoom · shift-drag: pan · double-click: back"


def y_units(K: int) -> float:
    return max(K, 1) - 0.5 - Y_TOP


def plot_height(K: int) -> int:
    """Pixel height of the plot area for K stages (the figure adds ``TOP_PX + BOTTOM_PX``)."""
    return max(MIN_PLOT_PX, round(ROW_PX * y_units(K)))


def _describe(token: int, vocab: dict[int, str]) -> str:
    text = vocab.get(token)
    return f"{text!r} ({token})" if text is not None else f"#{token}"


def _hover(node: dict, record: NodeRecord, depths, vocab: dict[int, str]) -> str:
    """A node's hover: ``node`` its attributes in the graph, ``record`` its node record."""
    top = ", ".join(f"{_describe(t, vocab)} {p:.3f}" for t, p, *_ in record.top) or "not recorded"
    fate = node["fate"] + (f" (in round {node['cut_round']})" if node["fate"] in ("discarded", "cut") else "")
    chain = " · draft chain (its input was looked up)" if node["drafted"] else ""
    lines = [
        f"node {record.id} · round {node['round']}{chain}",
        f"E{node['stage']} · d={depths[node['stage']]} · position {node['position']}",
        f"candidate {_describe(node['token'], vocab)}",
        f"top: {top}",
        f"fate: {fate}",
    ]
    return "<br>".join(plot_text(line) for line in lines)


@dataclass(frozen=True)
class Placed:
    """Where the timeline draws each node: ``at`` per node (x, y, marker size in px), and the x scale its grids
    were fitted to (px per position at ``PLOT_WIDTH_PX``)."""

    at: dict[int, tuple[float, float, float]]
    px_per_position: float


def _grid(n: int, row_px: float) -> tuple[int, int, float]:
    """(columns, rows, marker px) of a cell of ``n`` nodes: square, but no more rows than a stage row of ``row_px``
    holds at ``MIN_MARK_PX`` (the x axis has room to spare: the opening window is fitted to the columns)."""
    room = SLOT * FILL * row_px  # the marker size of a grid of one row; of r rows, room / r
    most = max(1, math.floor(room / MIN_MARK_PX))
    cols = math.ceil(math.sqrt(n))
    rows = math.ceil(n / cols)
    if rows > most:
        rows, cols = most, math.ceil(n / most)
    return cols, rows, max(MIN_MARK_PX, min(MAX_MARK_PX, room / rows))


def _place(graph, row_px: float) -> Placed:
    """Same-cell nodes on a grid in (round, id) order; ``row_px`` is a stage row's height in pixels. The x scale is
    the one the most crowded cell's columns need (``FILL``), or the one that shows every position if that is wider."""
    cells: dict[tuple[int, int], list[int]] = {}
    for i, node in graph.nodes(data=True):
        cells.setdefault((node["position"], node["stage"]), []).append(i)
    first, last = _extent(graph)
    at, needed = {}, PLOT_WIDTH_PX / (last - first)
    for (position, stage), ids in cells.items():
        ids.sort(key=lambda i: (graph.nodes[i]["round"], i))
        cols, rows, size = _grid(len(ids), row_px)
        needed = max(needed, size * cols / (SLOT * FILL))  # px a position needs to keep these columns apart
        for k, i in enumerate(ids):
            r, c = divmod(k, cols)
            at[i] = (
                position + (c - (cols - 1) / 2) * (SLOT / cols),
                stage + (r - (rows - 1) / 2) * (SLOT / rows),
                size,
            )
    return Placed(at=at, px_per_position=min(needed, PLOT_WIDTH_PX / MIN_WINDOW))


def _extent(graph) -> tuple[float, float]:
    """The x extent of what the timeline draws: its first position's grid to the last collapse and its ×N label."""
    positions = [n["position"] for _, n in graph.nodes(data=True)] or [0]
    return min(positions) - 0.6, max(positions) + 1.0


def _opening_range(graph, placed: Placed) -> list[float] | None:
    """The x range the timeline opens at: the first positions ``PLOT_WIDTH_PX`` holds at the placed scale, or
    None (plotly's autorange) where every position fits."""
    first, last = _extent(graph)
    width = PLOT_WIDTH_PX / placed.px_per_position
    return None if last - first <= width + 1e-9 else [first, first + width]


def _cuts(events: list[Event], graph) -> tuple[dict, dict]:
    """Collapse lines (x, y with None breaks) and one marker per collapse (x, round, label, hover), after
    the round's last commit; a round of several commits is labelled ×N and its hover says which were drafted."""
    lines: dict[str, list] = {"x": [], "y": []}
    marks: dict[str, list] = {"x": [], "round": [], "label": [], "hover": []}
    for event in events:
        if not isinstance(event, RoundEvent) or not event.collapse or not event.commits:
            continue
        collapse, commits = event.collapse, event.commits
        last = commits[-1].position
        x = last + 0.5
        stages = [graph.nodes[i]["stage"] for i in collapse["dropped"] if i in graph]
        if stages:
            lines["x"] += [x, x, None]
            lines["y"] += [min(stages) - 0.45, max(stages) + 0.45, None]
        marks["x"].append(x)
        marks["round"].append(event.round)
        marks["label"].append(f"×{len(commits)}" if len(commits) > 1 else "")
        drafted = [c.position for c in commits if c.drafted]
        what = (
            f"committed {len(commits)} tokens at positions {commits[0].position}–{last} "
            f"(drafted: {', '.join(map(str, drafted)) or 'none'}), "
            if len(commits) > 1
            else ""
        )
        marks["hover"].append(
            plot_text(
                f"round {event.round}: {what}collapse after position {last}, "
                f"kept {len(collapse['kept'])}, dropped {len(stages)}"
            )
        )
    return lines, marks


def timeline_figure(events: list[Event], note: str = "") -> go.Figure:
    """The whole run's lattice as one figure, from its typed events (an AR trace or a run without rounds
    gives an empty one); ``note`` (plain text, e.g. what a click does where the figure is shown) ends its
    title."""
    graph = lattice_graph(events)  # refuses plain records
    depths = events[0].depths if events and isinstance(events[0], StartEvent) else []
    rounds = [e for e in events if isinstance(e, RoundEvent)]
    records, vocab = {}, {}
    for event in rounds:
        records.update((n.id, n) for n in event.nodes)
        vocab.update(event_texts(event))
    placed = _place(graph, plot_height(len(depths)) / y_units(len(depths)))
    place = placed.at
    edges = _edge_lines(graph, place)
    traces = [
        go.Scatter(
            x=edges[name][0],
            y=edges[name][1],
            mode="lines",
            name=name,
            hoverinfo="skip",
            legendrank=300,
            visible=True if name == "edges" else "legendonly",
            line=dict(color=EDGE_COLOR, width=1),
        )
        for name in ("edges", GONE_EDGES)
    ]
    for rank, fate in enumerate(FATES):  # the fates lead the legend, then the chains, collapses and edges
        ids = [i for i, n in graph.nodes(data=True) if n["fate"] == fate]
        if ids or fate != "cut":  # "cut" named only where draft chains cut nodes
            traces.append(_fate_trace(graph, ids, fate, rank, place, (records, depths, vocab)))
    traces += _chain_traces(graph, placed, edges["chain"], len(depths)) + _collapse_traces(
        *_cuts(events, graph)
    )
    title = f"Whole run: {graph.number_of_nodes()} nodes in {len(rounds)} rounds" + (
        f" · {plot_text(note)}" if note else ""
    )
    fig = _laid_out(go.Figure(data=traces), title, depths)
    return fig.update_layout(uirevision=_revision(graph), xaxis_range=_opening_range(graph, placed))


def _revision(graph) -> str:
    """The figure's ``uirevision``: the same run keeps the visitor's zoom when it is drawn again, another run opens
    at its own window."""
    nodes = sorted((i, n["position"], n["stage"], n["round"], n["token"]) for i, n in graph.nodes(data=True))
    return f"timeline {zlib.crc32(repr(nodes).encode()):08x}"


def _edge_lines(graph, place: dict) -> dict[str, tuple[list, list]]:
    """The edges as three lines (x, y with gaps): live ones, those into dropped nodes, the chains'."""
    edges: dict[str, tuple[list, list]] = {"edges": ([], []), GONE_EDGES: ([], []), "chain": ([], [])}
    for a, b, kind in graph.edges(data="kind"):
        gone = graph.nodes[b]["fate"] in ("discarded", "cut")
        xs, ys = edges[GONE_EDGES if gone else "chain" if kind == "chain" else "edges"]
        xs += [place[a][0], place[b][0], None]
        ys += [place[a][1], place[b][1], None]
    return edges


def _fate_trace(graph, ids: list, fate: str, rank: int, place: dict, texts: tuple) -> go.Scatter:
    """The nodes of one fate; ``texts``: (node records by id, the depths, token texts) for their hovers."""
    records, depths, vocab = texts
    nodes, mark = [graph.nodes[i] for i in ids], FATE_MARKS[fate]
    return go.Scatter(
        x=[place[i][0] for i in ids],
        y=[place[i][1] for i in ids],
        mode="markers",
        name=fate,
        legendrank=100 + rank,
        customdata=[n["round"] for n in nodes],
        hovertext=[_hover(n, records[i], depths, vocab) for i, n in zip(ids, nodes)],
        hovertemplate="%{hovertext}<extra></extra>",
        opacity=0.45 if fate in ("discarded", "cut") else 1.0,
        marker=dict(
            color=mark.fill,
            size=[place[i][2] for i in ids],
            symbol=mark.symbol,
            line=dict(color=mark.line, width=mark.width),
        ),
    )


def _chain_traces(graph, placed: Placed, chain_edges: tuple, K: int) -> list:
    """Draft chains' frames (live, and faded for dropped nodes) and edges, under one legend entry."""
    drafted = [i for i, n in graph.nodes(data=True) if n["drafted"]]
    if not drafted:
        return []
    place, cell_w = placed.at, placed.px_per_position
    row_px = plot_height(K) / y_units(K)
    traces = []
    for gone in (False, True):  # a dropped node's frame fades with it
        xs, ys = frames(
            (place[i][0], place[i][1], (place[i][2] / 2 + 2) / cell_w, (place[i][2] / 2 + 2) / row_px)
            for i in drafted
            if (graph.nodes[i]["fate"] in ("discarded", "cut")) == gone
        )
        traces.append(
            go.Scatter(
                x=xs,
                y=ys,
                mode="lines",
                name=CHAIN_FRAMES,
                hoverinfo="skip",
                legendrank=150,
                legendgroup="chains",
                showlegend=not gone,
                opacity=0.3 if gone else 1.0,
                line=CHAIN_LINE,
            )
        )
    return traces + [
        go.Scatter(
            x=chain_edges[0],
            y=chain_edges[1],
            mode="lines",
            name="chain edges",
            hoverinfo="skip",
            legendgroup="chains",
            showlegend=False,
            line=CHAIN_EDGE,
        )
    ]


def _collapse_traces(lines: dict, marks: dict) -> list:
    """The collapses: dotted cuts across the stages and a marker per commit round above them."""
    return [
        go.Scatter(
            x=lines["x"],
            y=lines["y"],
            mode="lines",
            name="collapse cuts",
            hoverinfo="skip",
            legendgroup="collapses",
            showlegend=False,
            line=dict(color=CUT_COLOR, width=1, dash="dot"),
        ),
        go.Scatter(
            x=marks["x"],
            y=[CUT_ROW] * len(marks["x"]),
            mode="markers+text",
            name="collapses",
            legendgroup="collapses",
            legendrank=200,
            text=marks["label"],
            textposition="middle right",
            textfont=dict(size=10, color=CUT_COLOR),
            customdata=marks["round"],
            hovertext=marks["hover"],
            hovertemplate="%{hovertext}<extra></extra>",
            marker=dict(color=CUT_COLOR, symbol="triangle-down", size=7),
        ),
    ]


def _laid_out(fig: go.Figure, title: str, depths: list) -> go.Figure:
    K = len(depths)
    fig.update_layout(
        title=dict(text=title, yref="container", y=1, yanchor="top", pad=dict(t=8)),
        uirevision="timeline",
        height=TOP_PX + plot_height(K) + BOTTOM_PX,
        plot_bgcolor="white",
        hovermode="closest",
        dragmode="zoom",  # along x only: the stages stay put
        margin=dict(l=90, r=20, t=TOP_PX, b=BOTTOM_PX),
        legend=dict(title=dict(text="fate:"), orientation="h", x=0, xanchor="left", y=1.02, yanchor="bottom"),
        xaxis=dict(title=dict(text=X_TITLE), showgrid=False, zeroline=False),
        yaxis=dict(
            tickvals=list(range(K)),
            ticktext=[stage_tick(k, depths) for k in range(K)],
            range=[K - 0.5, Y_TOP],
            fixedrange=True,
            showgrid=False,
            zeroline=False,
        ),
    )
    return fig
