"""``dex bench`` reports: the headline comparison, markdown tables and the JSON file."""

from __future__ import annotations

import json
from pathlib import Path


def headline(report: dict) -> list[dict]:
    """Per set: the best DEX row (shipped variant) against the best-tuned self-speculation, by layer forwards."""
    out = []
    for set_name in report["oracle"]:
        rows = [r for r in report["results"] if r["set"] == set_name]
        dex = [r for r in rows if r["method"] == "dex" and r.get("decs", True) and r.get("adapters") ==
               bool(report["adapter_depths"])]
        ss = [r for r in rows if r["method"] == "self-spec"]
        if dex and ss:
            best = min(dex, key=lambda r: r["layer_forwards_per_token"])
            out.append({"set": set_name, "dex_explorers": best["explorers"], "dex_depths": best["depths"],
                        "dex_layer_forwards_per_token": best["layer_forwards_per_token"],
                        "self_spec_layer_forwards_per_token": ss[0]["layer_forwards_per_token"],
                        "dex_over_self_spec": ss[0]["layer_forwards_per_token"] / best["layer_forwards_per_token"]})
    return out


def _config_text(row: dict) -> str:
    if row["method"].startswith("dex"):
        return (f"K={row['explorers']} {row['depths']}, adapters {'on' if row['adapters'] else 'off'}, "
                f"DECS {'on' if row['decs'] else 'off'}")
    if "exit" in row:
        return f"exit {row['exit']}, draft {row['draft']}" + (", adapter" if row.get("adapters") else "")
    return ""


def markdown(report: dict) -> str:
    """The report as markdown tables, one per prompt set."""
    L = report["num_layers"]
    lines = [f"Model: {report['model']} ({L} layers); adapters at {report['adapter_depths'] or 'none'}; "
             f"{report['config']['max_new_tokens']} new tokens per prompt, greedy.", ""]
    for set_name, oracle in report["oracle"].items():
        rows = [r for r in report["results"] if r["set"] == set_name]
        lines += [f"**{set_name}** ({rows[0]['prompts']} prompts, {rows[0]['tokens']} tokens)", "",
                  "| method | configuration | exact | tokens/s (measured) | vs AR | projected tokens/s "
                  "| layer fwd/token | vs AR | rounds/token | depth speedup (measured / predicted) |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            cells = [r["method"], _config_text(r), f"{r['exact_prompts']}/{r['prompts']}",
                     f"{r['tokens_per_second']:.2f}", f"{r['speedup_vs_ar']:.3f}",
                     _fmt(r.get("projected_tokens_per_second"), 2), f"{r['layer_forwards_per_token']:.2f}",
                     f"{r['layer_speedup']:.3f}", _fmt(r.get("rounds_per_token"), 3),
                     " / ".join(_fmt(r.get(k), 3) for k in ("depth_speedup", "predicted_depth_speedup") if k in r)]
            lines.append("| " + " | ".join(cells) + " |")
        lines += [f"| EAD oracle | every depth, stable EAD | | | | | {oracle['layer_forwards_per_token']:.2f} | "
                  f"{oracle['speedup']:.3f} | | |", ""]
    for h in report.get("headline", []):
        lines.append(f"- {h['set']}: DEX K={h['dex_explorers']} {h['dex_depths']} needs {h['dex_layer_forwards_per_token']:.2f} layer "
                     f"forwards per token on the critical path, best-tuned self-speculation "
                     f"{h['self_spec_layer_forwards_per_token']:.2f}: **{h['dex_over_self_spec']:.3f}x**.")
    return "\n".join(lines) + "\n"


def write_outputs(report: dict, out: str | None, md: str | None) -> None:
    """The JSON report (``python -m visualize.report`` draws it as a chart) and the markdown tables."""
    for path, text in ((out, json.dumps(report, indent=1)), (md, markdown(report))):
        if path:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).write_text(text)


def _fmt(x, digits: int) -> str:
    return "" if x is None else f"{x:.{digits}f}"
