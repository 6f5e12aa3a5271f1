"""The viewers draw from typed trace events (``dex_core.trace.events``): a saved trace read back typed draws the
same figures and panels as the events the decoder streamed, and plain records (a trace file's dicts) are refused
at every entry point."""

import pytest

from dex_core.trace.events import EndEvent, Event, parse_events
from dex_core.trace.files import load_trace, save_trace
from visualize import (
    ReplayCache,
    fsm_html,
    lattice_figure,
    lattice_graph,
    replay,
    round_table_html,
    run_report_html,
    stats_html,
    timeline_figure,
    tokens_html,
)


def drawn(events) -> list:
    """What the viewers make of a trace: the whole run's graph and timeline, every round's panels and the
    lattice figure (as its JSON) of every fifth round and of each round that committed several tokens."""
    end = events[-1] if isinstance(events[-1], EndEvent) else None
    out = [timeline_figure(events).to_json(), sorted(lattice_graph(events).nodes(data=True))]
    for view in replay(events):
        out += [fsm_html(view), round_table_html(view), tokens_html(view), stats_html(view, end)]
        if view.index % 5 == 0 or len(view.commits) > 1:
            out.append(lattice_figure(view).to_json())
    return out


def test_a_saved_trace_read_back_typed_draws_what_the_streamed_events_drew(chains, tmp_path):
    assert all(isinstance(e, Event) for e in chains)  # what DexDecoder streamed
    save_trace(tmp_path / "run.json", chains, {"model": "tiny"})
    loaded, meta = load_trace(tmp_path / "run.json")
    assert loaded == parse_events([e.record() for e in chains]) == chains  # typed again, field for field
    assert len(replay(chains)) > 10 and drawn(loaded) == drawn(chains)
    assert run_report_html(loaded, meta) == run_report_html(chains, meta)


def test_plain_records_are_refused_at_every_entry_point(chains):
    records = [e.record() for e in chains]
    for draw in (replay, ReplayCache(), lattice_graph, timeline_figure, run_report_html):
        with pytest.raises(TypeError, match="typed trace events.*parse_events"):
            draw(records)
    cache, live = ReplayCache(), list(chains[:3])  # a live trace that a plain record is appended to
    assert len(cache(live)) == 2
    live.append(records[3])
    with pytest.raises(TypeError, match="got a dict"):
        cache(live)
