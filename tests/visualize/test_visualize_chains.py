"""The viewers on runs with draft chains: chain nodes framed on the lattice and the timeline, chain edges
along the position axis, cut nodes, rounds that commit several tokens in the FSM panel, the round table,
the text and the timeline, on the draft-chain traces of ``tests/visualize/conftest.py`` (``test_visualize``
also runs its whole-trace checks on them)."""

import re

from dex_core import DexDecoder
from dex_core.testing import tiny_tokenizer
from dex_core.trace.events import RoundEvent
from visualize import (
    fsm_html,
    lattice_figure,
    lattice_graph,
    node_status,
    replay,
    round_table_html,
    run_report_html,
    stats_html,
    timeline_figure,
    tokens_html,
)
from visualize.lattice import CHAIN_EDGES, CHAIN_FRAMES, chain_nodes


def several(views):
    """The views of rounds that committed more than one token (the fixture's run must have some)."""
    out = [v for v in views if len(v.commits) > 1]
    assert out, "the run committed one token per round: no chain completed"
    return out


def frame_boxes(trace) -> list[tuple[float, float]]:
    """The centre of every rectangle a frame trace draws (five points, then None)."""
    xs, ys = list(trace.x), list(trace.y)
    return [((xs[i] + xs[i + 1]) / 2, (ys[i] + ys[i + 2]) / 2) for i in range(0, len(xs), 6)]


def markers_at(fig) -> set[tuple[float, float]]:
    return {(round(x, 6), round(y, 6)) for t in fig.data if "markers" in t.mode for x, y in zip(t.x, t.y)}


def test_every_chain_node_is_framed_on_the_lattice_and_chain_edges_run_one_position_on_at_stage_0(chains):
    views = replay(chains)
    shown = [v for v in views if chain_nodes(v)]
    assert shown and any(len(chain_nodes(v)) > 4 for v in shown)
    for view in shown:
        fig = lattice_figure(view)
        frames = [t for t in fig.data if t.name == CHAIN_FRAMES]
        boxes = [b for t in frames for b in frame_boxes(t)]
        assert len(boxes) == len(chain_nodes(view)) and [t.showlegend for t in frames] == [True, False]
        assert {(round(x, 6), round(y, 6)) for x, y in boxes} <= markers_at(fig)  # each frame around a node
        assert sum(len(t.x) for t in fig.data if "markers" in t.mode) == len(
            view.nodes
        )  # frames are no markers
        edges = next(t for t in fig.data if t.name == CHAIN_EDGES)
        segments = [
            (edges.x[i], edges.y[i], edges.x[i + 1], edges.y[i + 1]) for i in range(0, len(edges.x), 3)
        ]
        kinds = [n for n in view.nodes.values() if n.kind == "chain" and n.parent in view.nodes]
        assert len(segments) == len(kinds)
        assert all(0.5 < x1 - x0 < 1.5 and abs(y0) < 0.5 and abs(y1) < 0.5 for x0, y0, x1, y1 in segments)
    bare = next(
        v for v in views if not chain_nodes(v)
    )  # a round with no chain slot in its lattice draws neither
    assert not {CHAIN_FRAMES, CHAIN_EDGES} & {t.name for t in lattice_figure(bare).data}


def test_the_lattice_reaches_as_far_as_a_chain_and_draws_every_node(chains):
    for view in replay(chains):
        fig = lattice_figure(view)
        reach = max(n.position - view.commit_position for n in view.nodes.values())
        assert list(fig.layout.xaxis.ticktext)[-1] == f"+{max(reach, 3)}"
        assert sum(len(t.x) for t in fig.data if "markers" in t.mode) == len(view.nodes)


