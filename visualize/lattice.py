"""The depth × position lattice of one round as a Plotly figure, and the status of every node.

x is the node's position relative to the round's anchor slot (the anchor sits at +0), y its stage
(stage 0 at the top, its label in the stage's colour). Nodes sharing a (position, stage) cell are
different branches; they are laid out on a small grid inside the cell, in slot order, with marker
sizes fitted to the cell. A marker's label is its whole token text or nothing (hover shows it);
edges are drawn for the nodes this round created and those its collapse keeps, the rest on a
legend toggle, so a K = 8 lattice of 255 nodes stays legible. Plotly renders a subset of HTML in
titles, tick labels, marker labels and hover texts, so every trace value placed there passes
``markup.plot_text``.
"""

from __future__ import annotations

import math

import plotly.graph_objects as go

from .markup import plot_text
from .palette import STATUS_COLORS, stage_tick
from .replay import RoundView

DISCARDED_OPACITY = 0.25
PLOT_WIDTH_PX = 800          # nominal width used to fit marker sizes; the app may resize freely
STAGE_HEIGHT_PX = 70         # per stage up to K = 5; larger K share MAX_STAGES_PX
MAX_STAGES_PX = 360
FONT_PX = 11
EDGE_GROUPS = ("edges: this round", "edges: kept", "edges: other")


def stage_height(K: int) -> float:
    return min(STAGE_HEIGHT_PX, MAX_STAGES_PX / max(K, 1))


def node_statuses(view: RoundView) -> dict[int, str]:
    """Status of every node in the view (see ``STATUS_COLORS``).

    On a commit round the final node is "final" even when it is also the matched node (a match at
    the last stage); the other committed anchor nodes keep "anchor".
    """
    if view.commit:
        dropped, kept = set(view.dropped), set(view.kept)
        final, matched = view.final_node, view.matched_node
        out = {}
        for i in view.nodes:
            if i == final:
                out[i] = "final"
            elif i in dropped:
                out[i] = "discarded"
            elif i == matched or i in kept:
                out[i] = "accepted"
            else:
                out[i] = "anchor"
        return out
    return {i: "anchor" if n["position"] == view.commit_position else "pending"
            for i, n in view.nodes.items()}


def node_status(view: RoundView, node_id: int) -> str:
    return node_statuses(view)[node_id]


def token_texts(view: RoundView) -> dict[int, str | None]:
    """Token id -> text for every token whose text the run knows (candidates, commits, top entries
    with text), so a top-k list names tokens that this round did not propose."""
    out: dict[int, str | None] = dict(view.vocab)
    out.update((n["token"], n["text"]) for n in view.nodes.values() if n.get("text") is not None)
    for chain in view.anchor_chains:
        out.update((t, text) for t, text in chain if text is not None)
    out.update((t, text) for t, text in zip(view.tokens, view.texts) if text is not None)
    return out


def _label(text: str | None, token: int) -> str:
    if text is None:
        return str(token)
    return text.replace("\n", "⏎").strip() or "␣"


def _describe(token: int, vocab: dict[int, str | None]) -> str:
    text = vocab.get(token)
    return f"{text!r} ({token})" if text is not None else f"#{token}"


def _hover(node: dict, rel: int, depth: int, vocab: dict[int, str | None]) -> str:
    top = ", ".join(f"{_describe(t, vocab)} {p:.3f}" for t, p, *_ in node.get("top") or [])
    masked = ", ".join(_describe(t, vocab) for t in node.get("masked") or []) or "none"
    head = f"node {node['id']}"
    lines = [f"({node['kind']}, slot {node['slot']}, parent {node['parent']})",
             f"stage E{node['stage']} · d={depth} · position {node['position']} (+{rel})",
             f"candidate {_describe(node['token'], vocab)} (input {node['input_token']})",
             f"top: {top}", f"DECS-masked: {masked}"]
    return f"<b>{plot_text(head)}</b> " + "<br>".join(plot_text(line) for line in lines)


def _layout_cells(view: RoundView, window: int, columns: int):
    """Per node: (x, y, marker size, label width in characters) with same-cell nodes on a grid, in
    slot order."""
    cells: dict[tuple[int, int], list[dict]] = {}
    for node in view.nodes.values():
        rel = node["position"] - view.commit_position
        if rel < window:
            cells.setdefault((rel, node["stage"]), []).append(node)
    cell_w, cell_h = PLOT_WIDTH_PX / max(columns, 1), stage_height(view.num_stages)
    place = {}
    for (rel, stage), members in cells.items():
        members.sort(key=lambda n: (n["slot"], n["id"]))
        cols = math.ceil(math.sqrt(len(members)))
        rows = math.ceil(len(members) / cols)
        size = max(7.0, min(34.0, 0.7 * min(cell_w / cols, cell_h / rows)))
        chars = int(0.9 * cell_w / cols / (0.6 * FONT_PX)) if rows <= 2 else 0  # labels fit one line each
        for k, node in enumerate(members):
            r, c = divmod(k, cols)
            dx = (c - (cols - 1) / 2) * (0.8 / cols)
            dy = (r - (rows - 1) / 2) * (0.76 / rows)
            place[node["id"]] = (rel + dx, stage + dy, size, chars)
    return place


