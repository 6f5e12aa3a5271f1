"""HTML for whole-run summaries: the race between AR and DEX (what was measured first, the projection
after it, the jargon in a fold), and the readiness (EAD) table. Every value passes
``markup.esc``/``markup.num``."""

from __future__ import annotations

from .markup import esc, join, num

_BADGE = "padding:6px 10px;border-radius:6px;display:inline-block;margin:4px 0;background:"


def _devices(K) -> str:
    return f"{esc(K)} device{'s' * (K != 1)}"


def _clock(label: str, tokens: list, times: list, unit: str = "model tokens/s") -> tuple[str, float]:
    """The line "LABEL n tokens in t s (r UNIT)" and the rate r (0 before the first token): a measured lane's clock is
    its own compute and host work, what the glossary calls model tokens/s; the projected lane's, projected tokens/s."""
    n, t = len(tokens), (times[-1] if times else 0.0)
    rate = n / t if t else 0.0
    return f"{label} {esc(n)} tokens in {num(t, '.2f')} s ({num(rate, '.1f')} {unit})", rate


def race_summary_html(tokens: dict, times: dict, done: bool, facts: dict, stopped: str | None = None) -> str:
    """What the race measured, first and plainly: the identical-output badge (or why the race stopped:
    ``stopped``, e.g. "by you"), then DEX's measured speed against AR's on this machine, then the K-device
    projection as a projection, then (once DEX finished) its rounds per token; how all of it is counted
    (clocks, the projection's assumptions, the cost model's layer-equivalents, where DEX would win) is in
    a "how this is counted" fold. ``tokens``/``times``: ``{"ar", "dex"}`` (and ``times["proj"]``, DEX's
    projected clock) per committed token; ``facts``: ``K``, ``distributed``, ``first`` (the method that
    finished first) and, once DEX finished, ``depths``, ``rounds_per_token``, ``depth_speedup``,
    ``ar_cost``, ``dex_cost``, ``dex_cost_rows``."""
    ar, dex = tokens["ar"], tokens["dex"]
    if stopped:
        differ = next((i for i, (x, y) in enumerate(zip(ar, dex)) if x != y), None)
        agree = (
            f"the first {esc(min(len(ar), len(dex)))} agree"
            if differ is None
            else f"they differ from token {esc(differ)} on"
        )
        badge = (
            f"<div id='race-badge' data-state='stopped' style='{_BADGE}#fdebd0'>■ stopped {esc(stopped)}: AR "
            f"made {esc(len(ar))} tokens, DEX {esc(len(dex))} ({agree}); the panes keep them</div>"
        )
    elif done and ar == dex:
        badge = (
            f"<div id='race-badge' style='{_BADGE}#d9f7d9'>✓ identical output: DEX emitted exactly AR's "
            "tokens</div>"
        )
    elif done:
        badge = f"<div id='race-badge' style='{_BADGE}#fbdada'>✗ outputs differ</div>"
    else:
        badge = f"<div id='race-badge' style='{_BADGE}#eeeeff'>racing…</div>"
    K, distributed = facts["K"], facts.get("distributed", False)
    how = (
        f"distributed over {_devices(K)}, one explorer each"
        if distributed
        else f"sequential: its {esc(K)} explorers one after another on one device"
    )
    ar_name = f"AR (through the same {esc(K)} stages, one device each)" if distributed else "AR"
    ar_line, ar_rate = _clock(ar_name, ar, times["ar"])
    dex_line, dex_rate = _clock(f"DEX ({how})", dex, times["dex"])
    parts = [badge]
    if ar_rate and dex_rate:
        head = f"On this machine DEX ran at <b>{num(dex_rate / ar_rate, '.2f')}×</b> AR's speed (measured)"
        _, proj_rate = _clock("", dex, times.get("proj") or [])
        if not distributed and proj_rate:
            head += f"; on {_devices(K)} it would be about {num(proj_rate / ar_rate, '.2f')}× — a projection"
        parts.append(f"<div id='race-headline' style='font-size:15px;margin:4px 0'>{head}.</div>")
    parts.append(f"<div id='race-measured'><b>Measured</b>: {ar_line}; {dex_line}.</div>")
    if not distributed and times.get("proj"):
        proj_line, _ = _clock(
            f"DEX on {_devices(K)} (one per explorer)", dex, times["proj"], "projected tokens/s, a projection"
        )
        parts.append(f"<div id='race-projected'><b>Projected, not measured</b>: {proj_line}.</div>")
    if "rounds_per_token" in facts:
        parts.append(
            f"<div>DEX needed {num(facts['rounds_per_token'], '.2f')} rounds per token where a token that "
            f"walks all {esc(K)} explorers needs {esc(K)}: tokens came {num(facts['depth_speedup'], '.2f')}× "
            f"sooner in rounds (depths {join(facts['depths'])}).</div>"
        )
    return "".join(parts) + _how_counted(facts)