def test_a_round_of_several_commits_marks_each_final_and_matched_node_and_says_so_in_its_title(chains):
    for view in several(replay(chains)):
        finals = [c.anchor_nodes[-1] for c in view.commits]
        assert [node_status(view, i) for i in finals] == ["final"] * len(finals)
        for c in view.commits:
            matched = c.anchor_nodes[c.matched_stage]
            assert node_status(view, matched) in ("accepted", "final")
        fig = lattice_figure(view)
        assert len(next(t for t in fig.data if t.name == "final").x) == len(finals)
        drafted = sum(c.drafted for c in view.commits)
        assert drafted >= 1  # the commits after the first come from chain slots
        assert f"committed {len(finals)} tokens " in fig.layout.title.text
        assert fig.layout.title.text.endswith(f"({drafted} drafted)")


def test_cut_chain_nodes_have_their_own_status_fate_and_mark(cut_chains, chains):
    views = replay(cut_chains)
    cut = [v for v in views if v.cut]
    assert cut and any(not v.commit for v in cut)  # cut on rounds without a commit too
    for view in cut:
        assert {node_status(view, i) for i in view.cut} == {"cut"}
        fig = lattice_figure(view)
        drawn = next(t for t in fig.data if t.name == "cut")
        assert len(drawn.x) == len(view.cut) and drawn.marker.symbol == "x" and drawn.marker.opacity < 1
    graph = lattice_graph(cut_chains)
    fates = {i for i, d in graph.nodes(data=True) if d["fate"] == "cut"}
    assert fates == {i for v in views for i in v.cut}
    timeline = {t.name: t for t in timeline_figure(cut_chains).data}
    assert len(timeline["cut"].x) == len(fates) and timeline["cut"].marker.symbol == "x"
    assert "cut" not in {t.name for t in timeline_figure(chains).data}  # named only where nodes were cut


def test_the_graph_marks_every_node_of_a_chain_slot_drafted_and_chain_edges_go_one_position_on(chains):
    graph = lattice_graph(chains)
    records = {n.id: n for e in chains if isinstance(e, RoundEvent) for n in e.nodes}
    slots = {n.slot for n in records.values() if n.kind == "chain"}
    assert slots and {i for i, d in graph.nodes(data=True) if d["drafted"]} == {
        i for i, n in records.items() if n.slot in slots
    }
    assert any(records[i].stage > 0 for i, d in graph.nodes(data=True) if d["drafted"])  # deeper nodes too
    chain_edges = [(a, b) for a, b, kind in graph.edges(data="kind") if kind == "chain"]
    assert len(chain_edges) == sum(n.kind == "chain" for n in records.values())
    for a, b in chain_edges:
        assert graph.nodes[b]["stage"] == graph.nodes[a]["stage"] == 0
        assert graph.nodes[b]["position"] == graph.nodes[a]["position"] + 1


def test_the_timeline_frames_chain_nodes_and_labels_a_round_of_n_commits_xn(chains):
    fig = timeline_figure(chains)
    graph = lattice_graph(chains)
    by_name = {}
    for t in fig.data:
        by_name.setdefault(t.name, []).append(t)
    frames = by_name["draft chain"]
    assert sum(len(frame_boxes(t)) for t in frames) == sum(d["drafted"] for _, d in graph.nodes(data=True))
    assert [t.opacity for t in frames] == [1.0, 0.3] and frames[0].legendgroup == by_name["chain edges"][
        0
    ].legendgroup
    live = sum(
        1
        for a, b, k in graph.edges(data="kind")
        if k == "chain" and graph.nodes[b]["fate"] not in ("discarded", "cut")
    )
    assert sum(x is None for x in by_name["chain edges"][0].x) == live
    legend = [
        t.name for t in sorted((t for t in fig.data if t.showlegend is not False), key=lambda t: t.legendrank)
    ]
    assert legend.index("draft chain") == legend.index("pending") + 1
    collapses = by_name["collapses"][0]
    rounds = [e for e in chains if isinstance(e, RoundEvent) and e.commits]
    assert list(collapses.text) == [f"×{len(e.commits)}" if len(e.commits) > 1 else "" for e in rounds]
    assert "×2" in collapses.text
    for e, hover in zip(rounds, collapses.hovertext):
        if len(e.commits) > 1:
            drafted = ", ".join(str(c.position) for c in e.commits if c.drafted)
            assert f"committed {len(e.commits)} tokens at positions {e.commits[0].position}–" in hover
            assert f"(drafted: {drafted})" in hover


