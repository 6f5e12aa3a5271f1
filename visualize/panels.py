"""HTML panels drawn from a ``RoundView``: committed text, FSM state and KV caches, live statistics,
and the per-round debugger table. Plain HTML with inline CSS; every value from a trace, strings and
numbers alike, passes ``markup.esc``/``markup.num`` (a trace file is untrusted input). Panels stay
compact at K = 8: node ids and per-explorer batches are behind ``<details>``, long tables scroll."""

from __future__ import annotations

from dataclasses import dataclass

from dex_core.trace.events import CommitRecord, EndEvent

from .lattice import token_texts
from .markup import esc, join, num
from .palette import DARK, INK, NOTE, PALE, ink_on, stage_colors, stage_legend_html
from .replay import RoundView

_BOX = "font-family: system-ui, sans-serif; font-size: 13px; line-height: 1.5;"
_TABLE = "border-collapse: collapse; margin: 4px 0 10px 0;"
_CELL = "border: 1px solid #d5d8dc; padding: 2px 6px; text-align: left; vertical-align: top;"
# The text's box: six whole lines (content-box: Gradio's border-box would take the padding out of them and cut the
# sixth), a long word broken rather than scrolled across, and a longer text scrolled to its end, which a stream
# adds to: a reversed flex column opens at its bottom, so the box shows the last line whatever the page redraws.
_TEXT_BOX = (
    "font-family: ui-monospace, monospace; padding: 6px; border: 1px solid #e5e8e8; box-sizing: content-box; "
    "min-height: 1.5em; max-height: 9em; overflow-y: auto; overflow-wrap: anywhere; display: flex; "
    "flex-direction: column-reverse;"
)


def _last(view_or_views) -> RoundView | None:
    if isinstance(view_or_views, RoundView):
        return view_or_views
    return view_or_views[-1] if view_or_views else None


def _quoted(text: str | None, token: int) -> str:
    return repr(text) if text is not None else f"#{token}"


def _stage_name(stage: int, depths) -> str:
    """A stage as the text names it: its depth first (``d=18``), so runs of any K read alike."""
    return f"d={int(depths[stage])}" + (" (final)" if stage == len(depths) - 1 else f" (E{stage})")


