"""The trace viewers: replay, lattice figure, HTML panels and charts, on real tiny-model traces."""

import dataclasses
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest
from helpers import long_chain_trace

from dex_core import DexDecoder, ar_generate
from dex_core.testing import tiny_model, tiny_tokenizer
from dex_core.trace.events import RoundEvent, parse_events
from dex_core.trace.files import load_trace
from visualize import (
    FATE_COLORS,
    OKABE_ITO,
    STATUS_COLORS,
    ead_figure,
    export_graph,
    fsm_html,
    lattice_figure,
    lattice_graph,
    lattice_size,
    node_status,
    palette,
    race_figure,
    race_summary_html,
    replay,
    round_table_html,
    run_report_html,
    speedup_figure,
    stage_color,
    stats_html,
    status_html,
    timeline_figure,
    tokens_html,
)
from visualize.lattice import EDGE_GROUPS


@pytest.fixture(scope="module")
def greedy(llama):
    return (
        DexDecoder(llama, explorers=4, tokenizer=tiny_tokenizer(), trace_top=5, prune="none", draft="none")
        .generate([1, 2, 3, 4], 16, node_text=True)
        .trace
    )


@pytest.fixture(scope="module")
def sampled(llama):
    decoder = DexDecoder(llama, explorers=4, tokenizer=tiny_tokenizer(), trace_top=5, draft="none")
    return decoder.generate([1, 2, 3, 4], 16, temperature=0.8, seed=1, node_text=True).trace


@pytest.fixture(scope="module")
def deep():
    decoder = DexDecoder(
        tiny_model("llama", layers=8), explorers=8, tokenizer=tiny_tokenizer(), trace_top=5, prune="none"
    )
    return decoder.generate([1, 2, 3, 4], 2, node_text=True).trace


@pytest.fixture(params=["greedy", "sampled", "chains", "cut_chains"])
def trace(request):
    return request.getfixturevalue(request.param)


def node_markers(fig) -> dict[str, int]:
    return {t.name: len(t.x) for t in fig.data if "markers" in t.mode}


def first_commit_with(views, predicate):
    return next(v for v in views if v.commit and predicate(v))


class Spans(HTMLParser):
    """Every ``<span>`` of an HTML fragment as (class, style as a dict, text), innermost first."""

    def __init__(self, html: str):
        super().__init__()
        self.spans, self._open = [], []
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        if tag == "span":
            attrs = dict(attrs)
            style = dict(
                map(str.strip, part.split(":", 1))
                for part in (attrs.get("style") or "").split(";")
                if ":" in part
            )
            self._open.append((attrs.get("class"), style, []))

    def handle_data(self, data):
        if self._open:
            self._open[-1][2].append(data)

    def handle_endtag(self, tag):
        if tag == "span" and self._open:
            cls, style, text = self._open.pop()
            self.spans.append((cls, style, "".join(text)))


def test_replay_rebuilds_the_committed_tokens_of_the_end_event(trace):
    views = replay(trace)
    end = trace[-1]
    assert len(views) == end.stats.rounds
    assert views[-1].tokens == end.tokens
    assert views[-1].matched == end.stats.matched_stages
    assert [v.index for v in views] == list(range(len(views)))


def test_replay_holds_the_lattice_before_collapse(trace):
    pruned = (
        trace[0].prune is not None
    )  # the sampled fixture runs with the CPU default, one new branch a round
    assert pruned == (trace[0].sampling["temperature"] > 0)
    for view in replay(trace):
        if view.commit:
            assert lattice_size(view) == len(view.committed_ids) + len(view.kept) + len(view.dropped) + len(
                view.cut
            )
        elif any(n.kind == "chain" for n in view.nodes.values()):  # draft chains add slots to the lattice
            assert lattice_size(view) > 2**view.state_after - 1 or view.cut
        elif pruned:  # a full lattice at state q holds 2^q - 1 nodes; pruning leaves out branches
            assert lattice_size(view) <= 2**view.state_after - 1
        else:
            assert lattice_size(view) == 2**view.state_after - 1
        assert set(view.new) <= set(view.nodes)
        assert sorted(i for batch in view.batches for i in batch) == sorted(view.new)


def test_commit_position_is_prompt_length_plus_tokens_committed_before(greedy):
    for view in replay(greedy):
        before = len(view.tokens) - (1 if view.commit else 0)
        assert view.commit_position == len(greedy[0].prompt) + before
        if view.commit:
            assert view.commit.position == view.commit_position


def test_anchor_chains_carry_each_stage_candidate_and_its_text(greedy):
    view = replay(greedy)[-1]
    assert len(view.anchor_chains) == len(view.tokens)
    for chain, token, stage in zip(view.anchor_chains, view.tokens, view.matched):
        assert len(chain) == 4 and chain[-1][0] == token and chain[stage][0] == token
        assert all(text == f"w{cand - 7}" for cand, text in chain if cand >= 7)


