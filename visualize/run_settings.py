"""A run's settings in the page's words, from its trace's start event: the Compare table, the run labels and the
exported HTML report all say them this way (``settings``), never as raw option names (``min_ngram=2``).

The words are the Live tab's: "Lattice pruning" is rows per stage a round, draft chains are chains of looked-up
tokens found by n-grams. Plain text: a caller escapes it (``markup.esc``), since a trace is untrusted input.
"""

from __future__ import annotations

from typing import NamedTuple

from dex_core.trace.events import StartEvent


class Setting(NamedTuple):
    label: str  # as the Compare table's row names it
    text: str  # plain text, not yet escaped


def sampling_text(start: StartEvent) -> str:
    """``greedy``, or ``temperature 0.7, top-k 50, seed 3`` (top-k and top-p only when set)."""
    s = start.sampling or {}
    if not s.get("temperature"):
        return "greedy"
    parts = [f"temperature {s['temperature']}"] + [
        f"{k.replace('_', '-')} {s[k]}" for k in ("top_k", "top_p") if s.get(k) is not None
    ]
    return ", ".join(parts + [f"seed {s.get('seed')}"])


def adapters_text(start: StartEvent) -> str:
    """Where inducing adapters were used ("off": none, or a trace made before they were recorded)."""
    return f"on, at depths {', '.join(map(str, start.adapter_depths))}" if start.adapter_depths else "off"


def pruning_text(start: StartEvent) -> str:
    """The row budget as the Live tab's "Lattice pruning" control means it."""
    return f"at most {start.prune} rows per stage a round" if start.prune else "none"


def draft_text(start: StartEvent) -> str:
    """Draft chains' bounds (``DraftBounds``) in words: ``chains of up to 8 looked-up tokens, n-grams 2–3, 1 new
    chain a round, at most 24 chain slots alive``; a bound the trace does not record is left out."""
    d = start.draft
    if not isinstance(d, dict):
        return "off (or a trace made before them)"
    low, high = d.get("min_ngram"), d.get("ngram")
    parts = [
        d.get("length") is not None and f"chains of up to {d['length']} looked-up tokens",
        high is not None and (f"n-grams {low}–{high}" if low not in (None, high) else f"n-grams of {high}"),
        d.get("chains") is not None and f"{d['chains']} new chain{'s' * (d['chains'] != 1)} a round",
        d.get("rows") is not None and f"at most {d['rows']} chain slots alive",
        bool(d.get("gate")) and "a chain slot cut once the slot before it proposes other tokens",
    ]
    return ", ".join(p for p in parts if p) or "on"


def settings(start: StartEvent) -> list[Setting]:
    """What a run was set to, in table order: K, depths, adapters, DECS, sampling, proposal heads, pruning,
    draft chains."""
    choice = f" ({start.depth_choice})" if isinstance(start.depth_choice, str) else ""
    proposal = start.proposal_vocab
    return [
        Setting("explorers K", str(len(start.depths))),
        Setting("depths", ", ".join(map(str, start.depths)) + choice),
        Setting("inducing adapters", adapters_text(start)),
        Setting("DECS", "on" if start.decs else "off"),
        Setting("sampling", sampling_text(start)),
        Setting("proposal heads (rows)", str(proposal) if proposal is not None else "not recorded"),
        Setting("lattice pruning", pruning_text(start)),
        Setting("draft chains", draft_text(start)),
    ]
