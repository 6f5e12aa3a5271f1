"""Text the panels and figures keep whole (issue 64's "a page that shows all it prints"), as drawn here, without a
browser: the depth view's title in lines that fit a hidden tab's figure and its stage labels beside the heatmap, not
on it; the comparison's legend naming each run in full, in lines, with room under the plot; stage labels readable
on every stage colour; and no panel that hides what overflows it. ``tests/browser/test_browser_layout.py`` checks the
page as laid out at three widths."""

from pathlib import Path

import pytest

from dex_core.trace.files import load_trace
from visualize import fsm_html, replay, round_table_html, tokens_html
from visualize.charts import DEPTH_FIT_PX, DEPTH_TITLE_PX, STAGE_LABEL_PX, depth_figure
from visualize.compare import AXIS_PX, LEGEND_FONT_PX, LEGEND_LINE_PX, RunSide, compare_figure, run_label
from visualize.fit import text_px
from visualize.markup import plot_text
from visualize.palette import OKABE_ITO, READABLE, contrast, ink_on

EXAMPLE = Path(__file__).resolve().parents[2] / "assets" / "traces" / "example.json"


@pytest.fixture(scope="module")
def example():
    """The bundled trace's rounds (K = 4, draft chains: rounds that commit several tokens), read, not run."""
    return replay(load_trace(EXAMPLE)[0])


def lens_view(layers: int, tokens: int) -> dict:
    """A depth view (``dex_core.model.lens.depth_view``'s keys) of ``tokens`` tokens, each the top from layer 3."""
    return {
        "num_layers": layers,
        "tokens": list(range(tokens)),
        "adapter_depths": [9, 18, 27],
        "prob": [[0.1 * (layer >= 2) for layer in range(layers)] for _ in range(tokens)],
        "rank": [[0 if layer >= 2 else 5 for layer in range(layers)] for _ in range(tokens)],
        "top": [[[(0, 0.5)] for _ in range(layers)] for _ in range(tokens)],
    }


def test_the_depth_views_title_fits_a_hidden_tabs_figure_and_its_stage_labels_sit_beside_the_heatmap():
    depths = (9, 18, 27)
    fig = depth_figure(lens_view(30, 6), {}, depths)
    lines = fig.layout.title.text.split("<br>")
    assert lines[-1] == "dashed lines: the explored depths" and "adapters at 9, 18, 27)" in " ".join(lines)
    assert all(text_px(line, DEPTH_TITLE_PX) <= DEPTH_FIT_PX for line in lines), lines
    labels = fig.layout.annotations
    assert [a.text.split("</span> ")[1] for a in labels] == [
        "E0 · d=9 ends",
        "E1 · d=18 ends",
        "E2 · d=27 ends",
    ]
    assert all(a.xref == "paper" and a.x == 1 and a.xanchor == "left" for a in labels)  # right of the plot
    assert fig.layout.margin.r >= text_px("■ E2 · d=27 ends", STAGE_LABEL_PX)  # and room for them there


def test_the_comparisons_legend_names_each_run_whole_in_lines_with_room_under_the_plot(example):
    sides = [
        RunSide("A", "bundled trace 'example'", example[-1], {}, "eos"),
        RunSide("B", "loaded 'a-trace-file-with-a-long-name.json'", example[-2], {}, None),
    ]
    fig = compare_figure(sides)
    for bar, side in zip(fig.data, sides):
        lines = bar.name.split("<br>")
        assert " ".join(lines) == plot_text(f"run {side.name}: {run_label(side)}")  # never cut
        assert len(lines) > 1 and all(text_px(line, LEGEND_FONT_PX) <= LEGEND_LINE_PX for line in lines)
    assert fig.layout.legend.yref == "container" and fig.layout.legend.y == 0  # at the figure's bottom
    lines = max(len(bar.name.split("<br>")) for bar in fig.data)
    assert fig.layout.margin.b >= AXIS_PX + lines * LEGEND_FONT_PX


def test_every_stage_colour_carries_its_labels_at_wcag_aa_contrast():
    for colour in OKABE_ITO:
        assert contrast(ink_on(colour), colour) >= READABLE, colour
    assert round(contrast("#FFFFFF", "#000000"), 1) == 21 and contrast("#777777", "#777777") == 1


def test_no_panel_hides_text_that_overflows_it_and_the_text_box_opens_at_its_end(example):
    views = example
    several = next(v for v in views if len(v.commits) > 1)
    html = "".join(f(view) for view in (views[1], several, views[-1]) for f in (fsm_html, round_table_html))
    html += tokens_html(views[-1])
    assert "overflow: hidden" not in html and "text-overflow" not in html and "overflow-x: auto" in html
    assert "flex-direction: column-reverse" in tokens_html(views[-1])  # a long text shows its last line