def test_lattice_figure_draws_one_marker_per_node_in_one_trace_per_status(trace):
    for view in replay(trace):
        fig = lattice_figure(view)
        markers = node_markers(fig)
        assert sorted(markers) == sorted(STATUS_COLORS)
        assert sum(markers.values()) == lattice_size(view)
        assert {t.name for t in fig.data} >= set(EDGE_GROUPS)
        assert fig.layout.uirevision == "lattice"


def test_commit_round_marks_final_accepted_and_discarded_nodes(trace):
    views = replay(trace)
    view = first_commit_with(views, lambda v: v.commit.matched_stage < 3 and v.dropped)
    for c in view.commits:  # a round along a draft chain commits several tokens
        final, matched = c.anchor_nodes[-1], c.anchor_nodes[c.matched_stage]
        assert node_status(view, final) == "final"
        assert node_status(view, matched) == ("final" if matched == final else "accepted")
    assert all(node_status(view, i) == "accepted" for i in view.kept)
    assert all(node_status(view, i) == "discarded" for i in view.dropped)
    fig = lattice_figure(view)
    by_name = {t.name: t for t in fig.data}
    assert len(by_name["final"].x) == len(view.commits) and len(by_name["discarded"].x) == len(view.dropped)
    assert by_name["discarded"].marker.opacity == pytest.approx(
        0.25
    )  # the marker fades, its label stays dark
    assert by_name["discarded"].textfont.color == palette.DARK and by_name["discarded"].opacity is None
    assert by_name["accepted"].marker.opacity == 1
    for status, color in STATUS_COLORS.items():
        assert by_name[status].marker.color == color
    assert f"matched at stage {view.commit.matched_stage}" in fig.layout.title.text


def test_pending_rounds_mark_the_anchor_slot_and_pending_nodes(greedy):
    view = next(v for v in replay(greedy) if not v.commit and v.state_after == 3)
    statuses = {i: node_status(view, i) for i in view.nodes}
    assert sorted(i for i, s in statuses.items() if s == "anchor") == sorted(
        i for i, n in view.nodes.items() if n.position == view.commit_position
    )
    assert list(statuses.values()).count("anchor") == 3 and list(statuses.values()).count("pending") == 4


def test_lattice_axes_label_relative_positions_and_stage_depths(greedy):
    view = replay(greedy)[5]
    fig = lattice_figure(view)
    depths = greedy[0].depths
    assert list(fig.layout.xaxis.ticktext)[:2] == ["+0", "+1"]
    for k, (tick, d) in enumerate(zip(fig.layout.yaxis.ticktext, depths)):
        assert tick == f"<span style='color:{stage_color(k, depths)}'>■</span> E{k} · d={d}"
    anchor = [t for t in fig.data if t.name == "anchor"][0]
    assert all(-0.5 < x < 0.5 for x in anchor.x)


def test_k8_lattice_of_255_nodes_renders_every_node(deep):
    views = replay(deep)
    assert views[-1].tokens == deep[-1].tokens
    full = max(views, key=lattice_size)
    assert lattice_size(full) == 255
    fig = lattice_figure(full)
    assert sum(node_markers(fig).values()) == 255
    assert len(fig.layout.yaxis.ticktext) == 8
    cells = {}
    for t in fig.data:
        if "markers" in t.mode:
            cells.update({(round(x, 6), round(y, 6)): 1 for x, y in zip(t.x, t.y)})
    assert len(cells) == 255


def test_tokens_html_has_one_span_per_token_and_escapes_markup(greedy):
    view = replay(greedy)[-1]
    html = tokens_html(replay(greedy))
    assert html.count('class="dex-tok"') == len(view.tokens)
    assert "white-space: pre-wrap" in html
    matched = [e.commit.matched_stage for e in greedy if isinstance(e, RoundEvent) and e.commit]
    assert len(set(matched)) > 1  # the run shows several colours
    spans = Spans(html).spans
    shown = [(style["background"], text) for cls, style, text in spans if cls == "dex-tok"]
    depths = greedy[0].depths
    assert shown == [
        (stage_color(k, depths), tiny_tokenizer().decode([t])) for k, t in zip(matched, view.tokens)
    ]
    keys = [(style["background"], text) for cls, style, text in spans if cls == "dex-key"]
    assert keys == [(stage_color(k, depths), f"E{k} · d={d}") for k, d in enumerate(depths)]
    assert "matched at:</span>" in html
    chain = view.anchor_chains[0]
    first, final = f"d={depths[0]} (E0) &#x27;{chain[0][1]}&#x27; · d=", f"d={depths[3]} (final) &#x27;"
    assert first in html and f"{final}{chain[3][1]}&#x27;" in html  # each stage named by its depth
    evil = dataclasses.replace(view, texts=["<script>"] + view.texts[1:])
    out = tokens_html(evil)
    assert "<script>" not in out and "&lt;script&gt;" in out


