"""The depth × position lattice of one round as a Plotly figure, and the status of every node.

x is the node's position relative to the round's anchor slot (the anchor sits at +0), y its stage
(stage 0 at the top). Nodes sharing a (position, stage) cell are different branches; they are laid
out on a small grid inside the cell, in slot order, with marker and label sizes fitted to the cell.
Plotly renders a subset of HTML in titles, tick labels, marker labels and hover texts, so every trace
value placed there passes ``markup.plot_text``.
"""

from __future__ import annotations

import math

import plotly.graph_objects as go

from .markup import plot_text
from .replay import RoundView

STATUS_COLORS = {
    "anchor": "#f5b041",     # the anchor slot's nodes while its token is pending
    "pending": "#aed6f1",    # other live speculative nodes
    "accepted": "#58d68d",   # commit round: the matched anchor node and the kept subtree
    "discarded": "#b3b6b7",  # dropped by this round's collapse (drawn faded)
    "final": "#c39bd3",      # commit round: the anchor's final-stage reference node
}
DISCARDED_OPACITY = 0.25
PLOT_WIDTH_PX = 800          # nominal width used to fit marker sizes; the app may resize freely
STAGE_HEIGHT_PX = 70


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
    """Token id -> text for every token whose text the view knows (candidates and commits)."""
    out = {n["token"]: n.get("text") for n in view.nodes.values()}
    for chain in view.anchor_chains:
        out.update(chain)
    out.update(zip(view.tokens, view.texts))
    return out


def _label(text: str | None, token: int) -> str:
    if text is None:
        return str(token)
    return text.replace("\n", "⏎").strip() or "␣"


def _describe(token: int, vocab: dict[int, str | None]) -> str:
    text = vocab.get(token)
    return f"{token} {text!r}" if text is not None else str(token)


def _hover(node: dict, rel: int, depth: int, vocab: dict[int, str | None]) -> str:
    top = ", ".join(f"{_describe(t, vocab)} {p:.3f}" for t, p in node.get("top") or [])
    masked = ", ".join(_describe(t, vocab) for t in node.get("masked") or []) or "none"
    head = f"node {node['id']}"
    lines = [f"({node['kind']}, slot {node['slot']}, parent {node['parent']})",
             f"stage E{node['stage']} · d={depth} · position {node['position']} (+{rel})",
             f"candidate {_describe(node['token'], vocab)} (input {node['input_token']})",
             f"top: {top}", f"DECS-masked: {masked}"]
    return f"<b>{plot_text(head)}</b> " + "<br>".join(plot_text(line) for line in lines)


def _layout_cells(view: RoundView, window: int, columns: int):
    """Per node: (x, y, marker size) with same-cell nodes on a grid, in slot order."""
    cells: dict[tuple[int, int], list[dict]] = {}
    for node in view.nodes.values():
        rel = node["position"] - view.commit_position
        if rel < window:
            cells.setdefault((rel, node["stage"]), []).append(node)
    cell_w = PLOT_WIDTH_PX / max(columns, 1)
    place = {}
    for (rel, stage), members in cells.items():
        members.sort(key=lambda n: (n["slot"], n["id"]))
        cols = math.ceil(math.sqrt(len(members)))
        rows = math.ceil(len(members) / cols)
        size = max(7.0, min(34.0, 0.7 * min(cell_w / cols, STAGE_HEIGHT_PX / rows)))
        for k, node in enumerate(members):
            r, c = divmod(k, cols)
            dx = (c - (cols - 1) / 2) * (0.8 / cols)
            dy = (r - (rows - 1) / 2) * (0.76 / rows)
            place[node["id"]] = (rel + dx, stage + dy, size)
    return place


def _title(view: RoundView) -> str:
    title = f"Round {view.round} · state q={view.state_before}→{view.state_after}"
    if view.commit:
        text = view.commit.get("text")
        shown = repr(text) if text is not None else str(view.commit["token"])
        title += f" · commit {shown} matched at stage {view.commit['matched_stage']}"
    return plot_text(title)


def lattice_figure(view: RoundView, window: int = 12) -> go.Figure:
    """The lattice during one round: one scatter trace per status plus depth and position edges.

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
    groups: dict[str, dict[str, list]] = {s: {"x": [], "y": [], "size": [], "text": [], "font": [], "hover": []}
                                          for s in STATUS_COLORS}
    depth_xy: tuple[list, list] = ([], [])
    pos_xy: tuple[list, list] = ([], [])
    for i, (x, y, size) in place.items():
        node = view.nodes[i]
        g = groups[status[i]]
        g["x"].append(x)
        g["y"].append(y)
        g["size"].append(size)
        chars = int(size / 6.5)
        label = _label(node.get("text"), node["token"]) if chars >= 2 else ""
        g["text"].append(plot_text(label if len(label) <= chars else label[:chars - 1] + "…"))
        g["font"].append(max(7.0, min(12.0, size * 0.4)))
        g["hover"].append(_hover(node, node["position"] - view.commit_position, depths[node["stage"]], vocab))
        parent = node["parent"]
        if parent in place and node["kind"] in ("depth", "position"):
            xs, ys = depth_xy if node["kind"] == "depth" else pos_xy
            px, py, _ = place[parent]
            xs += [px, x, None]
            ys += [py, y, None]
    traces = [
        go.Scatter(x=depth_xy[0], y=depth_xy[1], mode="lines", name="depth edges", hoverinfo="skip",
                   line=dict(color="#7f8c8d", width=1)),
        go.Scatter(x=pos_xy[0], y=pos_xy[1], mode="lines", name="position edges", hoverinfo="skip",
                   line=dict(color="#95a5a6", width=1, dash="dot")),
    ]
    for s, g in groups.items():
        traces.append(go.Scatter(
            x=g["x"], y=g["y"], mode="markers+text", name=s, text=g["text"], hovertext=g["hover"],
            hovertemplate="%{hovertext}<extra></extra>", textposition="middle center",
            textfont=dict(size=g["font"], color="#1b2631"),
            marker=dict(color=STATUS_COLORS[s], size=g["size"], symbol="square",
                        line=dict(color="#5d6d7e", width=1)),
            opacity=DISCARDED_OPACITY if s == "discarded" else 1.0))
    fig = go.Figure(data=traces)
    fig.update_layout(
        title=dict(text=_title(view)), uirevision="lattice", height=140 + STAGE_HEIGHT_PX * K,
        margin=dict(l=90, r=20, t=60, b=50), plot_bgcolor="white", legend=dict(title=dict(text="status")),
        xaxis=dict(title=dict(text="position relative to the anchor"), tickvals=list(range(columns)),
                   ticktext=[f"+{j}" for j in range(columns)], range=[-0.6, columns - 0.4],
                   showgrid=False, zeroline=False),
        yaxis=dict(tickvals=list(range(K)), ticktext=[plot_text(f"E{k} · d={d}") for k, d in enumerate(depths)],
                   range=[K - 0.5, -0.5], showgrid=False, zeroline=False),
        shapes=[dict(type="rect", xref="x", yref="paper", x0=-0.5, x1=0.5, y0=0, y1=1,
                     fillcolor="#fdf2e9", line=dict(width=0), layer="below")])
    return fig


