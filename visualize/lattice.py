"""The depth × position lattice of one round as a Plotly figure, and the status of every node.

x is the node's position relative to the round's anchor slot (the anchor sits at +0), y its stage
(stage 0 at the top, its label in the stage's colour). Nodes sharing a (position, stage) cell are
different branches; they are laid out on a small grid inside the cell, in slot order, with marker
sizes fitted to the cell. Labels are fitted for a narrow figure (``FIT_PLOT_PX``, so any wider one
reads too): a lattice of more positions than fit opens on the anchor's neighbourhood (drag to pan the
rest), a label too long for its place is cut with "…", one that would overlap another is left out, and
hover shows every node's whole text; the title breaks into lines rather than being cut. Edges are
drawn for the nodes this round created and those its collapse keeps, the rest on a legend toggle, so a
K = 8 lattice of 255 nodes stays legible. Draft chains: every node of a chain slot is framed by a
dotted outline (``palette.CHAIN_LINE``) over its status, a chain's edges run dashed along the position
axis, and a round that commits several tokens (along a chain) marks each commit's final and matched
nodes. Plotly renders a subset of HTML in titles, tick labels, marker labels and hover texts, so every
trace value placed there passes ``markup.plot_text``.
"""

from __future__ import annotations

import math

import plotly.graph_objects as go

from dex_core.trace.events import CommitRecord, NodeRecord

from .fit import LINE_EM, corner_title, elide, keep_apart, label_box, text_px, wrap
from .markup import plot_text
from .palette import CHAIN_EDGE, CHAIN_LINE, DARK, PALE, STATUS_MARKS, WHITE, frames, stage_tick
from .replay import RoundView

DISCARDED_OPACITY = 0.25
FIT_PLOT_PX = 400  # the plot area's width labels and markers are fitted for (a figure 510 px wide)
MIN_COLUMN_PX = 26  # a position's column at least: more positions than fit open zoomed on the anchor
MARGIN = dict(l=90, r=44, b=40)  # px; the top holds the title's lines, the right Plotly's toolbar (upright)
STAGE_HEIGHT_PX = 70  # per stage up to K = 5; larger K share MAX_STAGES_PX
MAX_STAGES_PX = 320  # K = 8: 40 px a stage, two rows of labels in a cell
FONT_PX = 11
TITLE_PX = 14  # the title's font
TITLE_PAD = 18  # px above the title
LEGEND_ITEM_PX, LEGEND_ROW_PX = 40, 28  # a legend entry: its symbol and gaps; a row of entries
LEGEND_FIT_PX = 540  # the plot's width the legend's rows are reserved for (the Debugger at 1,400 px)
FADED = ("discarded", "cut")  # statuses drawn faded (their labels stay dark)
EDGE_GROUPS = ("edges: this round", "edges: kept", "edges: other")
CHAIN_EDGES, CHAIN_FRAMES = (
    "edges: draft chain",
    "draft chain",
)  # drawn when the round's lattice has chain slots


def stage_height(K: int) -> float:
    return min(STAGE_HEIGHT_PX, MAX_STAGES_PX / max(K, 1))


def chain_nodes(view: RoundView) -> set[int]:
    """The nodes of the view's draft-chain slots: each chain slot's stage-0 node (kind "chain") and the
    deeper nodes of the same slot."""
    slots = {n.slot for n in view.nodes.values() if n.kind == "chain"}
    return {i for i, n in view.nodes.items() if n.slot in slots}


def node_statuses(view: RoundView) -> dict[int, str]:
    """Status of every node in the view (see ``palette.STATUS_MARKS``).

    On a commit round each commit's final node is "final" even when it is also its matched node (a
    match at the last stage); the other committed anchor nodes keep "anchor". Chain nodes this round
    cut (the slot before them proposed another token) are "cut", on any round.
    """
    cut, commits = set(view.cut), view.commits
    if commits:
        dropped, kept = set(view.dropped), set(view.kept)
        finals = {c.anchor_nodes[-1] for c in commits}
        matched = {c.anchor_nodes[c.matched_stage] for c in commits}
        out = {}
        for i in view.nodes:
            if i in finals:
                out[i] = "final"
            elif i in cut:
                out[i] = "cut"
            elif i in dropped:
                out[i] = "discarded"
            elif i in matched or i in kept:
                out[i] = "accepted"
            else:
                out[i] = "anchor"
        return out
    return {
        i: "cut" if i in cut else "anchor" if n.position == view.commit_position else "pending"
        for i, n in view.nodes.items()
    }