def test_fsm_html_shows_states_and_kv_entries_per_explorer(greedy):
    view = first_commit_with(replay(greedy), lambda v: True)
    html = fsm_html(view)
    assert f"q={view.state_before}</b> → <b>q={view.state_after}" in html
    committed = len(greedy[0].prompt) - 1 + len(view.tokens) - 1
    for k, d in enumerate(greedy[0].depths):
        lattice = sum(1 for n in view.nodes.values() if n.stage == k)
        assert f"E{k} · d={d}" in html
        assert f"<b>{committed}</b> +1 + <b>{lattice}</b>" in html
    assert f"lattice {lattice_size(view)} nodes" in html


def test_stats_html_matches_the_end_event_numbers(greedy):
    end = greedy[-1]
    stats = end.stats
    html = stats_html(replay(greedy)[-1], end)
    assert f"<b>{stats.tokens}</b>" in html and f"<b>{stats.rounds}</b>" in html
    assert f"<b>{stats.rounds_per_token:.2f}</b>" in html
    assert f"<b>{stats.depth_speedup:.2f}×</b>" in html
    assert f"<b>{stats.tokens_per_second:.1f}</b>" in html
    for k in range(4):
        assert f"E{k} · d={greedy[0].depths[k]}</span>" in html
    assert "tokens/s" not in stats_html(replay(greedy)[-1])


def test_round_table_lists_each_batch_and_the_commit_decision(greedy):
    views = replay(greedy)
    view = first_commit_with(views, lambda v: v.kept)
    html = round_table_html(view)
    for k, batch in enumerate(view.batches):
        assert f"E{k} · d={greedy[0].depths[k]}</span> · batch of {len(batch)}" in html
        for i in batch:
            assert re.search(rf">{i}</td><td[^>]*>{view.nodes[i].kind}</td>", html)
    assert f"matched at stage {view.commit.matched_stage}" in html
    assert f"kept ({len(view.kept)}): {', '.join(map(str, view.kept))}" in html
    assert f"dropped ({len(view.dropped)})" in html
    assert "no commit this round" in round_table_html(views[0])


def test_race_figure_draws_one_line_per_series():
    fig = race_figure(
        [{"name": "DEX", "times": [0.1, 0.15, 0.3]}, {"name": "AR", "times": [0.2, 0.4], "dash": True}]
    )
    assert [t.name for t in fig.data] == ["DEX", "AR"]
    assert list(fig.data[0].y) == [0, 1, 2, 3] and list(fig.data[0].x) == [0.0, 0.1, 0.15, 0.3]
    assert fig.data[1].line.dash == "dash" and fig.data[0].line.dash == "solid"
    assert fig.layout.uirevision == "race"


def test_ead_and_speedup_figures_plot_histograms_and_the_oracle_line():
    import torch

    from dex_core.analysis.ead import analyse

    tokens = torch.tensor([5, 6, 7, 8])
    ready = torch.tensor(
        [[0, 1, 1, 1, 1, 1], [0, 1, 1, 1, 1, 1], [0, 0, 1, 1, 1, 1], [0, 0, 0, 0, 0, 1]]
    ).bool()
    cands = torch.stack(
        [torch.where(ready, tokens[:, None], tokens[:, None] + 50), torch.full((4, 6), 99)], dim=2
    )
    analysis = analyse(cands, tokens, explorers=[3, 2], best=True)
    ead = ead_figure(analysis)
    assert [t.name for t in ead.data] == ["stable EAD", "EAD"]
    assert list(ead.data[0].x) == [1, 2, 3, 4, 5, 6]
    assert list(ead.data[0].y) == [0, 2, 1, 0, 0, 1] and list(ead.data[1].y) == [0, 2, 1, 0, 0, 1]
    speed = speedup_figure(analysis)
    by_k = {p["explorers"]: p for p in analysis["predicted"]}
    assert list(speed.data[0].x) == [2, 3] and list(speed.data[0].y) == [
        by_k[2]["speedup"],
        by_k[3]["speedup"],
    ]
    assert list(speed.data[1].y) == [by_k[2]["uniform"]["depth_speedup"], by_k[3]["uniform"]["depth_speedup"]]
    assert list(speed.data[2].text) == [
        f"depths {by_k[2]['best']['depths']}",
        f"depths {by_k[3]['best']['depths']}",
    ]
    assert speed.data[-1].name == "oracle S_EAD" and list(speed.data[-1].y) == [analysis["oracle"]] * 2
    assert speed.data[-1].line.dash == "dash"


