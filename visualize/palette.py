"""The one palette of ``visualize``: stage colours, and the neutral marks of node status and fate.

A colour names a stage's depth, nothing else. Stages take the Okabe–Ito set (Okabe & Ito, *Color
Universal Design*, 2008), which stays distinguishable under the common colour-vision deficiencies, in
order of depth: a stage at depth d of a model of L layers takes the colour at d/L along the set
(``stage_colors``), so the final layer is always black and depth 18 of 30 has one colour at K = 2, 4
or 8; only two stages of one run that would share a colour are moved apart, to the nearest free ones,
in depth order. A stage has its colour everywhere it is coloured: the streamed text, the matched-stage
histogram, the FSM panel and the stage labels of the lattice and timeline figures, each naming the
stage's depth (``E<stage> · d=<depth>``). Eight colours cover the app's K = 1..8; a larger K reuses
them in stage order.

Everything else is drawn in greys, which no stage uses: a node's status in one round and its fate
over the run are a ``Mark`` (fill shade, outline, symbol), readable without colour vision and
without a legend's colour chips; collapse cuts, the current-round band, compared runs and chart
series are greys and dash patterns too. A draft chain's nodes are framed by a dotted outline over
whatever status or fate they have (``CHAIN_LINE``), and a chain's edges are dashed (``CHAIN_EDGE``).
"""

from __future__ import annotations

from dataclasses import dataclass

from .markup import esc

OKABE_ITO = ("#E69F00", "#56B4E9", "#009E73", "#F0E442", "#0072B2", "#D55E00", "#CC79A7", "#000000")
INK, DARK, MID, LIGHT, PALE, WHITE = "#1F1F1F", "#4D4D4D", "#7A7A7A", "#B4B4B4", "#E6E6E6", "#FFFFFF"
# The HTML panels' secondary text: the page theme's subdued text (which the app's stylesheet makes read, in its
# light and dark themes alike), else (an exported page) a grey of 5.5:1 on white; WCAG AA asks 4.5:1.
NOTE = "var(--body-text-color-subdued, #5F6B6D)"
READABLE = 4.5  # WCAG AA's least contrast for text under 18 px
GREY = "#BBBBBB"  # discarded nodes (drawn faded)


@dataclass(frozen=True)
class Mark:
    """How a node of one status or fate is drawn: fill, outline colour and width, Plotly symbol, and
    the colour of a label drawn on it."""

    fill: str
    line: str
    width: float
    symbol: str
    ink: str = INK


STATUS_MARKS = {  # a node during one round (``lattice.node_statuses``)
    "anchor": Mark(WHITE, INK, 2.5, "square"),  # the anchor slot's nodes while its token is pending
    "pending": Mark(PALE, MID, 1, "square"),  # other live speculative nodes
    "accepted": Mark(
        DARK, INK, 1, "square", WHITE
    ),  # commit round: the matched anchor node and the kept subtree
    "discarded": Mark(GREY, MID, 1, "square"),  # dropped by this round's collapse (drawn faded)
    "final": Mark(LIGHT, INK, 2.5, "diamond-wide"),  # commit round: the anchor's final-stage reference node
    "cut": Mark(GREY, MID, 1, "x"),  # a chain node dropped: the slot before it proposed another token
}
FATE_MARKS = {  # a node over the whole run (``graph.FATES``)
    "matched": Mark(DARK, INK, 1, "square"),
    "final": Mark(LIGHT, INK, 1.5, "diamond-wide"),
    "committed": Mark(WHITE, INK, 1.5, "circle"),
    "discarded": Mark(GREY, MID, 0.5, "circle"),
    "cut": Mark(GREY, MID, 0.5, "x"),
    "pending": Mark(PALE, MID, 1, "circle"),
}
CHAIN_LINE = dict(color=INK, width=1.5, dash="dot")  # the frame around every node of a draft-chain slot
CHAIN_EDGE = dict(color=MID, width=1.5, dash="dash")  # a chain's edges, along the token axis
STATUS_COLORS = {name: mark.fill for name, mark in STATUS_MARKS.items()}
FATE_COLORS = {name: mark.fill for name, mark in FATE_MARKS.items()}
CUT_COLOR = DARK  # collapses drawn as cuts in the timeline
RUN_COLORS = (DARK, "#767676")  # run A and run B of a comparison (white text reads on both)
CURRENT_ROUND_COLOR = (
    "#BFBFBF"  # the band over the round the Debugger shows, on the timeline (at half opacity)
)
SERIES = (
    (DARK, "solid", "circle"),
    (MID, "dot", "square"),
    (LIGHT, "dashdot", "diamond"),
    (INK, "dash", "x"),
)
"""A chart's non-stage series in order: (colour, dash, marker symbol)."""


