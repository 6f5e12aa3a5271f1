"""HTML for whole-run summaries: the race between AR and DEX, and the readiness (EAD) table. Every
value passes ``markup.esc``/``markup.num``."""

from __future__ import annotations

from .markup import esc, join, num

_BADGE = "padding:6px 10px;border-radius:6px;display:inline-block;margin:4px 0;background:"


def race_summary_html(tokens: dict, times: dict, done: bool, projected_label: str | None) -> str:
    """The identical-output badge and one line per clock. ``tokens``/``times``: ``{"ar", "dex"}`` (and
    ``times["proj"]``, DEX's projected clock, labelled ``projected_label``) per committed token."""
    if done and tokens["ar"] == tokens["dex"]:
        badge = f"<div id='race-badge' style='{_BADGE}#d9f7d9'>✓ identical output: DEX emitted exactly AR's tokens</div>"
    elif done:
        badge = f"<div id='race-badge' style='{_BADGE}#fbdada'>✗ outputs differ</div>"
    else:
        badge = f"<div id='race-badge' style='{_BADGE}#eeeeff'>racing…</div>"
    clocks = [("AR", tokens["ar"], times["ar"]), ("DEX", tokens["dex"], times["dex"])]
    if projected_label and times.get("proj"):
        clocks.append((projected_label, tokens["dex"], times["proj"]))
    lines = []
    for label, toks, ts in clocks:
        n, t = len(toks), (ts[-1] if ts else 0.0)
        lines.append(f"{esc(label)}: {esc(n)} tokens in {num(t, '.2f')} s ({num(n / t if t else 0, '.1f')} tokens/s)")
    return badge + "<div>" + "<br>".join(lines) + "</div>"


def readiness_table_html(result: dict, adapter_depths) -> str:
    """Per K: uniform depths, S_X, DEX's K / rounds per token, the pipeline speedups of the uniform and
    the best exploration set (``dex_core.ead.readiness`` with ``best=True``)."""
    rows = "".join(f"<tr><td>{esc(p['explorers'])}</td><td>{join(p['depths'])}</td>"
                   f"<td>{num(p['speedup'], '.3f')}×</td><td>{num(p['uniform']['depth_speedup'], '.3f')}×</td>"
                   f"<td>{num(p['uniform']['pipeline_speedup'], '.3f')}×</td>"
                   f"<td>{join(p['best']['depths'])}</td><td>{num(p['best']['pipeline_speedup'], '.3f')}×</td>"
                   f"<td>{num(p['best_gain'], '.3f')}×</td></tr>"
                   for p in result["predicted"])
    lens = (f"Inducing adapters at depths {esc(sorted(adapter_depths))}; plain logit lens elsewhere."
            if adapter_depths else "Plain logit lens: no inducing adapters.")
    return ("<table><tr><th>K</th><th>uniform depths</th><th>S_X (paper, stable EAD)</th>"
            "<th>DEX K / rounds per token (DECS)</th><th>uniform: L / (rounds × longest stage)</th>"
            "<th>best exploration set</th><th>best: L / (rounds × longest stage)</th><th>best vs uniform</th></tr>"
            + rows + "</table>"
            f"<p>{esc(result['tokens'])} tokens; oracle S_EAD = {num(result['oracle'], '.3f')}× (every depth explored). "
            "The best set minimises expected rounds per token × the longest stage — the time per token of a "
            f"pipeline, where non-uniform sets make every round as slow as their longest stage. {lens}</p>")


STATES = {"running": "#56B4E9", "stopped": "#E69F00", "finished": "#009E73", "error": "#D55E00", "example": "#CC79A7",
          "idle": "#BBBBBB"}


def status_html(state: str, detail: str = "", elem: str = "dex-status") -> str:
    """One status line: the state as a coloured word (running / stopped / finished / error, or example /
    idle for a bundled or absent run) and a plain-text detail. ``data-state`` carries the state for tests."""
    if state not in STATES:
        raise ValueError(f"state must be one of {', '.join(STATES)}; got {state!r}")
    return (f"<div class='{esc(elem)}' data-state='{state}' style='font-family: system-ui, sans-serif; font-size: 14px; "
            f"padding: 4px 8px; border-left: 6px solid {STATES[state]}; background: #f8f9f9;'>"
            f"<b>{state}</b>{' · ' + esc(detail) if detail else ''}</div>")