def test_replay_of_an_ar_trace_has_no_rounds(llama):
    trace = ar_generate(llama, [1, 2, 3, 4], 3).trace
    assert replay(trace) == []
    assert "no tokens yet" in tokens_html(replay(trace))


def test_replay_rejects_a_trace_without_its_start_event(greedy):
    with pytest.raises(ValueError, match="must begin with its start event"):
        replay(greedy[1:])


def test_visualize_imports_no_model_code():
    code = (
        "import sys, visualize, visualize.timeline, visualize.report; "
        "bad = {'torch', 'transformers', 'fastapi'} & set(sys.modules); "
        "bad |= {m for m in sys.modules if m.startswith('dex_core.') and m.split('.')[1] not in "
        "('trace', 'config', 'values', 'families', 'algorithm')}; assert not bad, bad"
    )  # of dex_core only the trace package and the torch-free records it is written in
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parents[2])


def test_lattice_graph_holds_every_node_of_the_run_as_a_dag_with_each_nodes_fate(trace):
    import networkx as nx

    graph = lattice_graph(trace)
    rounds = [e for e in trace if isinstance(e, RoundEvent)]
    assert graph.number_of_nodes() == sum(len(e.nodes) for e in rounds)
    assert nx.is_directed_acyclic_graph(graph)
    fates = [d["fate"] for _, d in graph.nodes(data=True)]
    tokens, K = trace[-1].tokens, trace[0].explorers
    assert fates.count("matched") == len(tokens)  # one matched anchor node per committed token
    assert fates.count("matched") + fates.count("final") + fates.count("committed") == K * len(tokens)
    dropped = {i for e in rounds if e.collapse for i in e.collapse["dropped"]}
    assert {i for i, d in graph.nodes(data=True) if d["fate"] == "discarded"} == dropped
    cut = {
        i: e.round for e in rounds for i in e.cut or []
    }  # draft-chain nodes their predecessor contradicted
    assert {i: d["cut_round"] for i, d in graph.nodes(data=True) if d["fate"] == "cut"} == cut
    assert {i for i, d in graph.nodes(data=True) if d["fate"] == "pending"} == set(rounds[-1].alive)
    for parent, child, kind in graph.edges(data="kind"):
        p, c = graph.nodes[parent], graph.nodes[child]
        assert (c["stage"], c["position"]) == (
            (p["stage"] + 1, p["position"]) if kind == "depth" else (0, p["position"] + 1)
        )


def test_lattice_graph_exports_as_graphml_and_node_link_json(greedy, tmp_path):
    import json

    import networkx as nx

    back = nx.read_graphml(export_graph(greedy, tmp_path / "g.graphml"))
    assert back.number_of_nodes() == lattice_graph(greedy).number_of_nodes()
    doc = json.loads(export_graph(greedy, tmp_path / "g.json").read_text())
    assert len(doc["nodes"]) == back.number_of_nodes() and doc["directed"]
    with pytest.raises(ValueError, match="graphml or .json"):
        export_graph(greedy, tmp_path / "g.png")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "visualize.graph",
            str(tmp_path / "missing.json"),
            str(tmp_path / "o.graphml"),
        ],
        capture_output=True,
        text=True,
        cwd=Path(__file__).parents[2],
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr


def test_race_summary_says_identical_only_when_both_finished_with_the_same_tokens():
    times = {"ar": [0.1, 0.2], "dex": [0.3, 0.5], "proj": [0.1, 0.15]}
    facts = {"K": 4, "first": "AR"}
    same = race_summary_html({"ar": [1, 2], "dex": [1, 2]}, times, True, facts)
    assert "identical output" in same and "DEX on 4 devices (one per explorer) 2 tokens in 0.15 s" in same
    assert "outputs differ" in race_summary_html({"ar": [1, 2], "dex": [1, 3]}, times, True, facts)
    assert "racing" in race_summary_html({"ar": [1], "dex": []}, times, False, facts)
    stopped = race_summary_html({"ar": [1, 2], "dex": [1]}, times, False, facts, "by you")
    assert (
        "stopped by you: AR made 2 tokens, DEX 1 (the first 1 agree)" in stopped and "racing" not in stopped
    )