def frames(boxes) -> tuple[list, list]:
    """The x and y of one line trace drawing a rectangle per box ``(x, y, half width, half height)``, in
    data units, with ``None`` between rectangles (how the chain frames are drawn)."""
    xs, ys = [], []
    for x, y, w, h in boxes:
        xs += [x - w, x + w, x + w, x - w, x - w, None]
        ys += [y - h, y - h, y + h, y + h, y - h, None]
    return xs, ys


def _ideal(depth: int, layers: int) -> int:
    """The palette index of depth ``depth`` of ``layers``: d/L along the set (the final layer: the last)."""
    return min(len(OKABE_ITO) - 1, max(0, round(len(OKABE_ITO) * depth / max(layers, 1)) - 1))


def stage_colors(depths) -> list[str]:
    """One colour per stage, from the stage's depth (``depths`` end at the model's layer count): indices
    rise with depth, each at its ideal place where it is free, else the nearest free one in order."""
    depths = [int(d) for d in depths]
    n = len(OKABE_ITO)
    if len(depths) > n:
        return [OKABE_ITO[k % n] for k in range(len(depths))]
    place = []
    for d in depths:  # rising: never below the previous stage's place + 1
        place.append(max(_ideal(d, depths[-1]), place[-1] + 1 if place else 0))
    for k in range(len(place) - 1, -1, -1):  # and room left for the deeper stages
        place[k] = min(place[k], n - len(place) + k, place[k + 1] - 1 if k + 1 < len(place) else n - 1)
    return [OKABE_ITO[i] for i in place]


def stage_color(stage: int, depths) -> str:
    """The colour of stage ``stage`` of a run exploring ``depths`` (``stage_colors``)."""
    return stage_colors(depths)[int(stage)]


def luminance(colour: str) -> float:
    """WCAG's relative luminance of ``#RRGGBB``: 0 for black, 1 for white."""
    channels = [int(colour[i : i + 2], 16) / 255 for i in (1, 3, 5)]
    r, g, b = [c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in channels]
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def contrast(a: str, b: str) -> float:
    """WCAG's contrast ratio of two colours, 1 (the same) to 21 (black on white)."""
    hi, lo = sorted((luminance(a), luminance(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


def ink_on(colour: str) -> str:
    """The text colour that reads best on ``colour`` (a stage's): white or black, whichever has the higher
    contrast; on every Okabe–Ito colour that is at least ``READABLE`` (#1F1F1F on vermilion would not be)."""
    return WHITE if contrast(WHITE, colour) >= contrast("#000000", colour) else "#000000"


def stage_tick(stage: int, depths) -> str:
    """A figure's stage label: a square in the stage's colour, then ``E<stage> · d=<depth>``
    (Plotly text: the values are numbers, formatted here, so nothing from a trace reaches markup)."""
    colour, depth = stage_color(stage, depths), int(depths[int(stage)])
    return f"<span style='color:{colour}'>■</span> E{int(stage)} · d={depth}"


def stage_legend_html(depths, label: str = "matched at") -> str:
    """The stage key: ``label``, then one chip per stage in its colour, named as the figures name it
    (``E<stage> · d=<depth>``); a chip never breaks across lines, so K = 8 keys wrap between chips."""
    keys = "".join(
        f'<span class="dex-key" style="background: {colour}; color: {ink_on(colour)}; '
        f"padding: 0 6px; margin: 0 6px 2px 0; border-radius: 3px; display: inline-block; "
        f'white-space: nowrap;">E{k} · d={esc(d)}</span>'
        for k, (d, colour) in enumerate(zip(depths, stage_colors(depths)))
    )
    return (
        f"<div class='dex-legend' style='margin-top: 6px; font-size: 12px;'>"
        f"<span style='margin-right: 6px;'>{esc(label)}:</span>{keys}</div>"
    )
