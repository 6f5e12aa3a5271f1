"""The logit-lens depth view: every layer's probability and rank of the committed token, and its heatmap."""

from dex_core import ar_generate
from dex_core.analysis.ead import layer_matches
from dex_core.model.adapters import new_adapters
from dex_core.model.lens import depth_view, layer_candidates
from dex_core.testing import tiny_model, tiny_tokenizer
from visualize.charts import depth_figure


def test_the_depth_view_agrees_with_the_rankings_and_marks_the_stable_layer():
    model = tiny_model("llama").double()
    adapters = new_adapters(model.float(), [2, 4])
    model = model.float()
    prompt = [3, 8, 13]
    tokens = ar_generate(model, prompt, 10).tokens
    view = depth_view(model, prompt, tokens, adapters, top=3)
    cands = layer_candidates(model, prompt, tokens, adapters, top=3)
    assert view["num_layers"] == 6 and view["adapter_depths"] == [2, 4] and len(view["prob"]) == 10
    for t in range(10):
        assert view["rank"][t][-1] == 0  # greedy: the last layer's top token is the committed one
        for layer in range(6):
            top = [c for c, _ in view["top"][t][layer]]
            assert top == cands[t, layer].tolist()
            assert (view["rank"][t][layer] == 0) == bool(
                layer_matches(model, prompt, tokens, adapters)[t, layer]
            )
            assert 0 <= view["prob"][t][layer] <= view["top"][t][layer][0][1] + 1e-4
    texts = {i: tiny_tokenizer().decode([i]) for i in range(96)}
    fig = depth_figure(view, texts, depths=(2, 4, 6))
    heat, stable = fig.data
    assert len(heat.z) == 6 and len(heat.z[0]) == 10
    assert list(stable.y) == [
        next(layer + 1 for layer in range(6) if all(r == 0 for r in view["rank"][t][layer:]))
        for t in range(10)
    ]
    assert "top:" in heat.text[0][0] and len(fig.layout.shapes) == 3
    order = layer_candidates(model, prompt, tokens, adapters, top=96)  # (T, L, 96): every token, best first
    ranks = [
        [order[t, layer].tolist().index(tokens[t]) for t in range(10)] for layer in range(6)
    ]  # (layer, token)
    assert any(r > 0 for row in ranks for r in row)  # lower layers rank the committed token below the top
    by_rank = depth_figure(view, texts, metric="rank").data[0]
    assert [list(row) for row in by_rank.z] == ranks and by_rank.zmax == min(50, max(map(max, ranks)))


def test_the_depth_view_carries_both_colourings_so_a_page_can_switch_without_the_server():
    view = {
        "num_layers": 3,
        "tokens": [5, 6],
        "adapter_depths": [],
        "prob": [[0.1, 0.5, 0.9], [0.2, 0.3, 0.8]],
        "rank": [[7, 1, 0], [3, 0, 0]],
        "top": [[[(5, 0.9)]] * 3] * 2,
    }
    texts = {5: "a", 6: "b"}
    figures = {m: depth_figure(view, texts, depths=(1,), metric=m) for m in ("prob", "rank")}
    for metric, fig in figures.items():
        heat = fig.data[0]
        for other in figures.values():  # either figure holds what the other one draws
            colouring = other.layout.meta["colourings"][metric]
            assert colouring["z"] == [[list(row) for row in heat.z]] and colouring["zmax"] == [heat.zmax]
            assert colouring["reversescale"] == [bool(heat.reversescale)]
            assert colouring["colorbar.title.text"] == [heat.colorbar.title.text]
    assert list(figures["rank"].data[0].z[0]) == [7, 3] and figures["rank"].data[0].zmax == 7
    dots = figures["prob"].data[1]
    assert "white dot" in dots.name and "top candidate" in dots.name and figures["prob"].layout.showlegend
    assert list(dots.y) == [3, 2] and "E0 · d=1 ends" in figures["prob"].layout.annotations[0].text