def test_race_summary_leads_with_the_measured_speed_and_folds_the_jargon_away():
    times = {"ar": [0.1, 0.2], "dex": [0.3, 0.5], "proj": [0.1, 0.125]}  # AR 10 tokens/s, DEX 4, projected 16
    facts = {
        "K": 4,
        "first": "AR",
        "depths": [8, 15, 23, 30],
        "rounds_per_token": 2.5,
        "depth_speedup": 1.6,
        "ar_cost": 38.0,
        "dex_cost": 26.0,
        "dex_cost_rows": 40.0,
    }
    html = race_summary_html({"ar": [1, 2], "dex": [1, 2]}, times, True, facts)
    head = re.search(r"<div id='race-headline'[^>]*>(.*?)</div>", html).group(1)
    assert head == (
        "On this machine DEX ran at <b>0.40×</b> AR's speed (measured); on 4 devices it would be about "
        "1.60× — a projection."
    )
    assert (
        html.index("race-headline")
        < html.index("race-measured")
        < html.index("race-projected")
        < html.index("<details id='race-how'")
        < html.index("layer-equivalents")
        < html.index("memory-bound")
    )
    fold = html[html.index("<details") :]
    assert "How this is counted" in fold and "until AR finished" in fold and "Where DEX wins" in fold
    assert "layer-times" not in html and "until ar " not in html
    alone = race_summary_html({"ar": [1, 2], "dex": [1, 2]}, times, True, {"K": 1, "first": "DEX"})
    assert "on 1 device it would be" in alone and "1 devices" not in alone
    real = race_summary_html({"ar": [1, 2], "dex": [1, 2]}, times, True, {"K": 2, "distributed": True})
    assert (
        "DEX ran at <b>0.40×</b> AR's speed (measured)." in real
        and "projection" not in real.split("<details")[0]
    )


def test_bench_report_chart_is_written_from_the_json_report(tmp_path):
    import json

    report = {
        "model": "m",
        "oracle": {"s": {"speedup": 1.2}},
        "results": [
            {"set": "s", "method": "ar-hf", "layer_speedup": 1.0, "speedup_vs_ar": 1.0},
            {
                "set": "s",
                "method": "dex",
                "explorers": 2,
                "adapters": True,
                "decs": True,
                "layer_speedup": 1.1,
                "speedup_vs_ar": 0.7,
            },
        ],
    }
    (tmp_path / "r.json").write_text(json.dumps(report))
    root = Path(__file__).parents[2]
    proc = subprocess.run(
        [sys.executable, "-m", "visualize.report", str(tmp_path / "r.json"), str(tmp_path / "r.html")],
        capture_output=True,
        text=True,
        cwd=root,
    )
    assert proc.returncode == 0, proc.stderr
    assert "plotly" in (tmp_path / "r.html").read_text()[:5000].lower()
    bad = subprocess.run(
        [sys.executable, "-m", "visualize.report", str(tmp_path / "nope.json"), str(tmp_path / "x.html")],
        capture_output=True,
        text=True,
        cwd=root,
    )
    assert bad.returncode == 2 and "not a readable DEX trace or dex bench report" in bad.stderr


def test_every_stage_colour_is_an_okabe_ito_colour_and_the_same_in_every_panel(greedy):
    view = first_commit_with(replay(greedy), lambda v: True)
    depths = greedy[0].depths
    assert len(set(OKABE_ITO)) == 8 and palette.stage_colors(range(1, 9)) == list(OKABE_ITO)
    panels = tokens_html(view) + fsm_html(view) + stats_html(view)
    ticks = lattice_figure(view).layout.yaxis.ticktext + timeline_figure(greedy).layout.yaxis.ticktext
    for k in range(len(depths)):
        assert panels.count(f"background: {stage_color(k, depths)}") >= 3  # legend key, FSM row, histogram
        assert sum(f"color:{stage_color(k, depths)}" in t for t in ticks) == 2
    backgrounds = {c.upper() for c in re.findall(r"background: (#[0-9a-fA-F]{6})", panels)}
    assert backgrounds <= set(OKABE_ITO) | {"#F4F6F7", palette.DARK, palette.PALE}, (
        backgrounds
    )  # table heads, id chips


def grey(colour: str) -> bool:
    return colour.upper() in ("WHITE", "BLACK") or (
        colour[0] == "#" and colour[1:3] == colour[3:5] == colour[5:7]
    )


def figure_colours(fig) -> set[str]:
    """Every colour a figure's traces draw with: markers, their outlines, lines and bars."""
    out = set()
    for t in fig.data:
        for part in (
            getattr(t, "marker", None),
            getattr(getattr(t, "marker", None), "line", None),
            getattr(t, "line", None),
        ):
            colour = getattr(part, "color", None) if part is not None else None
            out |= {colour} if isinstance(colour, str) else set(colour or ())
    return out


