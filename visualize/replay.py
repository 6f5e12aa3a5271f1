"""Replay of a DEX trace into one ``RoundView`` per round: the lattice as it stood during the round.

A round event only lists the nodes it created and the ids alive after it, so the views are rebuilt
by walking the events in order: the lattice during round r is ``alive`` after round r-1 plus the
nodes round r created, before round r's collapse. Views share nothing mutable with each other.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class RoundView:
    """The lattice and the decoding progress during one round (before its collapse)."""

    index: int                      # 0-based index among round events
    round: int                      # the trace's round number
    start: dict                     # the start event
    nodes: dict[int, dict]          # id -> node record of every node in the lattice this round
    new: list[int]                  # ids created this round
    dropped: list[int]              # ids this round's collapse discarded (empty without a commit)
    committed_ids: list[int]        # anchor node ids committed this round (empty without a commit)
    kept: list[int]                 # ids surviving this round's collapse (empty without a commit)
    commit: dict | None             # the round's commit record
    tokens: list[int]               # committed token ids up to and including this round
    texts: list[str | None]         # their texts
    matched: list[int]              # matched stage of each committed token
    anchor_chains: list[list[tuple[int, str | None]]]  # per token: (candidate, text) per stage
    state_before: int
    state_after: int
    commit_position: int            # absolute position of this round's anchor slot
    batches: list[list[int]]        # node ids each explorer computed
    timings: dict = field(default_factory=dict)

    @property
    def num_stages(self) -> int:
        return len(self.start["depths"])

    @property
    def final_node(self) -> int | None:
        """The anchor's final-stage node on a commit round."""
        return self.commit["anchor_nodes"][-1] if self.commit else None

    @property
    def matched_node(self) -> int | None:
        """The shallowest anchor node whose candidate equals the committed token."""
        return self.commit["anchor_nodes"][self.commit["matched_stage"]] if self.commit else None


def lattice_size(view: RoundView) -> int:
    return len(view.nodes)


def _chain(commit: dict, seen: dict[int, dict]) -> list[tuple[int, str | None]]:
    texts = [seen.get(i, {}).get("text") for i in commit["anchor_nodes"]]
    return list(zip(commit["anchor_candidates"], texts))


def replay(events: list[dict]) -> list[RoundView]:
    """One ``RoundView`` per round event of a DEX trace (an AR trace has none and gives [])."""
    if not events or events[0].get("event") != "start":
        raise ValueError("a trace must begin with its start event; got "
                         f"{events[0].get('event') if events else 'an empty list'}")
    start = events[0]
    seen: dict[int, dict] = {}
    alive: list[int] = []
    tokens: list[int] = []
    texts: list[str | None] = []
    matched: list[int] = []
    chains: list[list[tuple[int, str | None]]] = []
    views: list[RoundView] = []
    for event in events:
        if event.get("event") != "round":
            continue
        for node in event["nodes"]:
            seen[node["id"]] = node
        new = [node["id"] for node in event["nodes"]]
        present = dict.fromkeys(alive)
        present.update(dict.fromkeys(new))
        commit_position = len(start["prompt"]) + len(tokens)
        commit, collapse = event.get("commit"), event.get("collapse")
        if commit:
            tokens.append(commit["token"])
            texts.append(commit.get("text"))
            matched.append(commit["matched_stage"])
            chains.append(_chain(commit, seen))
        views.append(RoundView(
            index=len(views), round=event["round"], start=start,
            nodes={i: seen[i] for i in present}, new=new,
            dropped=list(collapse["dropped"]) if collapse else [],
            committed_ids=list(collapse["committed"]) if collapse else [],
            kept=list(collapse["kept"]) if collapse else [],
            commit=commit, tokens=tokens[:], texts=texts[:], matched=matched[:],
            anchor_chains=chains[:], state_before=event["state_before"],
            state_after=event["state_after"], commit_position=commit_position,
            batches=event["batches"], timings=event.get("timings", {})))
        alive = event["alive"]
    return views
