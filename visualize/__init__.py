"""Viewers of DEX traces: replay into per-round views, the lattice figure, HTML panels and charts.

Everything here draws from trace records (plain dicts, see ``dex_core.trace``) alone; it imports no
model code, so the app can render saved traces without torch.
"""

from .charts import ead_figure, race_figure, speedup_figure
from .graph import export_graph, lattice_graph
from .lattice import STATUS_COLORS, lattice_figure, node_status, node_statuses
from .panels import STAGE_COLORS, fsm_html, round_table_html, stats_html, tokens_html
from .replay import Replay, ReplayCache, RoundView, lattice_size, replay
from .summary import race_summary_html, readiness_table_html

__all__ = ["RoundView", "Replay", "ReplayCache", "replay", "lattice_size", "STATUS_COLORS", "STAGE_COLORS", "node_status",
           "node_statuses", "lattice_figure", "tokens_html", "fsm_html", "stats_html", "round_table_html",
           "race_figure", "ead_figure", "speedup_figure", "race_summary_html", "readiness_table_html",
           "lattice_graph", "export_graph"]