def test_status_and_fate_marks_never_use_a_stage_colour_and_differ_without_colour(greedy, deep, cut_chains):  # noqa: F811
    from visualize import palette

    for marks in (palette.STATUS_MARKS, palette.FATE_MARKS):
        assert all(grey(c) for m in marks.values() for c in (m.fill, m.line, m.ink))
        assert len({(m.fill, m.symbol, m.width) for m in marks.values()}) == len(
            marks
        )  # shade, shape or outline
        assert len({m.fill for m in marks.values()} | {m.symbol for m in marks.values()}) >= 4
    others = [
        palette.CUT_COLOR,
        palette.CURRENT_ROUND_COLOR,
        *palette.RUN_COLORS,
        *(c for c, _, _ in palette.SERIES),
    ]
    assert all(grey(c) for c in others), others
    views = replay(deep)
    figures = [lattice_figure(v) for v in (views[0], first_commit_with(views, lambda v: True))]
    figures += [timeline_figure(greedy), timeline_figure(deep), timeline_figure(cut_chains)]
    figures += [lattice_figure(v) for v in replay(cut_chains) if v.cut and len(v.commits) > 1]  # chains, cuts
    for fig in figures:
        drawn = figure_colours(fig)
        assert drawn and not drawn & set(OKABE_ITO), drawn & set(OKABE_ITO)
        assert all(grey(c) for c in drawn), drawn


def test_the_stage_legend_keeps_each_key_on_one_line_and_k8_in_one_row_of_short_keys(deep):
    from visualize import stage_legend_html

    spans = Spans(stage_legend_html(deep[0].depths)).spans
    keys = [(style, text) for cls, style, text in spans if cls == "dex-key"]
    assert [text for _, text in keys] == [f"E{k} · d={k + 1}" for k in range(8)]
    assert all(style["white-space"] == "nowrap" and style["display"] == "inline-block" for style, _ in keys)
    assert sum(len(text) for _, text in keys) <= 80  # about 700 px of keys at 12 px: one row at 1,400 px


def test_k8_panels_fold_node_ids_and_labels_are_whole_or_absent(deep):
    full = max(replay(deep), key=lattice_size)
    html = fsm_html(full)
    folded = re.findall(r"<details><summary>.*?</summary>(.*?)</details>", html, flags=re.S)
    assert len(folded) == 8  # one per explorer: each lists its stage's node ids, the new ones in bold
    for k, chips in enumerate(folded):
        spans = Spans(chips).spans
        assert [int(text) for _, _, text in spans] == sorted(i for i, n in full.nodes.items() if n.stage == k)
        assert {int(text) for _, style, text in spans if style.get("font-weight") == "bold"} == {
            i for i in full.new if full.nodes[i].stage == k
        }
    outside = Spans(re.sub(r"<details>.*?</details>", "", html, flags=re.S)).spans
    assert not [
        text for _, _, text in outside if text.strip().isdigit()
    ]  # every id chip is behind a <details>
    for k in range(8):
        assert f"<b>{sum(1 for n in full.nodes.values() if n.stage == k)}</b> (" in html
    fig = lattice_figure(full)
    for t in fig.data:
        if "markers" in t.mode:
            assert all("…" not in label for label in t.text)
    labels = {n.id: n.text for n in full.nodes.values()}
    assert any(label for t in lattice_figure(replay(deep)[0]).data if "markers" in t.mode for label in t.text)
    assert len(labels) == 255
    edges = {t.name: t for t in fig.data if t.mode == "lines"}
    assert edges["edges: other"].visible == "legendonly" and edges["edges: this round"].visible is True
    drawn = sum(1 for x in edges["edges: this round"].x + edges["edges: kept"].x if x is None)
    assert drawn <= len(full.new) + len(full.kept) + len(full.committed_ids)
    assert fig.layout.height <= 560


def test_top_k_lists_name_tokens_by_text_from_the_whole_run(greedy):
    views = replay(greedy)
    view = views[-1]
    html = round_table_html(view)
    for batch in view.batches:
        for i in batch:
            for token, *_ in view.nodes[i].top:
                if token in view.vocab:
                    assert f"({token})" in html and f"#{token} (no text)" not in html
    first = greedy[1].nodes[0]
    node = dataclasses.replace(first, top=[[99999, 0.5, "<zebra>"]] + first.top[1:])
    crafted = [greedy[0], dataclasses.replace(greedy[1], nodes=[node, *greedy[1].nodes[1:]]), *greedy[2:]]
    shown = round_table_html(replay(crafted)[0])
    assert "&#x27;&lt;zebra&gt;&#x27; (99999)" in shown and "<zebra>" not in shown


