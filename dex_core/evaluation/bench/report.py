"""``dex bench`` reports: the headline comparison, markdown tables, the terminal's table and the JSON file."""

from __future__ import annotations

import json
import textwrap
from functools import partial
from pathlib import Path

from ...runtime.console import aligned


def quick_caveat(report: dict) -> str | None:
    """What a ``--quick`` run (``dex bench``, ``dex paper``: ``report`` is either's) says with each of its tables
    and findings: its model is a tiny random one, so its numbers check the pipeline and show nothing about DEX;
    None for a run on a real model."""
    if not report.get("config", {}).get("quick"):
        return None
    return (
        f"a tiny random {report['num_layers']}-layer model (--quick): a check of the pipeline, not a result"
    )


def _set_title(report: dict, set_name: str, rows: list[dict]) -> str:
    """A set's table title: its name (as given: markdown bolds it), prompts and tokens, and the quick caveat."""
    caveat = quick_caveat(report)
    title = f"{set_name} ({rows[0]['prompts']} prompts, {rows[0]['tokens']} tokens)"
    return title + (f" on {caveat}" if caveat else "")


def headline(report: dict) -> list[dict]:
    """Per set, one block: the cheapest DEX row (shipped variant) by cost per token (layer-equivalents,
    memory-bound, heads and adapters included) against AR and best-tuned self-speculation under the same
    count, with its depth-side speedup, the layers-only figures, tokens/s and device counts; and the DEX
    row with the highest projected K-device tokens/s (measured stage seconds, so this machine's view:
    on a compute-bound CPU that can be a pruned lattice, whose rows cost less than its extra rounds)."""
    out = []
    for set_name in report["oracle"]:
        rows = [r for r in report["results"] if r["set"] == set_name]
        shipped = bool(report["adapter_depths"])
        dex = [
            r for r in rows if r["method"] == "dex" and r.get("decs", True) and r.get("adapters") == shipped
        ]
        if dex:
            out.append(_block(set_name, dex, {r["method"]: r for r in rows}))
    return out


def _block(set_name: str, dex: list[dict], rows: dict) -> dict:
    """One set's headline from its DEX rows and the other methods' rows (by method)."""
    ar, ss, lookup = rows["ar-hf"], rows.get("self-spec"), rows.get("hf-prompt-lookup")
    best = min(dex, key=lambda r: r["cost_per_token"])
    block = {
        "set": set_name,
        "dex_explorers": best["explorers"],
        "dex_depths": best["depths"],
        "dex_devices": best["devices"],
        "dex_depth_speedup": best["depth_speedup"],
        "dex_cost_per_token": best["cost_per_token"],
        "ar_cost_per_token": ar["cost_per_token"],
        "dex_cost_share_of_ar": best["cost_per_token"] / ar["cost_per_token"],
        "dex_cost_full_heads": best.get("cost_per_token_full_heads"),
        "dex_proposal_vocab": best.get("proposal_vocab"),
        "dex_layer_forwards_per_token": best["layer_forwards_per_token"],
        "dex_tokens_per_second": best["tokens_per_second"],
        "ar_tokens_per_second": ar["tokens_per_second"],
        "dex_projected_tokens_per_second": best.get("projected_tokens_per_second"),
        "dex_projected_includes_communication": best.get("projected_includes_communication", False),
    }
    projected = [r for r in dex if r.get("projected_tokens_per_second")]
    if projected:
        fast = max(projected, key=lambda r: r["projected_tokens_per_second"])
        block.update(
            fastest_config=_config_text(fast),
            fastest_devices=fast["devices"],
            fastest_cost_share_of_ar=fast["cost_per_token"] / ar["cost_per_token"],
            fastest_rounds_per_token=fast["rounds_per_token"],
            fastest_projected_tokens_per_second=fast["projected_tokens_per_second"],
            fastest_projected_over_ar=fast["projected_tokens_per_second"] / ar["tokens_per_second"],
        )
    if ss:
        block.update(
            self_spec_cost_per_token=ss["cost_per_token"],
            self_spec_layer_forwards_per_token=ss["layer_forwards_per_token"],
            dex_cost_share_of_self_spec=best["cost_per_token"] / ss["cost_per_token"],
            dex_over_self_spec_layers_only=ss["layer_forwards_per_token"] / best["layer_forwards_per_token"],
        )
    if lookup:
        block.update(
            prompt_lookup_tokens_per_second=lookup["tokens_per_second"],
            prompt_lookup_over_ar=lookup["speedup_vs_ar"],
            dex_over_prompt_lookup=best["tokens_per_second"] / lookup["tokens_per_second"],
        )
    return block


