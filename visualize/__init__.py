"""Viewers of DEX traces: replay into per-round views, the lattice and timeline figures, HTML panels,
charts and the standalone run report.

Everything here draws from trace records (plain dicts, see ``dex_core.trace``) alone; it imports no
model code, so the app can render saved traces without torch.
"""

from .compare import RunSide, compare_figure, compare_html
from .charts import depth_figure, ead_figure, race_figure, speedup_figure
from .graph import export_graph, lattice_graph
from .lattice import lattice_figure, node_status, node_statuses
from .palette import FATE_COLORS, OKABE_ITO, STATUS_COLORS, stage_color, stage_legend_html
from .panels import fsm_html, round_table_html, stats_html, tokens_html
from .replay import Replay, ReplayCache, RoundView, lattice_size, replay
from .report import run_report_html, write_run_report
from .summary import race_summary_html, readiness_table_html, status_html
from .timeline import timeline_figure

__all__ = ["RoundView", "Replay", "ReplayCache", "replay", "lattice_size", "OKABE_ITO", "STATUS_COLORS", "FATE_COLORS",
           "stage_color", "stage_legend_html", "node_status", "node_statuses", "lattice_figure", "timeline_figure",
           "tokens_html", "fsm_html", "stats_html", "round_table_html", "race_figure", "ead_figure", "speedup_figure", "depth_figure",
           "race_summary_html", "readiness_table_html", "status_html", "lattice_graph", "export_graph",
           "run_report_html", "write_run_report", "RunSide", "compare_html", "compare_figure"]