def test_timeline_draws_every_node_once_at_its_position_with_its_round_and_fate(trace):
    fig = timeline_figure(trace)
    graph = lattice_graph(trace)
    nodes = {t.name: t for t in fig.data if t.name in FATE_COLORS}
    assert sum(len(t.x) for t in nodes.values()) == graph.number_of_nodes()
    for fate, t in nodes.items():
        assert t.marker.color == FATE_COLORS[fate]
        members = sorted((n["round"], n["position"]) for _, n in graph.nodes(data=True) if n["fate"] == fate)
        assert sorted(zip(t.customdata, (round(x) for x in t.x))) == members
    commits = [e for e in trace if isinstance(e, RoundEvent) and e.commit]
    cuts = next(t for t in fig.data if t.name == "collapses")
    assert list(cuts.customdata) == [e.round for e in commits]
    assert [x - 0.5 for x in cuts.x] == [e.commits[-1].position for e in commits]  # after the round's last
    hover = " ".join(nodes["matched"].hovertext)
    assert "top: &#39;" in hover or "top: '" in hover or "top: #" in hover
    assert "fate: matched" in hover and "round " in hover


def test_run_report_is_one_page_with_plotly_inlined_and_the_trace_escaped(greedy, tmp_path):
    from plotly.offline import get_plotlyjs

    page = run_report_html(greedy, {"model": "tiny", "prompt": "<script>alert(1)</script>"})
    assert page.count("<script>alert(1)</script>") == 0 and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert (
        "<script src" not in page
        and page.count('id="dex-timeline"') == 1
        and page.count('id="dex-lattice"') == 1
    )
    assert get_plotlyjs() in page  # plotly.js itself, whole: the page opens offline
    proc = subprocess.run([sys.executable, "-m", "visualize.report", "-h"], capture_output=True, text=True)
    assert "trace" in proc.stdout


def test_status_line_names_its_state_and_escapes_its_detail():
    html = status_html("error", "<b>bad</b>")
    assert "data-state='error'" in html and "<b>error</b>" in html and "&lt;b&gt;bad&lt;/b&gt;" in html
    with pytest.raises(ValueError, match="state must be one of"):
        status_html("exploded")


def test_a_near_tie_commit_is_marked_and_explained_and_other_commits_are_not(greedy):
    commits = [e for e in greedy if isinstance(e, RoundEvent) and e.commit]
    assert all(c.commit.near_tie is False and c.commit.margin > c.commit.tie_gap for c in commits)
    index = next(i for i, e in enumerate(greedy) if e is commits[2])
    marked = list(greedy)
    marked[0] = dataclasses.replace(greedy[0], dtype="bfloat16")
    tie = dataclasses.replace(greedy[index].commit, margin=0.125, near_tie=True, tie_gap=0.5)
    marked[index] = dataclasses.replace(greedy[index], commits=[tie])
    views = replay(marked)
    html = tokens_html(views)
    assert html.count('data-near-tie="1"') == 1 and html.count("dashed") == 2 and "1 near-tie commit:" in html
    spans = re.findall(r'<span class="dex-tok"[^>]*>', html)
    assert len(spans) == len(commits) and "data-near-tie" in spans[2] and "≈ near-tie" in spans[2]
    sentence = (
        "Near-tie: the final layer's top two tokens were 0.125 apart, within bfloat16 rounding (tie gap 0.5); "
        "<code>dex verify</code> certifies such tokens against the unmodified model."
    )
    tables = {v.round: round_table_html(v) for v in views}
    assert [r for r, t in tables.items() if sentence in t and "≈ near-tie</span>" in t] == [
        marked[index].round
    ]
    older = [e.record() for e in greedy]  # traces made before commits carried the key (or a commits list)
    for e in older:  # show nothing
        if e.get("commit"):
            e.pop("commits")
            for key in ("margin", "near_tie", "tie_gap"):
                e["commit"].pop(key)
    for trace in (greedy, parse_events(older)):
        views = replay(trace)
        assert "near-tie" not in tokens_html(views) and "dashed" not in tokens_html(views)
        assert not any("near-tie" in round_table_html(v).lower() for v in views)


def test_the_timeline_height_follows_k_and_its_legend_sits_above_the_plot(llama, deep):
    from visualize.timeline import MIN_PLOT_PX

    k2 = (
        DexDecoder(llama, explorers=2, tokenizer=tiny_tokenizer(), draft="none")
        .generate([1, 2, 3, 4], 6, node_text=True)
        .trace
    )
    plots = {}
    for K, trace in ((2, k2), (8, deep)):
        fig = timeline_figure(trace)
        layout = fig.layout
        plots[K] = layout.height - layout.margin.t - layout.margin.b
        span = abs(
            layout.yaxis.range[0] - layout.yaxis.range[1]
        )  # y units: K stage rows and the collapse row
        assert plots[K] >= MIN_PLOT_PX >= 120 and plots[K] / span >= 20, (
            K,
            plots[K],
        )  # labels >= 20 px apart
        assert layout.legend.orientation == "h" and layout.legend.y >= 1 and layout.legend.yanchor == "bottom"
        legend = sorted((t for t in fig.data if t.showlegend is not False), key=lambda t: t.legendrank)
        assert [t.name for t in legend] == [
            "matched",
            "final",
            "committed",
            "discarded",
            "pending",
            "collapses",
            "edges",
            "edges into discarded nodes",
        ]
    assert plots[8] > plots[2]


