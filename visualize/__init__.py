"""Viewers of DEX traces: replay into per-round views, the lattice and timeline figures, HTML panels,
charts and the standalone run report.

Everything here draws from a run's typed trace events (``dex_core.trace.events``: what a decoder streams, or
``load_trace`` of a saved one) alone, and refuses plain records (``replay.typed_events``); of ``dex_core`` it
imports only the trace package (its events and readers, torch-free), so the app can render saved traces without
torch. The modules that are also commands
(``python -m visualize.report``, ``python -m visualize.graph``) and the timeline, which imports the
graph, load on first use of one of their names: imported here eagerly, runpy would find them loaded
before it runs them and warn.
"""

import importlib

from .charts import depth_figure, ead_figure, race_figure, speedup_figure
from .compare import RunSide, compare_figure, compare_html, run_label
from .lattice import lattice_figure, node_status, node_statuses
from .palette import FATE_COLORS, OKABE_ITO, STATUS_COLORS, stage_color, stage_colors, stage_legend_html
from .panels import fsm_html, round_table_html, stats_html, tokens_html
from .replay import Replay, ReplayCache, RoundView, lattice_size, replay
from .summary import race_summary_html, readiness_table_html, status_html

_ON_FIRST_USE = {
    "export_graph": "graph",
    "lattice_graph": "graph",
    "run_report_html": "report",
    "write_run_report": "report",
    "timeline_figure": "timeline",
}


def __getattr__(name: str):
    if name not in _ON_FIRST_USE:
        raise AttributeError(f"module 'visualize' has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_ON_FIRST_USE[name]}", __name__), name)


__all__ = [
    "RoundView",
    "Replay",
    "ReplayCache",
    "replay",
    "lattice_size",
    "OKABE_ITO",
    "STATUS_COLORS",
    "FATE_COLORS",
    "stage_color",
    "stage_colors",
    "stage_legend_html",
    "node_status",
    "node_statuses",
    "lattice_figure",
    "timeline_figure",
    "tokens_html",
    "fsm_html",
    "stats_html",
    "round_table_html",
    "race_figure",
    "ead_figure",
    "speedup_figure",
    "depth_figure",
    "race_summary_html",
    "readiness_table_html",
    "status_html",
    "lattice_graph",
    "export_graph",
    "run_report_html",
    "write_run_report",
    "RunSide",
    "compare_html",
    "compare_figure",
    "run_label",
]
