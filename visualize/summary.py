"""HTML for whole-run summaries: the race between AR and DEX, and the readiness (EAD) table. Every
value passes ``markup.esc``/``markup.num``."""

from __future__ import annotations

from .markup import esc, join, num

_BADGE = "padding:6px 10px;border-radius:6px;display:inline-block;margin:4px 0;background:"


def race_summary_html(tokens: dict, times: dict, done: bool, projected_label: str | None, facts: dict | None = None) -> str:
    """The identical-output badge, one line per clock, and (``facts``, once DEX finished) its rounds per
    token, depth-side speedup and cost per token against AR's from the cost model, with what the
    K-device projection assumes and where DEX wins. ``tokens``/``times``: ``{"ar", "dex"}`` (and
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
    return badge + "<div>" + "<br>".join(lines) + "</div>" + (_race_facts(facts) if facts else "")


def _race_facts(f: dict) -> str:
    share = f["dex_cost"] / f["ar_cost"]
    order = (f"AR and DEX were interleaved step by step under the same load until {esc(f['first'])} finished; "
             "the other then ran alone." if f.get("first") else "AR and DEX were interleaved step by step.")
    if share < 1:
        slack = (f["ar_cost"] - f["dex_cost"]) / f["rounds_per_token"]
        wins = (f"DEX K={esc(f['K'])} does {num(share, '.2f')} of AR's work per token, so on {esc(f['K'])} memory-bound "
                f"devices (a GPU at batch 1: a forward costs its weights) it would reach {num(1 / share, '.2f')}× AR's "
                f"tokens/s if exchanging hidden states between devices were free, and break even while one round's "
                f"exchange stays under {num(slack, '.1f')} layer-times.")
    else:
        wins = (f"DEX K={esc(f['K'])} does {num(share, '.2f')}× AR's work per token on this prompt: no device count "
                "makes it faster here. Better proposals (adapters), a cost-balanced exploration set or fewer "
                "explorers change that.")
    return (f"<div style='margin-top:6px'>Rounds per token {num(f['rounds_per_token'], '.3f')}; depth-side speedup "
            f"K / rounds per token = {num(f['depth_speedup'], '.3f')}× (depths {join(f['depths'])}). Cost per token "
            f"(the project's cost model: layer-equivalents, LM heads and adapters included): DEX "
            f"{num(f['dex_cost'], '.2f')} (memory-bound; {num(f['dex_cost_rows'], '.2f')} when every row counts, as on a "
            f"CPU) vs AR {num(f['ar_cost'], '.2f')}.</div>"
            f"<div style='margin-top:6px'><b>Where DEX wins</b> (a projection from the cost model): {wins} The "
            f"projected clock above assumes one device per explorer, each as fast as this one, running its stage "
            f"as measured here, plus each round's exchange between devices as timed on this machine (its "
            f"profile; the distributed backend measures it for real). {order}</div>")


def readiness_table_html(result: dict, adapter_depths) -> str:
    """Per K: uniform depths, S_X, DEX's K / rounds per token, cost per token of the uniform and the best
    exploration set (``dex_core.ead.readiness`` with ``best=True``, and ``cost``), in plain words."""
    costed = result["predicted"] and "cost_per_token" in result["predicted"][0]["uniform"]

    def cost(p):
        return (f"{num(p['cost_per_token'], '.1f')} ({num(p['cost_share_of_ar'], '.2f')} of AR's)" if costed
                else f"{num(p['pipeline_speedup'], '.3f')}× faster than AR")

    rows = "".join(f"<tr><td>{esc(p['explorers'])}</td><td>{join(p['depths'])}</td>"
                   f"<td>{num(p['uniform']['depth_speedup'], '.3f')}×</td><td>{num(p['speedup'], '.3f')}×</td>"
                   f"<td>{cost(p['uniform'])}</td><td>{join(p['best']['depths'])}</td><td>{cost(p['best'])}</td></tr>"
                   for p in result["predicted"])
    lens = (f"Inducing adapters at depths {esc(sorted(adapter_depths))}; plain logit lens elsewhere."
            if adapter_depths else "Plain logit lens: no inducing adapters.")
    work = "work per token (layer-equivalents)" if costed else "pipeline time per token"
    return ("<table><tr><th>explorers K</th><th>depths (uniform split)</th>"
            "<th>DEX speedup in rounds</th><th>paper's S_X</th>"
            f"<th>{work}, uniform</th><th>best depths</th><th>{work}, best</th></tr>"
            + rows + "</table><ul style='font-size:13px'>"
            "<li><b>DEX speedup in rounds</b>: K divided by the rounds DEX needs per token — how much sooner "
            "tokens come than when every token walks all K stages (as DEX measures it, DECS included).</li>"
            "<li><b>Paper's S_X</b>: the speedup if each token could stop at the first explored depth from which "
            "every deeper layer agrees (its stable EAD). DEX can beat it: it also reuses a depth whose guess is "
            "right even if a deeper layer disagrees for a while.</li>"
            "<li><b>Work per token</b>: the cost model's layer-equivalents per token (LM heads and adapters "
            "included; AR = all layers + one head) and its share of AR's; <b>best depths</b> is the exploration "
            f"set with the least work.</li></ul><p>{esc(result['tokens'])} tokens; oracle S_EAD = "
            f"{num(result['oracle'], '.3f')}× (every depth explored). {lens}</p>")


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
