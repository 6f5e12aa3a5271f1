"""The whole run's lattice as one networkx DAG, and its export (GraphML or node-link JSON).

Every exploration token of the run is a node (``id`` as in the trace) with its stage, absolute
position, the round that computed it, its candidate and text, and its fate:

- ``matched``: the shallowest anchor node whose candidate equalled the committed token;
- ``final``: the anchor's final-stage node, whose token was committed (``matched`` wins when a token
  is matched at the last stage);
- ``committed``: the other anchor nodes of a committed token;
- ``discarded``: dropped by a collapse (``cut_round`` says which);
- ``cut``: a draft-chain node dropped because the slot before it proposed another token (``cut_round``);
- ``pending``: still in the lattice when the run ended.

A round with draft chains commits several tokens: every commit marks its own anchor nodes. ``drafted``
says a node belongs to a chain slot (its input was a looked-up token: the slot's stage-0 node has kind
"chain", its deeper nodes follow it down the stages). Edges go from a node to its depth child (``kind``
"depth"), to the first node of the slot its candidate started (``kind`` "position"), and along a chain
to the next chain slot's stage-0 node (``kind`` "chain", one position on). ``python -m visualize.graph
TRACE.json OUT.graphml`` (or ``OUT.json``) exports a saved trace (read typed: ``load_trace``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import networkx as nx

from dex_core.trace.events import Event, NodeRecord, RoundEvent, StartEvent
from dex_core.trace.files import load_trace

from .replay import typed_events

FATES = ("matched", "final", "committed", "discarded", "cut", "pending")


def lattice_graph(events: list[Event]) -> nx.DiGraph:
    """The DAG of every node of a DEX trace, from its typed events (an AR trace gives an empty graph)."""
    start = events[0] if events and isinstance(typed_events(events)[0], StartEvent) else None
    depths, explorers = (start.depths, start.explorers) if start else ([], 0)
    graph = nx.DiGraph(depths=json.dumps(depths), explorers=int(explorers))
    chain_slots: set[int] = set()
    for event in events:
        if isinstance(event, RoundEvent):
            for n in event.nodes:
                _add_node(graph, n, event.round, chain_slots)
            _mark_fates(graph, event)
    return graph


def _add_node(graph: nx.DiGraph, n: NodeRecord, round_: int, chain_slots: set[int]) -> None:
    """One node (pending until a commit or a collapse says otherwise) and the edge from its parent."""
    if n.kind == "chain":
        chain_slots.add(int(n.slot))
    graph.add_node(
        int(n.id),
        stage=int(n.stage),
        position=int(n.position),
        round=int(round_),
        kind=str(n.kind),
        token=int(n.token),
        text="" if n.text is None else str(n.text),
        fate="pending",
        cut_round=-1,
        drafted=int(n.slot) in chain_slots,
    )
    if n.parent is not None:
        graph.add_edge(int(n.parent), int(n.id), kind=str(n.kind))


def _mark_fates(graph: nx.DiGraph, event: RoundEvent) -> None:
    """The fates a round decided: each commit's anchor nodes, then the nodes its collapse dropped or it cut."""
    for commit in event.commits:
        anchors = [int(i) for i in commit.anchor_nodes]
        for i in anchors:
            graph.nodes[i]["fate"] = "committed"
        graph.nodes[anchors[-1]]["fate"] = "final"
        graph.nodes[anchors[int(commit.matched_stage)]]["fate"] = "matched"
    gone = [(i, "discarded") for i in (event.collapse or {}).get("dropped", [])]
    for i, fate in gone + [(i, "cut") for i in event.cut or []]:
        if int(i) in graph:
            graph.nodes[int(i)].update(fate=fate, cut_round=int(event.round))


def export_graph(events: list[Event], path: str | Path) -> Path:
    """Write the run's lattice graph as GraphML (``.graphml``) or node-link JSON (``.json``)."""
    path = Path(path)
    graph = lattice_graph(events)
    if path.suffix == ".graphml":
        nx.write_graphml(graph, path)
    elif path.suffix == ".json":
        path.write_text(json.dumps(nx.node_link_data(graph, edges="edges")))
    else:
        raise ValueError(f"export to .graphml or .json; got {path.name}")
    return path


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m visualize.graph", description="Export a saved DEX trace's lattice as a graph."
    )
    parser.add_argument("trace", help="a trace saved by dex generate --trace or the app")
    parser.add_argument("out", help="output file: .graphml or .json (node-link)")
    args = parser.parse_args(argv)
    try:
        events, _ = load_trace(args.trace)  # validated: sizes, schema, references (DexError is a ValueError)
        out = export_graph(events, args.out)
    except (OSError, ValueError, KeyError, TypeError, IndexError, RecursionError) as err:
        print(f"visualize.graph: error: {err}", file=sys.stderr)
        return 2
    print(f"lattice graph written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