def test_the_fsm_panel_says_how_many_tokens_a_round_committed_and_which_were_drafted(chains):
    views = replay(chains)
    for view in several(views):
        html, n = fsm_html(view), len(view.commits)
        assert f"(committed {n} tokens this round; lattice {len(view.nodes)} nodes)" in html
        listed = re.search(r"class='dex-fsm-commits'[^>]*>(.*?)</span>", html).group(1)
        assert listed.count("(drafted)") == sum(c.drafted for c in view.commits) >= 1
        assert [int(p) for p in re.findall(r" at (\d+)", listed)] == [c.position for c in view.commits]
        committed = len(chains[0].prompt) - 1 + len(view.tokens) - n
        assert (
            html.count(f"<b>{committed}</b> +{n} + ") == 4 and f"+{n}: the tokens this round commit<" in html
        )
    single = next(v for v in views if len(v.commits) == 1 and not v.commits[0].drafted)
    assert "(committed 1 token this round;" in fsm_html(single) and "dex-fsm-commits" not in fsm_html(single)
    assert "(no commit;" in fsm_html(next(v for v in views if not v.commits))


def test_drafted_tokens_are_underlined_in_the_text_and_marked_in_the_round_table_and_counted(chains, llama):
    views = replay(chains)
    drafted = [i for i, c in enumerate(views[-1].token_commits) if c.drafted]
    assert len(drafted) == chains[-1].stats.drafted >= 2
    html = tokens_html(views)
    spans = re.findall(r'<span class="dex-tok"[^>]*>', html)
    assert [i for i, s in enumerate(spans) if 'data-drafted="1"' in s] == drafted
    assert all("text-decoration: underline" in spans[i] and "drafted" in spans[i] for i in drafted)
    assert f"{len(drafted)} drafted tokens</span>" in html
    for view in several(views):
        table = round_table_html(view)
        n = len(view.commits)
        assert [int(j) for j in re.findall(rf"<b>Commit (\d+) of {n}</b>", table)] == list(range(1, n + 1))
        assert table.count("class='dex-drafted'") == sum(c.drafted for c in view.commits)
        for c in view.commits:
            assert f"at position {c.position}, matched at stage {c.matched_stage}" in table
    assert f"<b>{len(drafted)}</b>" in stats_html(views[-1]).split("drafted tokens")[1][:80]
    plain = (
        DexDecoder(llama, explorers=2, tokenizer=tiny_tokenizer(), draft="none")
        .generate([1, 2, 3, 4], 4, node_text=True)
        .trace
    )
    assert "drafted" not in tokens_html(replay(plain)) + stats_html(replay(plain)[-1])


def test_the_round_table_lists_the_cut_chain_nodes(cut_chains):
    view = next(v for v in replay(cut_chains) if v.cut)
    table = round_table_html(view)
    assert f"<b>Cut</b> {len(view.cut)} draft-chain nodes" in table
    assert ", ".join(map(str, view.cut)) in table


def test_the_run_report_names_the_draft_bounds_in_the_pages_words(chains):
    page = run_report_html(chains, {"model": "tiny"})
    words = (
        "chains of up to 8 looked-up tokens, n-grams 2–3, 1 new chain a round, at most 24 chain slots alive"
    )
    assert f"<th style='text-align: left; padding-right: 12px;'>draft chains</th><td>{words}</td>" in page
    ran = page[page.index("<h1>DEX run</h1>") : page.index("<h2>Text</h2>")]  # what ran: no raw option names
    assert "min_ngram" not in ran and "=" not in ran.replace("style=", "")