def _title(view: RoundView) -> str:
    title = f"Round {view.round} · state q={view.state_before}→{view.state_after}"
    if view.commit:
        text = view.commit.get("text")
        shown = repr(text) if text is not None else str(view.commit["token"])
        title += f" · commit {shown} matched at stage {view.commit['matched_stage']}"
    return plot_text(title)


def _edge_group(node_id: int, new: set[int], kept: set[int]) -> str:
    """Which edge trace the edge into ``node_id`` belongs to (``EDGE_GROUPS``)."""
    if node_id in new:
        return EDGE_GROUPS[0]
    return EDGE_GROUPS[1] if node_id in kept else EDGE_GROUPS[2]


def lattice_figure(view: RoundView, window: int = 12) -> go.Figure:
    """The lattice during one round: one scatter trace per status plus three edge traces (the round's
    new edges and, on a commit round, the kept ones drawn; the others behind a legend toggle).

    Only nodes less than ``window`` positions ahead of the anchor are drawn; a lattice of K stages
    never reaches further than K - 1 ahead, so the default draws every node for K <= 12 (and the
    node-marker count then equals ``lattice_size(view)``).
    """
    depths = view.start["depths"]
    K = len(depths)
    columns = min(window, K)
    place = _layout_cells(view, window, columns)
    status = node_statuses(view)
    vocab = token_texts(view)
    new, kept = set(view.new), set(view.kept) | set(view.committed_ids)
    groups: dict[str, dict[str, list]] = {s: {"x": [], "y": [], "size": [], "text": [], "hover": []}
                                          for s in STATUS_COLORS}
    edges: dict[str, tuple[list, list]] = {name: ([], []) for name in EDGE_GROUPS}
    for i, (x, y, size, chars) in place.items():
        node = view.nodes[i]
        g = groups[status[i]]
        g["x"].append(x)
        g["y"].append(y)
        g["size"].append(size)
        label = _label(node.get("text"), node["token"])
        g["text"].append(plot_text(label) if len(label) <= chars else "")
        g["hover"].append(_hover(node, node["position"] - view.commit_position, depths[node["stage"]], vocab))
        parent = node["parent"]
        if parent in place and node["kind"] in ("depth", "position"):
            xs, ys = edges[_edge_group(i, new, kept)]
            px, py, *_ = place[parent]
            xs += [px, x, None]
            ys += [py, y, None]
    traces = [go.Scatter(x=xs, y=ys, mode="lines", name=name, hoverinfo="skip",
                         visible="legendonly" if name == EDGE_GROUPS[2] else True,
                         line=dict(color="#7f8c8d" if name != EDGE_GROUPS[2] else "#bfc9ca", width=1))
              for name, (xs, ys) in edges.items()]
    for s, g in groups.items():
        traces.append(go.Scatter(
            x=g["x"], y=g["y"], mode="markers+text", name=s, text=g["text"], hovertext=g["hover"],
            hovertemplate="%{hovertext}<extra></extra>", textposition="middle center",
            textfont=dict(size=FONT_PX, color="#1b2631"),
            marker=dict(color=STATUS_COLORS[s], size=g["size"], symbol="square",
                        line=dict(color="#5d6d7e", width=1)),
            opacity=DISCARDED_OPACITY if s == "discarded" else 1.0))
    fig = go.Figure(data=traces)
    fig.update_layout(
        title=dict(text=_title(view)), uirevision="lattice", height=round(130 + stage_height(K) * K),
        margin=dict(l=90, r=20, t=60, b=40), plot_bgcolor="white", legend=dict(title=dict(text="status")),
        xaxis=dict(title=dict(text="position relative to the anchor"), tickvals=list(range(columns)),
                   ticktext=[f"+{j}" for j in range(columns)], range=[-0.6, columns - 0.4],
                   showgrid=False, zeroline=False),
        yaxis=dict(tickvals=list(range(K)), ticktext=[stage_tick(k, d) for k, d in enumerate(depths)],
                   range=[K - 0.5, -0.5], showgrid=False, zeroline=False),
        shapes=[dict(type="rect", xref="x", yref="paper", x0=-0.5, x1=0.5, y0=0, y1=1,
                     fillcolor="#fdf2e9", line=dict(width=0), layer="below")])
    return fig