def _how_counted(f: dict) -> str:
    """The "how this is counted" fold: clocks, the projection, and (once DEX finished) the cost model."""
    K = f["K"]
    order = (
        "AR went first, then DEX, on the same explorer processes and devices (AR through the stages: each token "
        "walks all of them, K rounds per token)."
        if f.get("distributed")
        else f"AR and DEX were interleaved step by step under the same load until {esc(f['first'])} finished; "
        "the other then ran alone."
        if f.get("first")
        else "AR and DEX are interleaved step by step under the same load."
    )
    items = [
        f"<li><b>Clocks</b>: each method's own compute time. {order} Loading the model and timing this "
        "machine for the projection happen before both clocks start.</li>"
    ]
    if not f.get("distributed"):
        items.append(
            f"<li><b>The projection</b> assumes {_devices(K)}, one per explorer, each as fast as this one: a "
            "round lasts as long as its slowest explorer ran here, plus the exchange of hidden states "
            "between devices as timed on this machine (its profile; the distributed backend measures it "
            "for real).</li>"
        )
    if "dex_cost" in f:
        share = f["dex_cost"] / f["ar_cost"]
        items.append(
            f"<li><b>Cost per token</b> (the project's cost model) in layer-equivalents, the weights of one "
            f"decoder layer, LM heads and adapters included: DEX {num(f['dex_cost'], '.2f')} vs AR "
            f"{num(f['ar_cost'], '.2f')} when a forward of several rows costs its weights once "
            f"(memory-bound, as on a GPU at small batch); DEX {num(f['dex_cost_rows'], '.2f')} when every "
            "row counts, as on a CPU.</li>"
        )
        if share < 1:
            slack = (f["ar_cost"] - f["dex_cost"]) / f["rounds_per_token"]
            wins = (
                f"DEX K={esc(K)} does {num(share, '.2f')} of AR's work per token, so on {_devices(K)} where a "
                f"forward costs its weights it would reach {num(1 / share, '.2f')}× AR's tokens/s if exchanging "
                f"hidden states were free, and stay ahead of AR while one round's exchange takes less than "
                f"{num(slack, '.1f')} decoder layers do."
            )
        else:
            wins = (
                f"DEX K={esc(K)} does {num(share, '.2f')}× AR's work per token on this prompt: no device count "
                "makes it faster here. Better proposals (adapters), a cost-balanced exploration set or fewer "
                "explorers change that."
            )
        items.append(f"<li><b>Where DEX wins</b> (a projection from the cost model): {wins}</li>")
    return (
        "<details id='race-how' style='margin-top:6px'><summary>How this is counted</summary><ul "
        f"style='font-size:13px'>{''.join(items)}</ul></details>"
    )


def readiness_table_html(result: dict, adapter_depths) -> str:
    """Per K: uniform depths, S_X, DEX's K / rounds per token, cost per token of the uniform and the best
    exploration set (``dex_core.analysis.ead.readiness`` with ``best=True``, and ``cost``), in plain words."""
    costed = result["predicted"] and "cost_per_token" in result["predicted"][0]["uniform"]

    def cost(p):
        return (
            f"{num(p['cost_per_token'], '.1f')} ({num(p['cost_share_of_ar'], '.2f')} of AR's)"
            if costed
            else f"{num(p['pipeline_speedup'], '.3f')}× faster than AR"
        )

    rows = "".join(
        f"<tr><td>{esc(p['explorers'])}</td><td>{join(p['depths'])}</td>"
        f"<td>{num(p['uniform']['depth_speedup'], '.3f')}×</td><td>{num(p['speedup'], '.3f')}×</td>"
        f"<td>{cost(p['uniform'])}</td><td>{join(p['best']['depths'])}</td><td>{cost(p['best'])}</td></tr>"
        for p in result["predicted"]
    )
    lens = (
        f"Inducing adapters at depths {esc(sorted(adapter_depths))}; plain logit lens elsewhere."
        if adapter_depths
        else "Plain logit lens: no inducing adapters."
    )
    work = "work per token (layer-equivalents)" if costed else "pipeline time per token"
    return (
        "<table><tr><th>explorers K</th><th>depths (uniform split)</th>"
        "<th>DEX speedup in rounds</th><th>paper's S_X</th>"
        f"<th>{work}, uniform</th><th>best depths</th><th>{work}, best</th></tr>"
        + rows
        + "</table><ul style='font-size:13px'>"
        "<li><b>DEX speedup in rounds</b>: K divided by the rounds DEX needs per token — how much sooner "
        "tokens come than when every token walks all K stages (as DEX measures it, DECS included).</li>"
        "<li><b>Paper's S_X</b>: the speedup if each token could stop at the first explored depth from which "
        "every deeper layer agrees (its stable EAD). DEX can beat it: it also reuses a depth whose guess is "
        "right even if a deeper layer disagrees for a while.</li>"
        "<li><b>Work per token</b>: the cost model's layer-equivalents per token (LM heads and adapters "
        "included; AR = all layers + one head) and its share of AR's; <b>best depths</b> is the exploration "
        f"set with the least work.</li></ul><p>{esc(result['tokens'])} tokens; oracle S_EAD = "
        f"{num(result['oracle'], '.3f')}× (every depth explored). {lens}</p>"
    )


STATES = {
    "running": "#56B4E9",
    "stopped": "#E69F00",
    "finished": "#009E73",
    "error": "#D55E00",
    "example": "#CC79A7",
    "idle": "#BBBBBB",
}


def status_html(state: str, detail: str = "", elem: str = "dex-status") -> str:
    """One status line: the state as a coloured word (running / stopped / finished / error, or example /
    idle for a bundled or absent run) and a plain-text detail. ``data-state`` carries the state for tests."""
    if state not in STATES:
        raise ValueError(f"state must be one of {', '.join(STATES)}; got {state!r}")
    return (
        f"<div class='{esc(elem)}' data-state='{state}' style='font-family: system-ui, sans-serif; font-size: 14px; "
        f"padding: 4px 8px; border-left: 6px solid {STATES[state]}; background: #f8f9f9; color: #1f1f1f;'>"
        f"<b>{state}</b>{' · ' + esc(detail) if detail else ''}</div>"
    )