def _table(header: list[str], rows: list[list[str]]) -> str:
    """A table of cells that are already HTML (escaped by the caller)."""
    head = "".join(f"<th style='{_CELL} background: #f4f6f7; color: {INK};'>{h}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td style='{_CELL}'>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f"<div style='overflow-x: auto;'><table style='{_TABLE}'><tr>{head}</tr>{body}</table></div>"  # scrolls


_NEAR_TIE = "outline: 2px dashed #c0392b; outline-offset: -1px;"  # a near-tie commit's token
# a token committed from a draft-chain slot
_DRAFTED = "text-decoration: underline; text-decoration-thickness: 2px; text-underline-offset: 3px;"


def near_tie_sentence(commit: CommitRecord, dtype: str | None) -> str:
    """One sentence (HTML) on a near-tie commit; empty for other commits and traces without the key."""
    if commit.near_tie is not True:
        return ""
    margin = (
        f" were {num(commit.margin, '.4g')} apart" if commit.margin is not None else " were within rounding"
    )
    gap = f" (tie gap {num(commit.tie_gap, '.4g')})" if commit.tie_gap is not None else ""
    return (
        f"≈ Near-tie: the final layer's top two tokens{margin}, within {esc(dtype or 'the model dtype')} "
        f"rounding{gap}; <code>dex verify</code> certifies such tokens against the unmodified model."
    )


def tokens_html(view_or_views) -> str:
    """The committed text, one ``<span class="dex-tok">`` per token coloured by its matched stage (a
    near-tie commit outlined, with ≈ in its hover text; a drafted one, committed from a draft-chain slot,
    underlined); hovering a token shows every stage's anchor candidate for its position."""
    view = _last(view_or_views)
    if view is None:
        return f"<div style='{_BOX} color: {NOTE};'>no tokens yet</div>"
    depths = view.start.depths
    colours = stage_colors(depths)
    spans, ties, drafts = [], 0, 0
    for i, (token, text, stage, chain) in enumerate(
        zip(view.tokens, view.texts, view.matched, view.anchor_chains)
    ):
        title = " · ".join(
            f"{_stage_name(k, depths)} {_quoted(t_text, t)}" for k, (t, t_text) in enumerate(chain)
        )
        commit = view.token_commits[i] if i < len(view.token_commits) else None
        near, drafted = commit is not None and commit.near_tie is True, commit is not None and commit.drafted
        ties, drafts = ties + near, drafts + drafted
        shown = text if text is not None else f"⟨{token}⟩"
        attrs = (' data-near-tie="1"' if near else "") + (' data-drafted="1"' if drafted else "")
        title += (" · ≈ near-tie" if near else "") + (
            " · drafted: its input came from a draft chain" if drafted else ""
        )
        spans.append(
            f'<span class="dex-tok"{attrs} title="{esc(title)}" style="background: {colours[stage]}; '
            f"color: {ink_on(colours[stage])}; border-radius: 3px;{_NEAR_TIE if near else ''}"
            f'{_DRAFTED if drafted else ""}">{esc(shown)}</span>'
        )
    note = (
        (
            f"<div class='dex-near-ties' style='font-size: 11px; color: {NOTE};'><span style='{_NEAR_TIE} padding: "
            f"0 4px;'>≈</span> {ties} near-tie commit{'s' if ties != 1 else ''}: the final layer's top two tokens were "
            f"within {esc(view.start.dtype or 'the model dtype')} rounding (each round's table says by how "
            f"much)</div>"
        )
        if ties
        else ""
    )
    inside = (
        (
            f"<div class='dex-drafted' style='font-size: 11px; color: {NOTE}; font-family: system-ui, sans-serif;'>"
            f"<span style='{_DRAFTED}'>{drafts} drafted token{'s' if drafts != 1 else ''}</span>: committed from "
            f"draft-chain slots, whose input was looked up in the text so far (exact like every token)</div>"
        )
        if drafts
        else ""
    )  # inside the box: its second line, free under a short text (a K=8 page's height)
    return (
        f"<div style='{_BOX}'><div class='dex-text' style='{_TEXT_BOX}'><div style='white-space: pre-wrap;'>"
        f"{''.join(spans)}{inside}</div></div>{note}{stage_legend_html(depths)}</div>"
    )


def _chip(node_id: int, new: bool) -> str:
    style = (
        "display: inline-block; min-width: 22px; text-align: center; margin: 1px; padding: 0 3px; "
        "border-radius: 3px; font-size: 11px; "
    )
    style += (
        f"background: {DARK}; color: #fff; font-weight: bold;" if new else f"background: {PALE};"
    )  # greys: colours name stages
    return f"<span style='{style}'>{esc(node_id)}</span>"


def _stage_key(k: int, depths) -> str:
    colour = stage_colors(depths)[k]
    return (
        f"<span style='background: {colour}; color: {ink_on(colour)}; padding: 0 5px; "
        f"border-radius: 3px; white-space: nowrap;'>E{k} · d={esc(depths[k])}</span>"
    )


def kv_counts(view: RoundView) -> list[tuple[int, int]]:
    """Per explorer: (committed KV entries before this round's commits, lattice KV entries)."""
    committed = len(view.start.prompt) - 1 + len(view.tokens) - len(view.commits)
    per_stage = [0] * view.num_stages
    for node in view.nodes.values():
        per_stage[node.stage] += 1
    return [(committed, n) for n in per_stage]


def fsm_html(view: RoundView) -> str:
    """FSM state q before → after and, per explorer, its lattice nodes as counts (new this round in
    bold) with the ids on demand (``<details>``), and its KV view: committed prefix + lattice entries.
    A round along a draft chain commits several tokens: it says how many, and which were drafted."""
    depths = view.start.depths
    new, commits = set(view.new), view.commits
    n = len(commits)
    after = f"committed {n} token{'s' if n != 1 else ''} this round" if commits else "no commit"
    parts = [  # the heading wraps: never cut
        f"<div class='dex-fsm-head' style='font-size: 15px; margin-bottom: 6px;'>state "
        f"<b>q={esc(view.state_before)}</b> → <b>q={esc(view.state_after)}</b> <span class='dex-fsm-after' "
        f"style='color: {NOTE};'>({after}; lattice {len(view.nodes)} nodes)</span></div>"
    ]
    if n > 1 or any(c.drafted for c in commits):  # one line that scrolls across: a K=8 page keeps its height
        text = ", ".join(
            f"{_quoted(c.text, c.token)} at {c.position}" + (" (drafted)" if c.drafted else "")
            for c in commits
        )
        parts.append(
            "<div style='white-space: nowrap; overflow-x: auto; font-size: 12px; line-height: 1.25; margin: -5px 0 "
            f"4px 0;'><span class='dex-fsm-commits' title='{esc(text)}'>{esc(text)}</span></div>"
        )
    by_stage: list[list[int]] = [[] for _ in depths]
    for i, node in view.nodes.items():
        by_stage[node.stage].append(i)
    widest = max((len(ids) for ids in by_stage), default=1) or 1
    rows = []
    for k, (ids, (committed, lattice)) in enumerate(zip(by_stage, kv_counts(view))):
        fresh = sum(1 for i in ids if i in new)
        chips = "".join(_chip(i, i in new) for i in sorted(ids))
        nodes = (
            f"<details><summary><b>{len(ids)}</b> ({fresh} new)</summary>{chips}</details>"
            if ids
            else f"<span style='color: {NOTE};'>empty</span>"
        )
        bar = (
            f"<span style='display: inline-block; width: {round(60 * len(ids) / widest)}px; height: 10px; "
            f"background: {stage_colors(depths)[k]}; border: 1px solid #aab7b8; vertical-align: middle;'></span>"
        )
        plus = f" +{n}" if n else ""
        rows.append(
            [
                _stage_key(k, depths),
                nodes,
                f"<span style='white-space: nowrap;'>{bar} <b>{esc(committed)}</b>{plus} + "
                f"<b>{esc(lattice)}</b></span>",
            ]
        )
    parts.append(_table(["explorer", "nodes (new this round)", "KV entries: committed + lattice"], rows))
    if n:
        parts.append(
            f"<div style='font-size: 11px; color: {NOTE};'>+{n}: the token{'s' if n != 1 else ''} this round "
            f"commit{'s' if n == 1 else ''}</div>"
        )
    return f"<div style='{_BOX}'>{''.join(parts)}</div>"


def stage_counts(matched: list[int], stages: int) -> list[int]:
    """How many committed tokens each stage 0..stages-1 matched."""
    return [matched.count(k) for k in range(stages)]


def _histogram(matched: list[int], depths: list[int]) -> str:
    counts, colours = stage_counts(matched, len(depths)), stage_colors(depths)
    top = max(counts) if any(counts) else 1
    rows = []
    for k, (d, c) in enumerate(zip(depths, counts)):
        width = int(120 * c / top)
        rows.append(
            f"<div>{_stage_key(k, depths)} <span style='display: inline-block; width: {width}px; "
            f"height: 10px; background: {colours[k]}; border: 1px solid #aab7b8;'></span> {c}</div>"
        )
    return "".join(rows)


@dataclass(frozen=True)
class RunNumbers:
    """A run's progress up to a round: what the Live numbers panel and the comparison show."""

    tokens: int
    rounds: int
    rounds_per_token: float
    depth_speedup: float  # K / (rounds/token); AR through K stages = 1


def run_numbers(view: RoundView) -> RunNumbers:
    """Tokens, rounds, rounds/token and depth-side speedup of the run up to and including ``view``'s round."""
    tokens, rounds = len(view.tokens), view.round
    rpt = rounds / tokens if tokens else 0.0
    return RunNumbers(tokens, rounds, rpt, view.num_stages / rpt if tokens else 0.0)


def speed_items(stats, tokens: int) -> list[tuple[str, str]]:
    """A finished run's speeds, each under its glossary label (docs/APP.md): model tokens/s (the run's own compute
    and host work, what the Race's clock counts), end-to-end tokens/s where its reader (the page drawing and
    streaming its rounds) took time too, and the K-device projection, named as one."""
    items = []
    if stats.tokens_per_second:
        items.append(("model tokens/s", num(stats.tokens_per_second, ".1f")))
    if stats.reader_seconds and stats.end_to_end_tokens_per_second:
        items.append(("end-to-end tokens/s", num(stats.end_to_end_tokens_per_second, ".1f")))
    if stats.projected_seconds:
        items.append(("projected tokens/s", num(tokens / stats.projected_seconds, ".1f")))
    return items


def stats_html(view: RoundView, end: EndEvent | None = None) -> str:
    """Tokens, rounds, rounds/token, depth-side speedup K/(rounds/token), the tokens committed from draft
    chains (runs with chains), the matched-stage histogram, and (given the end event) its speeds
    (``speed_items``)."""
    n = run_numbers(view)
    items = [
        ("tokens", esc(n.tokens)),
        ("rounds", esc(n.rounds)),
        ("rounds/token", num(n.rounds_per_token, ".2f")),
        ("depth-side speedup", num(n.depth_speedup, ".2f") + "×"),
        ("lattice pruning", esc(f"≤ {view.start.prune} rows a stage" if view.start.prune else "none")),
    ]
    if view.start.draft:
        items.append(("drafted tokens", esc(sum(c.drafted for c in view.token_commits))))
    if end is not None:
        items += speed_items(end.stats, len(end.tokens))
    cells = "".join(
        f"<div style='display: inline-block; margin: 0 18px 6px 0;'><div style='font-size: 11px; "
        f"color: {NOTE};'>{esc(name)}</div><div style='font-size: 18px;'><b>{value}</b></div></div>"
        for name, value in items
    )
    return (
        f"<div style='{_BOX}'><div>{cells}</div><div style='font-size: 12px;'>matched stage"
        f"{_histogram(view.matched, view.start.depths)}</div></div>"
    )


def _cand(token: int, vocab: dict[int, str | None]) -> str:
    text = vocab.get(token)
    return esc(f"{text!r} ({token})" if text is not None else f"#{token} (no text)")


OPEN_ROWS = 8  # an explorer's batch is listed open up to this many nodes, else folded
_VIA = {
    "chain": "its chain slot",
    "position": "the matched stage's position child",
    "root": "a new root (from scratch)",
}


def round_table_html(view: RoundView) -> str:
    """Each explorer's batch this round (node, kind, position, candidate, top-k, DECS mask; a large
    batch folded), then each commit's decision (several along a draft chain; drafted ones marked) and the
    collapse sets, or "no commit this round", and the chain nodes cut. A node is one row of one line (its top-k
    never wraps): each table scrolls across, the whole box down (never clipped)."""
    parts = [
        f"<div style='font-size: 15px;'><b>Round {esc(view.round)}</b> · state q={esc(view.state_before)}→"
        f"{esc(view.state_after)} · anchor position {esc(view.commit_position)}</div>"
    ]
    parts += [_batch_html(view, k, batch) for k, batch in enumerate(view.batches)]
    commits = view.commits
    for j, c in enumerate(commits):
        parts += _commit_html(view, c, f" {j + 1} of {len(commits)}" if len(commits) > 1 else "")
    if commits:
        parts.append(
            f"<details><summary><b>Collapse</b> kept {len(view.kept)}, dropped {len(view.dropped)}</summary>"
            f"kept ({len(view.kept)}): {join(view.kept) or '—'}"
            f"<br>dropped ({len(view.dropped)}): {join(view.dropped) or '—'}</details>"
        )
    else:
        parts.append("<div><b>no commit this round</b></div>")
    if view.cut:
        parts.append(
            f"<details class='dex-cut'><summary><b>Cut</b> {len(view.cut)} draft-chain nodes: the slot before "
            f"each proposed another token</summary>{join(view.cut)}</details>"
        )
    return f"<div class='dex-round' style='{_BOX} max-height: 200px; overflow: auto;'>{''.join(parts)}</div>"


def _batch_html(view: RoundView, k: int, batch: list[int]) -> str:
    """Explorer ``k``'s batch this round as a table (folded when large), or "idle"."""
    vocab, rows = token_texts(view), []
    for i in batch:
        n = view.nodes[i]
        top = " · ".join(f"{_cand(t, vocab)} {num(p, '.3f')}" for t, p, *_ in n.top)
        top = f"<span style='white-space: nowrap;'>{top}</span>"  # one line a node: the table scrolls across
        masked = ", ".join(_cand(t, vocab) for t in n.masked) or "—"
        where = f"{esc(n.position)} (+{esc(n.position - view.commit_position)})"
        rows.append([esc(i), esc(n.kind), where, _cand(n.token, vocab), top, masked])
    title = f"{_stage_key(k, view.start.depths)} · batch of {len(batch)}"
    if not rows:
        return f"<div>{title} <span style='color: {NOTE};'>idle</span></div>"
    decs = "<span style='white-space: nowrap;'>DECS-masked</span>"  # the header one line: the table scrolls
    table = _table(["node", "kind", "position", "candidate", "top-k", decs], rows)
    opened = " open" if len(rows) <= OPEN_ROWS else ""
    return f"<details class='dex-batch'{opened}><summary>{title}</summary>{table}</details>"


def _commit_html(view: RoundView, c: CommitRecord, which: str) -> list[str]:
    """One commit: its token, matched stage and marks (near-tie, drafted, next anchor), then the anchor's table."""
    vocab, depths = token_texts(view), view.start.depths
    rows = [
        [
            esc(_stage_name(k, depths)),
            esc(nid),
            _cand(tok, vocab),
            "✓ matched" if k == c.matched_stage else "",
        ]
        for k, (nid, tok) in enumerate(zip(c.anchor_nodes, c.anchor_candidates))
    ]
    near = near_tie_sentence(c, view.start.dtype)
    badge = (
        f" <span class='dex-near-tie' style='{_NEAR_TIE} padding: 0 4px;'>≈ near-tie</span>" if near else ""
    )
    if c.drafted:
        badge += f" · <span class='dex-drafted' style='{_DRAFTED}'>drafted</span> (its input came from a draft chain)"
    badge += f" · next anchor: {esc(_VIA[c.via])}" if c.via in _VIA else ""
    parts = [
        f"<div><b>Commit{which}</b> token {_cand(c.token, vocab)} at position {esc(c.position)}, "
        f"matched at stage {esc(c.matched_stage)} (d={esc(depths[c.matched_stage])}){badge}</div>"
    ]
    if near:
        parts.append(f"<div style='font-size: 12px;'>{near}</div>")
    return parts + [_table(["stage", "anchor node", "candidate", ""], rows)]