def node_status(view: RoundView, node_id: int) -> str:
    return node_statuses(view)[node_id]


def token_texts(view: RoundView) -> dict[int, str | None]:
    """Token id -> text for every token whose text the run knows (candidates, commits, top entries
    with text), so a top-k list names tokens that this round did not propose."""
    out: dict[int, str | None] = dict(view.vocab)
    out.update((n.token, n.text) for n in view.nodes.values() if n.text is not None)
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


def _hover(
    node: NodeRecord, rel: int, depth: int, vocab: dict[int, str | None], chained: bool = False
) -> str:
    top = ", ".join(f"{_describe(t, vocab)} {p:.3f}" for t, p, *_ in node.top)
    masked = ", ".join(_describe(t, vocab) for t in node.masked) or "none"
    head = f"node {node.id}"
    chain = ", a draft-chain slot: its input was looked up" if chained else ""
    lines = [
        f"({node.kind}, slot {node.slot}, parent {node.parent}{chain})",
        f"stage E{node.stage} · d={depth} · position {node.position} (+{rel})",
        f"candidate {_describe(node.token, vocab)} (input {node.input_token})",
        f"top: {top}",
        f"DECS-masked: {masked}",
    ]
    return f"<b>{plot_text(head)}</b> " + "<br>".join(plot_text(line) for line in lines)


