"""The timeline's opening window (issue 64): a crowded run opens at its first positions, fitted so that no two node
markers overlap at the nominal plot width, with the rest a pan or zoom away; a short run opens whole; the zoom runs
along x, and a run drawn again keeps the visitor's zoom where another run does not."""

from dex_core import DexDecoder
from dex_core.testing import tiny_tokenizer
from visualize import lattice_graph, timeline_figure
from visualize.timeline import MIN_MARK_PX, PLOT_WIDTH_PX, plot_height, y_units

FATES = ("matched", "final", "committed", "discarded", "cut", "pending")


def marker_boxes(fig, K: int) -> list[tuple[float, float, float, float]]:
    """The node markers inside the figure's opening x range, as px boxes at ``PLOT_WIDTH_PX``."""
    x0, x1 = fig.layout.xaxis.range
    px_x, px_y = PLOT_WIDTH_PX / (x1 - x0), plot_height(K) / y_units(K)
    boxes = []
    for trace in fig.data:
        if trace.name in FATES:
            for x, y, size in zip(trace.x, trace.y, trace.marker.size):
                if x0 <= x <= x1:
                    cx, cy, half = x * px_x, y * px_y, size / 2
                    boxes.append((cx - half, cy - half, cx + half, cy + half))
    return boxes


def overlap(a, b) -> float:
    w, h = min(a[2], b[2]) - max(a[0], b[0]), min(a[3], b[3]) - max(a[1], b[1])
    return max(w, 0) * max(h, 0) / min((a[2] - a[0]) ** 2, (b[2] - b[0]) ** 2)


def test_a_crowded_run_opens_at_its_first_positions_with_no_two_markers_overlapping(chains):
    fig = timeline_figure(chains)
    positions = [n["position"] for _, n in lattice_graph(chains).nodes(data=True)]
    x0, x1 = fig.layout.xaxis.range
    assert x0 < min(positions) < x1 < max(positions)  # the first positions; the rest by pan or zoom
    boxes = marker_boxes(fig, K=4)
    assert len(boxes) > 100 and all(b[2] - b[0] >= MIN_MARK_PX for b in boxes)
    worst = max(overlap(a, b) for i, a in enumerate(boxes) for b in boxes[i + 1 :])
    assert worst == 0, worst


def test_a_short_run_opens_whole_and_only_the_same_run_keeps_the_visitors_zoom(llama, chains):
    trace = (
        DexDecoder(llama, explorers=2, tokenizer=tiny_tokenizer(), draft="none")
        .generate([1, 2, 3, 4], 6, node_text=True)
        .trace
    )
    short = timeline_figure(trace)
    assert short.layout.xaxis.range is None  # plotly's autorange: every position
    fig = timeline_figure(chains)
    assert timeline_figure(chains).layout.uirevision == fig.layout.uirevision != short.layout.uirevision


def test_the_zoom_runs_along_x_and_the_axis_says_how(chains):
    fig = timeline_figure(chains)
    assert fig.layout.dragmode == "zoom" and fig.layout.yaxis.fixedrange is True
    assert "drag: zoom" in fig.layout.xaxis.title.text and "shift-drag: pan" in fig.layout.xaxis.title.text
