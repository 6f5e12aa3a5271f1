"""``python -m visualize.report REPORT.json OUT.html``: the chart of a ``dex bench`` JSON report, as one
standalone HTML file (plotly.js included, works offline)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .charts import bench_figure


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m visualize.report", description=__doc__.split(":", 1)[1])
    parser.add_argument("report", help="JSON written by dex bench --out")
    parser.add_argument("html", help="HTML file to write")
    args = parser.parse_args(argv)
    try:
        report = json.loads(Path(args.report).read_text())
        figure = bench_figure(report)
    except (OSError, ValueError, KeyError, TypeError) as err:
        print(f"visualize.report: error: {args.report} is not a readable dex bench report ({err})", file=sys.stderr)
        return 2
    Path(args.html).parent.mkdir(parents=True, exist_ok=True)
    figure.write_html(args.html, include_plotlyjs=True)
    print(f"chart written to {args.html}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