def shown_columns(columns: int) -> int:
    """How many positions the figure opens on: all of them, or those that fit ``MIN_COLUMN_PX`` each."""
    return max(1, min(columns, FIT_PLOT_PX // MIN_COLUMN_PX))


def _layout_cells(view: RoundView, window: int, columns: int):
    """Per node: (x, y, marker size, the width and height in px of its place on the grid) with same-cell
    nodes on a grid, in slot order."""
    cells: dict[tuple[int, int], list[NodeRecord]] = {}
    for node in view.nodes.values():
        rel = node.position - view.commit_position
        if rel < window:
            cells.setdefault((rel, node.stage), []).append(node)
    cell_w, cell_h = FIT_PLOT_PX / (shown_columns(columns) + 0.2), stage_height(view.num_stages)
    place = {}
    for (rel, stage), members in cells.items():
        members.sort(key=lambda n: (n.slot, n.id))
        cols = math.ceil(math.sqrt(len(members)))
        rows = math.ceil(len(members) / cols)
        size = max(7.0, min(34.0, 0.7 * min(cell_w / cols, cell_h / rows)))
        for k, node in enumerate(members):
            r, c = divmod(k, cols)
            dx = (c - (cols - 1) / 2) * (0.8 / cols)
            dy = (r - (rows - 1) / 2) * (0.76 / rows)
            place[node.id] = (rel + dx, stage + dy, size, 0.8 * cell_w / cols, 0.76 * cell_h / rows)
    return place


def fitted_labels(view: RoundView, place: dict, status: dict[int, str], px_x: float) -> dict[int, str]:
    """Each node's label (plain text): its token text where it fits its place on the grid (cut with "…"
    where only a part does; within the marker where the label is white), none where it would overlap a
    label nearer the anchor. ``px_x``: px per position at ``FIT_PLOT_PX``; labels apart there are apart
    in any wider figure."""
    px_y = stage_height(view.num_stages)
    labels, boxes = {}, []
    order = sorted(place, key=lambda i: (round(place[i][0]), place[i][1], place[i][0]))
    for i in order:
        x, y, size, room_x, room_y = place[i]
        node = view.nodes[i]
        white = STATUS_MARKS[status[i]].ink == WHITE and status[i] not in FADED
        room = size - 2 if white else room_x
        fits = room_y >= LINE_EM * FONT_PX
        text = elide(_label(node.text, node.token), room, FONT_PX) if fits else ""
        labels[i] = text
        boxes.append(label_box(text, x * px_x, y * px_y, FONT_PX) if text else None)
    for i, drawn in zip(order, keep_apart(boxes)):
        labels[i] = labels[i] if drawn else ""
    return labels


def _shown(commit: CommitRecord) -> str:
    return repr(commit.text) if commit.text is not None else str(commit.token)


def title_lines(view: RoundView) -> list[str]:
    """The title as lines of plain text, each fitting the narrowest figure (``wrap``: never cut)."""
    depths = view.start.depths
    parts = [f"Round {view.round}", f"state q={view.state_before}→{view.state_after}"]
    commits = view.commits
    drafted = sum(c.drafted for c in commits)
    if len(commits) == 1:
        c = commits[0]
        k = c.matched_stage
        parts.append(
            f"commit {_shown(c)} matched at stage {k} (d={depths[k]})" + (" (drafted)" if drafted else "")
        )
    elif commits:
        shown = " ".join(_shown(c) for c in commits[:6]) + (" …" if len(commits) > 6 else "")
        parts.append(f"committed {len(commits)} tokens {shown} ({drafted} drafted)")
    return wrap(parts, FIT_PLOT_PX + MARGIN["l"], TITLE_PX)


def _edge_group(node_id: int, new: set[int], kept: set[int]) -> str:
    """Which edge trace the edge into ``node_id`` belongs to (``EDGE_GROUPS``)."""
    if node_id in new:
        return EDGE_GROUPS[0]
    return EDGE_GROUPS[1] if node_id in kept else EDGE_GROUPS[2]


def lattice_figure(view: RoundView, window: int = 32) -> go.Figure:
    """The lattice during one round: one scatter trace per status plus three edge traces (the round's
    new edges and, on a commit round, the kept ones drawn; the others behind a legend toggle) and, with
    chain slots, their edges and frames (line traces, so every marker is a node).

    Only nodes less than ``window`` positions ahead of the anchor are drawn; without draft chains a
    lattice of K stages never reaches further than K - 1 ahead, and a chain reaches its length further
    (8 by default), so the default draws every node (the node-marker count is ``lattice_size(view)``).
    """
    K = len(view.start.depths)
    reach = max((n.position - view.commit_position for n in view.nodes.values()), default=0) + 1
    columns = min(window, max(K, reach))
    groups, edges, boxes = _marks(view, _layout_cells(view, window, columns), columns)
    chained = bool(chain_nodes(view))
    traces = [
        go.Scatter(
            x=xs,
            y=ys,
            mode="lines",
            name=name,
            hoverinfo="skip",
            visible="legendonly" if name == EDGE_GROUPS[2] else True,
            line=CHAIN_EDGE
            if name == CHAIN_EDGES
            else dict(color="#8C8C8C" if name != EDGE_GROUPS[2] else "#C8C8C8", width=1),
        )
        for name, (xs, ys) in edges.items()
        if name in EDGE_GROUPS or chained
    ]
    traces += [_status_trace(s, g) for s, g in groups.items()]
    if chained:
        for gone, group in boxes.items():  # a dropped node's frame fades with it
            xs, ys = frames(group)
            traces.append(
                go.Scatter(
                    x=xs,
                    y=ys,
                    mode="lines",
                    name=CHAIN_FRAMES,
                    hoverinfo="skip",
                    line=CHAIN_LINE,
                    legendgroup="chains",
                    showlegend=not gone,
                    opacity=DISCARDED_OPACITY if gone else 1.0,
                )
            )
    return _laid_out(go.Figure(data=traces), view, columns)


def _marks(view: RoundView, place: dict, columns: int) -> tuple[dict, dict, dict]:
    """Per status, the markers (x, y, size, label, hover); per edge group, its line (x, y with gaps); the chain
    frames of live and of dropped nodes."""
    depths = view.start.depths
    status, vocab = node_statuses(view), token_texts(view)
    new, kept, chained = set(view.new), set(view.kept) | set(view.committed_ids), chain_nodes(view)
    groups = {s: {"x": [], "y": [], "size": [], "text": [], "hover": []} for s in STATUS_MARKS}
    edges: dict[str, tuple[list, list]] = {name: ([], []) for name in (*EDGE_GROUPS, CHAIN_EDGES)}
    px_x, px_y = FIT_PLOT_PX / (shown_columns(columns) + 0.2), stage_height(len(depths))  # px per unit
    labels = fitted_labels(view, place, status, px_x)
    boxes: dict[bool, list] = {False: [], True: []}
    for i, (x, y, size, room_x, room_y) in place.items():
        node, g = view.nodes[i], groups[status[i]]
        for key, value in (("x", x), ("y", y), ("size", size), ("text", plot_text(labels[i]))):
            g[key].append(value)
        g["hover"].append(
            _hover(node, node.position - view.commit_position, depths[node.stage], vocab, i in chained)
        )
        if i in chained:
            half = (min(size / 2 + 3, room_x / 2) / px_x, min(size / 2 + 3, room_y / 2) / px_y)
            boxes[status[i] in FADED].append((x, y, *half))
        parent = node.parent
        if parent in place and node.kind in ("depth", "position", "chain"):
            xs, ys = edges[CHAIN_EDGES if node.kind == "chain" else _edge_group(i, new, kept)]
            px, py, *_ = place[parent]
            xs += [px, x, None]
            ys += [py, y, None]
    return groups, edges, boxes


def _status_trace(status: str, g: dict) -> go.Scatter:
    """One status's nodes; a faded status fades its markers only, its labels stay dark on white."""
    mark, faded = STATUS_MARKS[status], status in FADED
    return go.Scatter(
        x=g["x"],
        y=g["y"],
        mode="markers+text",
        name=status,
        text=g["text"],
        hovertext=g["hover"],
        hovertemplate="%{hovertext}<extra></extra>",
        textposition="middle center",
        textfont=dict(size=FONT_PX, color=DARK if faded else mark.ink),
        marker=dict(
            color=mark.fill,
            size=g["size"],
            symbol=mark.symbol,
            line=dict(color=mark.line, width=mark.width),
            opacity=DISCARDED_OPACITY if faded else 1.0,
        ),
    )


ANCHOR_BAND = dict(  # the anchor's column
    type="rect",
    xref="x",
    yref="paper",
    x0=-0.5,
    x1=0.5,
    y0=0,
    y1=1,
    fillcolor=PALE,
    opacity=0.6,
    line=dict(width=0),
    layer="below",
)


def legend_rows(names: list[str], width_px: float = LEGEND_FIT_PX) -> int:
    """Rows the legend takes under a plot ``width_px`` wide: Plotly puts a horizontal legend in one row when
    it fits, else in columns as wide as its widest entry (a narrower figure pushes its bottom margin)."""
    widths = [LEGEND_ITEM_PX + text_px(name, FONT_PX) for name in names]
    if sum(widths) <= width_px:
        return 1
    return math.ceil(len(widths) / max(1, int(width_px // max(widths))))


def _laid_out(fig: go.Figure, view: RoundView, columns: int) -> go.Figure:
    """The figure's title (its lines), axes (positions ahead of the anchor, opened on ``shown_columns``;
    one row per stage), the legend in rows under the plot and the anchor's band."""
    depths = view.start.depths
    K, shown, lines = len(depths), shown_columns(columns), title_lines(view)
    legend = [t.name for t in fig.data if t.showlegend is not False and t.visible is not False and len(t.x)]
    top = round(TITLE_PAD + LINE_EM * TITLE_PX * len(lines) + 10)
    bottom = MARGIN["b"] + LEGEND_ROW_PX * legend_rows(list(dict.fromkeys(legend)))
    more = f" · +0..+{shown - 1} of +{columns - 1} shown: drag to pan" if shown < columns else ""
    fig.update_layout(
        title=corner_title([plot_text(line) for line in lines], TITLE_PX, TITLE_PAD),
        uirevision="lattice",
        height=round(top + stage_height(K) * K + bottom),
        margin=dict(l=MARGIN["l"], r=MARGIN["r"], t=top, b=bottom),
        plot_bgcolor="white",
        modebar=dict(orientation="v"),  # in the right margin: laid across the top it covered the title
        dragmode="pan" if more else "zoom",
        legend=dict(
            orientation="h",
            traceorder="normal",  # not grouped by the chain frames' group: that stacks every entry
            font=dict(size=FONT_PX),
            x=0,
            xanchor="left",
            y=-MARGIN["b"] / (stage_height(K) * K),  # under the axis title
            yanchor="top",
            tracegroupgap=0,
        ),
        xaxis=dict(
            title=dict(text="position relative to the anchor" + more),
            tickvals=list(range(columns)),
            ticktext=[f"+{j}" for j in range(columns)],
            range=[-0.6, shown - 0.4],
            showgrid=False,
            zeroline=False,
        ),
        yaxis=dict(
            tickvals=list(range(K)),
            ticktext=[stage_tick(k, depths) for k in range(K)],
            range=[K - 0.5, -0.5],
            showgrid=False,
            zeroline=False,
            fixedrange=True,
        ),
        shapes=[ANCHOR_BAND],
    )
    return fig