def headline_lines(report: dict) -> list[str]:
    """The headline blocks as text."""
    lines, caveat = [], quick_caveat(report)
    lead = f", on {caveat}." if caveat else ":"
    for h in report.get("headline", []):
        full = f"; {h['dex_cost_full_heads']:.2f} with full heads" if h.get("dex_cost_full_heads") else ""
        line = (
            f"- {h['set']}{lead} DEX K={h['dex_explorers']} {h['dex_depths']} ({h['dex_devices']} devices, proposal "
            f"heads of {h.get('dex_proposal_vocab')} rows): depth-side speedup {h['dex_depth_speedup']:.3f}x (AR "
            f"through the same stages: 1); cost per token {h['dex_cost_per_token']:.2f} layer-equivalents "
            f"(memory-bound, heads and adapters included"
            f"{full}) vs AR {h['ar_cost_per_token']:.2f}: **{h['dex_cost_share_of_ar']:.3f} of AR's**"
        )
        if "self_spec_cost_per_token" in h:
            line += (
                f", {h['dex_cost_share_of_self_spec']:.3f} of best-tuned self-speculation's "
                f"{h['self_spec_cost_per_token']:.2f} (layers only: {h['dex_layer_forwards_per_token']:.2f} vs "
                f"{h['self_spec_layer_forwards_per_token']:.2f}; AR {h['ar_cost_per_token']:.2f} with its head)"
            )
        comm = "communication " + (
            "included" if h.get("dex_projected_includes_communication") else "not included"
        )
        line += (
            f"; tokens/s measured on one device {h['dex_tokens_per_second']:.2f} vs AR {h['ar_tokens_per_second']:.2f}"
            + (
                f", projected on {h['dex_devices']} devices {h['dex_projected_tokens_per_second']:.2f} = "
                f"{h['dex_projected_tokens_per_second'] / h['ar_tokens_per_second']:.3f}x AR ({comm})"
                if h.get("dex_projected_tokens_per_second")
                else ""
            )
            + (
                f"; HF prompt lookup {h['prompt_lookup_tokens_per_second']:.2f} tokens/s = "
                f"{h['prompt_lookup_over_ar']:.3f}x AR"
                if "prompt_lookup_over_ar" in h
                else ""
            )
            + "."
        )
        if h.get("fastest_config"):
            line += (
                f" Fastest projected DEX on this machine: {h['fastest_config']} — "
                f"{h['fastest_projected_tokens_per_second']:.2f} tokens/s on {h['fastest_devices']} devices = "
                f"**{h['fastest_projected_over_ar']:.3f}x AR's measured** ({comm}; a projection from measured "
                f"stage seconds), {h['fastest_rounds_per_token']:.3f} rounds/token, cost per token "
                f"{h['fastest_cost_share_of_ar']:.3f} of AR's (memory-bound)."
            )
        lines.append(line)
    return lines


def _config_text(row: dict, short: bool = False) -> str:
    """A row's configuration; ``short``: DEX's in the few words that tell its rows apart (the terminal's)."""
    if row["method"].startswith("dex") and short:
        drafted = [f"chains {row['drafted_share']:.0%}"] if row.get("draft", "none") != "none" else []
        off = [f"no {name}" for name, on in (("adapters", row["adapters"]), ("DECS", row["decs"])) if not on]
        pruned = [f"prune {row['prune']}"] if row.get("prune") else []
        return " ".join(
            [f"K={row['explorers']} [{','.join(map(str, row['depths']))}]", *pruned, *drafted, *off]
        )
    if row["method"].startswith("dex"):
        return (
            f"K={row['explorers']} {row['depths']}, adapters {'on' if row['adapters'] else 'off'}, "
            f"DECS {'on' if row['decs'] else 'off'}, proposal rows {row.get('proposal_vocab', 'full')}"
            + (f", prune {row['prune']}" if row.get("prune") else "")
            + (
                f", draft chains {row['draft']} ({row['drafted_share']:.0%} of tokens drafted)"
                if row.get("draft", "none") != "none"
                else ", no draft chains"
            )
        )
    if row["method"] == "ar-pipeline":
        return (
            f"K={row['explorers']} stages {row['depths']}, one process each: every token through all of them"
        )
    if row["method"] == "ar-tp":
        return f"{row['tp_size']} tensor-parallel ranks (transformers' tp_plan='auto')"
    if row["method"] == "hf-prompt-lookup":
        return f"up to {row['draft']} looked-up tokens per step ({row['rows_per_step']:.2f} rows per step)"
    if row["method"] in ("adadecode", "del"):
        rule = (
            f"threshold {row['threshold']}, up to {row['draft']} drafts"
            if "threshold" in row
            else "DEL's rule"
        )
        return f"exits {row['exits']}, {rule}"
    if "exit" in row and row["exit"] is None:
        return "no speculation (plain AR was cheapest on the tune split)"
    if "exit" in row:
        return f"exit {row['exit']}, draft {row['draft']}" + (", adapter" if row.get("adapters") else "")
    return ""


