"""Text that fits: the width of a label in pixels, labels cut to a width (the rest on hover), labels
kept apart, and titles broken into lines instead of cut.

Plotly draws a figure's text at a fixed font size whatever the figure's width, and neither wraps a
title nor moves a label off another one. So the figures fit their text here, for the narrowest width
the app draws them at: a wider figure only leaves more room. Widths are estimates of a proportional
font (``CHAR_EM`` of the font size a character, twice that for wide East Asian characters), on the
safe side for Latin text.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass

CHAR_EM = 0.62  # an average character's width in ems (Open Sans, Arial: about 0.55), on the safe side
LINE_EM = 1.25  # a line's height in ems
ELLIPSIS = "…"


def text_px(text: str, font_px: float) -> float:
    """The estimated width of ``text`` drawn at ``font_px``."""
    wide = sum(unicodedata.east_asian_width(ch) in ("W", "F") for ch in text)
    return (len(text) + wide) * CHAR_EM * font_px


def elide(text: str, room_px: float, font_px: float, least: int = 2) -> str:
    """``text`` if it fits in ``room_px``, else its start and "…" that fit (at least ``least`` characters
    of it), else the empty string (hover shows the text)."""
    if text_px(text, font_px) <= room_px:
        return text
    for n in range(len(text) - 1, least - 1, -1):
        cut = text[:n].rstrip() + ELLIPSIS
        if text_px(cut, font_px) <= room_px:
            return cut
    return ""


@dataclass(frozen=True)
class Box:
    """A label's box in pixels: centre and half extents."""

    x: float
    y: float
    half_w: float
    half_h: float

    def overlaps(self, other: Box) -> bool:
        return abs(self.x - other.x) < self.half_w + other.half_w and abs(self.y - other.y) < (
            self.half_h + other.half_h
        )


def label_box(text: str, x_px: float, y_px: float, font_px: float) -> Box:
    """The box of ``text`` drawn centred at (``x_px``, ``y_px``)."""
    return Box(x_px, y_px, text_px(text, font_px) / 2, LINE_EM * font_px / 2)


def keep_apart(boxes: list[Box | None]) -> list[bool]:
    """Which labels to draw, in order of priority (first kept first): each one whose box overlaps no kept
    box. ``None``: no label."""
    kept: dict[int, list[Box]] = {}  # by column of 40 px: a box is checked against its neighbours only
    out = []
    for box in boxes:
        if box is None:
            out.append(False)
            continue
        lo, hi = int((box.x - box.half_w) // 40), int((box.x + box.half_w) // 40)
        near = [b for col in range(lo - 1, hi + 2) for b in kept.get(col, ())]
        free = not any(box.overlaps(b) for b in near)
        if free:
            for col in range(lo, hi + 1):
                kept.setdefault(col, []).append(box)
        out.append(free)
    return out


def _pieces(word: str, width_px: float, font_px: float) -> list[str]:
    """``word`` in pieces no wider than ``width_px`` (one piece when it fits)."""
    pieces, piece = [], ""
    for ch in word:
        if piece and text_px(piece + ch, font_px) > width_px:
            pieces.append(piece)
            piece = ""
        piece += ch
    return pieces + [piece]


def wrap(parts: list[str], width_px: float, font_px: float, joiner: str = " · ") -> list[str]:
    """Lines of ``parts`` joined by ``joiner``, each at most ``width_px`` wide; a part too long for a line
    is broken at spaces, or anywhere when a word alone is too long (never cut)."""
    lines, line = [], ""
    for k, part in enumerate(parts):
        words = [p for word in part.split(" ") for p in _pieces(word, width_px, font_px)]
        for j, word in enumerate(words):
            sep = (joiner if j == 0 else " ") if line else ""
            if line and text_px(line + sep + word, font_px) > width_px:
                lines.append(line + (joiner.rstrip() if j == 0 and k else ""))
                line, sep = "", ""
            line += sep + word
    return lines + ([line] if line else [])


def corner_title(lines: list[str], font_px: float, top_px: float) -> dict:
    """A Plotly title of ``lines`` (plot text already) at the figure's top left, the lines under each other,
    ``top_px`` below the figure's edge (Plotly sets a title of several lines ~10 px higher than one)."""
    return dict(
        text="<br>".join(lines),
        font=dict(size=font_px),
        x=0,
        xanchor="left",
        y=1,
        yref="container",
        yanchor="top",
        pad=dict(l=8, t=top_px),
    )
