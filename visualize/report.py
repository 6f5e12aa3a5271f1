"""Standalone HTML files (plotly.js inlined: they open from disk, offline, with no server):

- a DEX run: the text coloured by matched stage, the run's numbers, the timeline of every node and the
  lattice of its last round (``run_report_html``; the app's Debugger exports the same);
- a ``dex bench`` JSON report: its comparison chart.

``python -m visualize.report IN.json OUT.html`` reads either a trace (saved by ``dex generate --trace``
or the app), read as every trace is (``load_trace``: validated, then typed), or a bench report. Either way
every value from the file is escaped.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import plotly.graph_objects as go
from plotly.offline import get_plotlyjs

from dex_core.trace.events import EndEvent, Event
from dex_core.trace.files import load_trace
from dex_core.trace.schema import TRACE_FORMAT

from .charts import bench_figure
from .lattice import lattice_figure
from .markup import esc
from .palette import stage_legend_html
from .panels import round_table_html, stats_html, tokens_html
from .replay import replay
from .run_settings import settings
from .timeline import timeline_figure

_PAGE = (
    "<!DOCTYPE html><html><head><meta charset='utf-8'><title>{title}</title><script>{js}</script></head>"
    "<body style='font-family: system-ui, sans-serif; max-width: 1280px; margin: 16px auto; padding: 0 12px;'>"
    "{body}</body></html>"
)


def _figure(fig: go.Figure, div_id: str) -> str:
    return fig.to_html(full_html=False, include_plotlyjs=False, div_id=div_id, config={"responsive": True})


def standalone_html(title: str, body: str) -> str:
    """A page with plotly.js inlined around ``body`` (HTML built by this package)."""
    return _PAGE.format(title=esc(title), js=get_plotlyjs(), body=body)


def run_report_html(events: list[Event], meta: dict | None = None) -> str:
    """One DEX run (its typed events) as a standalone page: what ran (its settings in the page's words,
    ``run_settings``), the text, the numbers, the timeline and the last round."""
    views = replay(events)
    if not views:
        raise ValueError("this trace has no explorer rounds (an AR trace?): nothing to draw")
    last, start = views[-1], views.start
    end = events[-1] if isinstance(events[-1], EndEvent) else None
    meta = meta or {}
    facts = [
        ("model", meta.get("model", "not recorded")),
        ("prompt", meta.get("prompt", "not recorded")),
        *settings(start),
        ("rounds", len(views)),
        ("finished", end.stop if end else "no (stopped early)"),
    ]
    rows = "".join(
        f"<tr><th style='text-align: left; padding-right: 12px;'>{esc(k)}</th><td>{esc(v)}</td></tr>"
        for k, v in facts
    )
    body = (
        f"<h1>DEX run</h1><table>{rows}</table><h2>Text</h2>{tokens_html(last)}<h2>Numbers</h2>"
        f"{stats_html(last, end)}<h2>Timeline: every node of the run</h2>"
        f"{stage_legend_html(start.depths, 'stage')}{_figure(timeline_figure(events), 'dex-timeline')}"
        f"<h2>The last round</h2>{_figure(lattice_figure(last), 'dex-lattice')}{round_table_html(last)}"
    )
    return standalone_html("DEX run", body)


def write_run_report(events: list[Event], meta: dict | None, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(run_report_html(events, meta), encoding="utf-8")
    return path


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m visualize.report",
        description="A DEX trace or a dex bench JSON report as one standalone HTML file.",
    )
    parser.add_argument(
        "input", help="a trace (dex generate --trace, the app's Save) or JSON written by dex bench --out"
    )
    parser.add_argument("html", help="HTML file to write")
    args = parser.parse_args(argv)
    try:
        doc = json.loads(Path(args.input).read_text())
        if isinstance(doc, dict) and doc.get("format") == TRACE_FORMAT:
            write_run_report(*load_trace(args.input), args.html)  # sizes, schema, references checked; typed
        else:
            Path(args.html).parent.mkdir(parents=True, exist_ok=True)
            bench_figure(doc).write_html(args.html, include_plotlyjs=True)
    except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError, RecursionError) as err:
        print(
            f"visualize.report: error: {args.input} is not a readable DEX trace or dex bench report ({err})",
            file=sys.stderr,
        )
        return 2
    print(f"written to {args.html}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