COLUMNS = (  # header, the terminal's header (None: not shown there), cell of a row (short: the terminal's)
    ("method", "method", lambda r, _: r["method"]),
    ("configuration", "configuration", _config_text),
    ("devices", None, lambda r, _: str(r["devices"])),
    ("identical to HF greedy", "identical", lambda r, _: f"{r['identical']}/{r['prompts']}"),
    (
        "certified tokens (worst gap)",
        "certified",
        lambda r, short: (
            f"{r['certified']}/{r['tokens']}" + ("" if short else f" ({r['certified_worst_gap']:.3g})")
        ),
    ),
    ("tokens/s (measured)", "tokens/s", lambda r, _: f"{r['tokens_per_second']:.2f}"),
    ("vs AR", "vs AR", lambda r, _: f"{r['speedup_vs_ar']:.3f}"),
    ("projected tokens/s", "projected", lambda r, _: _fmt(r.get("projected_tokens_per_second"), 2)),
    ("cost/token (LE, all work, memory-bound)", None, lambda r, _: f"{r['cost_per_token']:.2f}"),
    ("share of AR's", "cost/AR", lambda r, _: f"{r['cost_share_of_ar']:.3f}"),
    ("cost/token (rows-counted)", None, lambda r, _: f"{r['cost_per_token_rows']:.2f}"),
    ("layer fwd/token (layers only)", None, lambda r, _: f"{r['layer_forwards_per_token']:.2f}"),
    ("rounds/token", None, lambda r, _: _fmt(r.get("rounds_per_token", r.get("steps_per_token")), 3)),
    (
        "depth speedup (measured / predicted)",
        None,
        lambda r, _: " / ".join(_fmt(r.get(k), 3) for k in SPEEDUPS if k in r),
    ),
)
SPEEDUPS = ("depth_speedup", "predicted_depth_speedup")
ORACLE = "stable EAD at every depth (layers only; a reference, not a bound: DEX also reuses other matches)"
TERMINAL_WIDTH = 120  # dex bench's terminal lines; the markdown file and the JSON hold every column


def markdown(report: dict) -> str:
    """The report as markdown tables, one per prompt set."""
    lines = [_model_line(report), ""]
    for set_name, oracle in report["oracle"].items():
        rows = [r for r in report["results"] if r["set"] == set_name]
        layers = f"{oracle['layer_forwards_per_token']:.2f}"
        fwd = {"method": "EAD oracle", "configuration": ORACLE, "layer fwd/token (layers only)": layers}
        lines += [_set_title(report, f"**{set_name}**", rows), ""]
        lines += ["| " + " | ".join(c[0] for c in COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
        lines += ["| " + " | ".join(c[2](r, False) for c in COLUMNS) + " |" for r in rows]
        lines += ["| " + " | ".join(fwd.get(c[0], "") for c in COLUMNS) + " |", ""]
    lines += headline_lines(report)
    return "\n".join(lines) + "\n"


def _model_line(report: dict) -> str:
    device = report.get("device", "cpu")  # reports written before the device option ran on the CPU
    return (
        f"Model: {report['model']} ({report['num_layers']} layers) on {device}, every method (dex-distributed: "
        f"one {device.split(':')[0]} device per explorer); adapters at {report['adapter_depths'] or 'none'}; "
        f"{report['config']['max_new_tokens']} new tokens per prompt, greedy."
    )


def terminal(report: dict, md: str | None = None, out: str | None = None) -> str:
    """The report for a terminal, no line over ``TERMINAL_WIDTH``: per set the essential columns (the
    configuration cut to fit), the headline wrapped, and where the full tables are (``md``, ``out``)."""
    wrap = partial(textwrap.fill, width=TERMINAL_WIDTH, subsequent_indent="  ", break_on_hyphens=False)
    lines, shown = [wrap(_model_line(report)), ""], [c for c in COLUMNS if c[1]]
    for set_name, oracle in report["oracle"].items():
        rows = [r for r in report["results"] if r["set"] == set_name]
        cells = [[c[1] for c in shown]] + [[c[2](r, True) for c in shown] for r in rows]
        lines += [
            wrap(_set_title(report, set_name, rows)),
            *aligned(cells, TERMINAL_WIDTH, 1),
            f"EAD oracle: {oracle['layer_forwards_per_token']:.2f} layer forwards per token (stable EAD at every "
            "depth; a reference, not a bound)",
            "",
        ]
    files = " and ".join(path for path in (md, out) if path) or "--markdown FILE or --out FILE (JSON)"
    lines += [
        wrap(
            "tokens/s: measured here, one device; projected: DEX's on one device per explorer; cost/AR: cost per "
            f"token (layer-equivalents, memory-bound) as a share of AR's. Every column, full configurations: {files}."
        ),
        "",
        *(wrap(line.replace("**", "")) for line in headline_lines(report)),
    ]
    return "\n".join(lines)


def write_outputs(report: dict, out: str | None, md: str | None) -> None:
    """The JSON report (``python -m visualize.report`` draws it as a chart) and the markdown tables."""
    for path, text in ((out, json.dumps(report, indent=1)), (md, markdown(report))):
        if path:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).write_text(text)


def _fmt(x, digits: int) -> str:
    return "" if x is None else f"{x:.{digits}f}"
