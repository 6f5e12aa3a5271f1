"""The one palette of ``visualize``: stage colours, node status and fate colours, and the stage legend.

Every colour is from the Okabe–Ito set (Okabe & Ito, *Color Universal Design*, 2008), which stays
distinguishable under the common colour-vision deficiencies. A stage (an explorer) has the same
colour everywhere it is coloured: the streamed text, the matched-stage histogram, the FSM panel and
the stage labels of the lattice and timeline figures. Eight colours cover the app's K = 1..8; a
larger K reuses them in order.
"""

from __future__ import annotations

from .markup import esc

OKABE_ITO = ("#E69F00", "#56B4E9", "#009E73", "#F0E442", "#0072B2", "#D55E00", "#CC79A7", "#000000")
_DARK = frozenset({"#009E73", "#0072B2", "#D55E00", "#CC79A7", "#000000"})  # white text reads better on these
GREY = "#BBBBBB"

STATUS_COLORS = {                # a node during one round (``lattice.node_statuses``)
    "anchor": "#E69F00",         # the anchor slot's nodes while its token is pending
    "pending": "#56B4E9",        # other live speculative nodes
    "accepted": "#009E73",       # commit round: the matched anchor node and the kept subtree
    "discarded": GREY,           # dropped by this round's collapse (drawn faded)
    "final": "#CC79A7",          # commit round: the anchor's final-stage reference node
}
FATE_COLORS = {                  # a node over the whole run (``graph.FATES``)
    "matched": "#009E73", "final": "#CC79A7", "committed": "#E69F00", "discarded": GREY, "pending": "#56B4E9",
}
CUT_COLOR = "#D55E00"            # collapses drawn as cuts in the timeline
RUN_COLORS = ("#0072B2", "#E69F00")  # run A and run B of a comparison
CURRENT_ROUND_COLOR = "#F0E442"  # the band over the round the Debugger shows, on the timeline


def stage_color(stage: int) -> str:
    return OKABE_ITO[int(stage) % len(OKABE_ITO)]


def stage_ink(stage: int) -> str:
    """A text colour that reads on ``stage_color(stage)``."""
    return "#ffffff" if stage_color(stage) in _DARK else "#1b2631"


def stage_tick(stage: int, depth: int) -> str:
    """A figure's stage label: a square in the stage's colour, then ``E<stage> · d=<depth>``
    (Plotly text: the values are numbers, formatted here, so nothing from a trace reaches markup)."""
    return f"<span style='color:{stage_color(stage)}'>■</span> E{int(stage)} · d={int(depth)}"


def stage_legend_html(depths, label: str = "matched at") -> str:
    """One key per stage: its colour, its name and its depth."""
    keys = "".join(f"<span class=\"dex-key\" style=\"background: {stage_color(k)}; color: {stage_ink(k)}; "
                   f"padding: 0 6px; margin-right: 6px; border-radius: 3px;\">{esc(label)} E{k} (depth {esc(d)})</span>"
                   for k, d in enumerate(depths))
    return f"<div class='dex-legend' style='margin-top: 6px; font-size: 12px;'>{keys}</div>"