def label_boxes(fig) -> tuple[list, int]:
    """The boxes (px, at the width labels are fitted for) of a lattice figure's drawn labels, and its node count."""
    from visualize.fit import label_box
    from visualize.lattice import FIT_PLOT_PX, FONT_PX

    x0, x1 = fig.layout.xaxis.range
    y_hi, y_lo = fig.layout.yaxis.range
    plot_h = fig.layout.height - fig.layout.margin.t - fig.layout.margin.b
    px_x, px_y = FIT_PLOT_PX / (x1 - x0), plot_h / (y_hi - y_lo)
    boxes, nodes = [], 0
    for t in fig.data:
        if t.mode == "markers+text":
            nodes += len(t.x)
            boxes += [label_box(s, x * px_x, y * px_y, FONT_PX) for x, y, s in zip(t.x, t.y, t.text) if s]
    return boxes, nodes


def test_a_k8_round_of_30_positions_labels_half_its_nodes_apart_opens_near_the_anchor_and_keeps_its_title():
    from visualize.fit import text_px
    from visualize.lattice import FIT_PLOT_PX, MARGIN, TITLE_PX

    trace = long_chain_trace(
        rounds=1
    )  # a chain of 30 slots beside the root (later rounds add 31 branches on it)
    wide = [v for v in replay(trace) if max(n.position - v.commit_position for n in v.nodes.values()) >= 29]
    assert wide, "no round reaches 30 positions"
    for view in wide:
        fig = lattice_figure(view)
        boxes, nodes = label_boxes(fig)
        assert nodes == lattice_size(view) and len(boxes) >= nodes / 2, (len(boxes), nodes)
        overlaps = [(a, b) for i, a in enumerate(boxes) for b in boxes[i + 1 :] if a.overlaps(b)]
        assert overlaps == []
        assert fig.layout.xaxis.range[1] < 16 and fig.layout.dragmode == "pan"  # opens near the anchor
        assert "drag to pan" in fig.layout.xaxis.title.text
        hovers = [h for t in fig.data if t.mode == "markers+text" for h in t.hovertext]
        assert len(hovers) == nodes and all("candidate" in h for h in hovers)  # the rest on hover
        lines = fig.layout.title.text.split("<br>")
        assert all(text_px(line, TITLE_PX) <= FIT_PLOT_PX + MARGIN["l"] for line in lines)
        assert fig.layout.margin.t >= len(lines) * 1.25 * TITLE_PX  # room for every line


def test_a_long_title_breaks_into_lines_and_keeps_every_character():
    from visualize.fit import text_px, wrap

    parts = [
        "Round 12",
        "state q=3→4",
        "commit '" + "Supercalifragilistic" * 5 + "' matched at stage 2 (d=18)",
    ]
    lines = wrap(parts, 300, 14)
    assert len(lines) > 2 and all(text_px(line, 14) <= 300 for line in lines)
    assert "".join(lines).replace(" ", "").replace("·", "") == "".join(parts).replace(" ", "").replace(
        "·", ""
    )


def test_stage_colours_follow_the_depth_so_a_k2_and_a_k4_run_read_alike():
    from visualize.palette import stage_colors

    k2, k4 = stage_colors([18, 30]), stage_colors([9, 18, 27, 30])
    assert k2[0] == k4[1] and k2[1] == k4[3] == OKABE_ITO[-1]  # depth 18 of 30 alike, the final layer black
    assert stage_colors([4, 8, 11, 15, 19, 22, 26, 30]) == list(OKABE_ITO)  # K = 8 spread over every colour
    for depths in ([1, 2, 30], [14, 15, 16, 30], [27, 28, 29, 30], [1, 2, 3, 4, 5, 6, 7, 8]):
        colours = stage_colors(depths)
        assert len(set(colours)) == len(depths) and [OKABE_ITO.index(c) for c in colours] == sorted(
            OKABE_ITO.index(c) for c in colours
        ), depths  # apart within a run, in depth order
    fig = lattice_figure(replay(load_trace(Path(__file__).parents[2] / "assets/traces/example.json")[0])[-1])
    assert (
        fig.layout.yaxis.ticktext[1].startswith(f"<span style='color:{k4[1]}'>")
        and "d=18" in fig.layout.yaxis.ticktext[1]
    )
