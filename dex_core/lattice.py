"""The depth x position lattice and its finite-state control, as pure bookkeeping (no model).

Vocabulary (DESIGN.md):
- A *slot* predicts the token at one absolute position under one prefix; its input token is the
  prefix's last token. The anchor slot predicts the commit position under the committed prefix.
- A *node* (exploration token, ETK) is one slot after one stage. Computing it yields a candidate.
- Every computed node spawns, for the next round, a *depth* child (same slot, next stage; none after
  the last stage) and a *position* child (a new slot whose input is the node's candidate, stage 0).
  So a lattice rooted q rounds ago holds 2^q - 1 nodes; the FSM state q counts the anchor's nodes.
- When the anchor has all K nodes, its last candidate y is committed. The shallowest anchor stage k
  whose candidate equals y selects the position child that becomes the next anchor; the lattice
  collapses onto that child's subtree. A token matched at stage k thus costs k + 1 rounds; with no
  earlier match (k = K - 1) the next anchor starts from scratch and the token costs K rounds.

The engine drives it: ``plan_round`` -> compute the planned nodes -> ``record`` their candidates ->
``commit`` once ``ready`` is true.

Pruning (``plan_round(prune=B)``) starts at most B new slots (position children) per round, those
whose parent's candidate was the most probable first; the root and depth children are never pruned, so
every slot that exists finishes its stages. A pruned branch only loses reuse: when the matched stage's
position child was pruned, the next anchor starts from scratch, as after a miss. Which B pays depends on
the device (``resolve_prune``): where a forward's cost grows with its rows (CPUs) B = 1 keeps every
explorer at one row; where a batch costs its weights once (accelerators at small batch) extra rows are
nearly free and pruning only adds rounds.
"""

from __future__ import annotations

from dataclasses import dataclass, field


def resolve_prune(prune, device_types) -> int | None:
    """The bound a decoder uses for option ``prune``: 'auto' is 1 when every explorer runs on CPU and off
    (None) on accelerators; a number or None is taken as given."""
    if prune != "auto":
        return prune
    return 1 if all(str(t).split(":")[0] == "cpu" for t in device_types) else None


@dataclass
class Slot:
    id: int
    position: int  # absolute position of the token this slot predicts
    input_token: int  # token at position - 1 under this slot's prefix
    parent: int | None  # slot whose candidate is input_token (None for a root slot)
    path: tuple[int, ...]  # uncommitted slots from the anchor down to this one, inclusive
    nodes: list[int] = field(default_factory=list)  # node id per computed stage


@dataclass
class Node:
    id: int
    slot: int
    stage: int
    kind: str  # "root" | "depth" | "position"
    parent: int | None  # depth parent (same slot) or the node whose candidate started this slot
    position: int
    input_token: int
    round: int  # round in which it was computed
    token: int | None = None  # candidate, set by record()
    prob: float = 1.0  # the candidate's probability at its stage, set by record() when given
    position_child: int | None = None


@dataclass
class _Pending:
    kind: str
    parent: int | None  # node id
    token: int = -1  # input token of a root item
    position: int = -1  # position of a root item


@dataclass
class RoundPlan:
    round: int
    state_before: int
    batches: list[list[Node]]  # per stage, the nodes to compute this round
    pruned: list[int] = field(default_factory=list)  # nodes whose position child was not started


@dataclass
class CommitPlan:
    position: int
    token: int
    matched_stage: int
    anchor_nodes: list[int]  # the committed anchor chain, stage 0..K-1
    anchor_candidates: list[int]
    committed_slot: int
    kept: list[int]  # node ids that survive (the matched subtree), ascending
    dropped: list[int]  # node ids discarded
    kept_slots: set[int]
    new_anchor: int | None  # node id of the next anchor's first node when it was already computed
    state_after: int


class Lattice:
    """Lattice of one decoding run for ``explorers`` stages.

    ``root_token`` is the last prompt token and ``root_position`` the first position to generate.
    """

    def __init__(self, explorers: int, root_token: int, root_position: int):
        if explorers < 1:
            raise ValueError(f"need at least one explorer; got {explorers}")
        self.K = explorers
        self.nodes: dict[int, Node] = {}
        self.slots: dict[int, Slot] = {}
        self.rounds = 0
        self.anchor: int | None = None  # slot id, set when the root is computed
        self._next_node = 0
        self._next_slot = 0
        self._pending: list[_Pending] = [_Pending("root", None, root_token, root_position)]
        self._latest: list[Node] = []

    @property
    def state(self) -> int:
        """FSM state q: rounds the anchor slot has completed (its computed stages)."""
        return 0 if self.anchor is None else len(self.slots[self.anchor].nodes)

    def ready(self) -> bool:
        """True when the anchor reached the final stage and its token can be committed."""
        return self.state == self.K

    def plan_round(self, prune: int | None = None) -> RoundPlan:
        """Materialize the pending children as this round's nodes, grouped by stage; with ``prune``, at
        most that many position children (the most probable parent candidates first)."""
        if self.ready():
            raise RuntimeError("the anchor is complete: commit before planning another round")
        state_before = self.state
        self.rounds += 1
        pruned: list[int] = []
        branches = [p for p in self._pending if p.kind == "position"]
        if prune is not None and len(branches) > prune:
            ranked = sorted(branches, key=lambda p: (-self.nodes[p.parent].prob, p.parent))
            cut = {id(p) for p in ranked[prune:]}
            pruned = sorted(p.parent for p in ranked[prune:])
            self._pending = [p for p in self._pending if id(p) not in cut]
        batches: list[list[Node]] = [[] for _ in range(self.K)]
        new: list[Node] = []
        for item in self._pending:
            node = self._materialize(item)
            batches[node.stage].append(node)
            new.append(node)
        self._pending = []
        self._latest = new
        return RoundPlan(self.rounds, state_before, batches, pruned)

    def _materialize(self, item: _Pending) -> Node:
        nid = self._next_node
        self._next_node += 1
        if item.kind == "depth":
            parent = self.nodes[item.parent]
            slot = self.slots[parent.slot]
            node = Node(nid, slot.id, parent.stage + 1, "depth", parent.id, slot.position,
                        slot.input_token, self.rounds)
        else:
            if item.kind == "root":
                token, position, parent_slot, path_head = item.token, item.position, None, ()
            else:
                parent = self.nodes[item.parent]
                pslot = self.slots[parent.slot]
                token, position, parent_slot, path_head = parent.token, pslot.position + 1, pslot.id, pslot.path
                parent.position_child = nid
            sid = self._next_slot
            self._next_slot += 1
            slot = Slot(sid, position, token, parent_slot, path_head + (sid,))
            self.slots[sid] = slot
            if item.kind == "root":
                self.anchor = sid
            node = Node(nid, sid, 0, item.kind, item.parent, position, token, self.rounds)
        self.slots[node.slot].nodes.append(nid)
        self.nodes[nid] = node
        return node

    def prior_tokens(self, node: Node) -> list[int]:
        """Candidates of the shallower stages of the node's slot chain (what DECS masks)."""
        slot = self.slots[node.slot]
        return [self.nodes[n].token for n in slot.nodes[: node.stage]]

    def record(self, tokens: dict[int, int], probs: dict[int, float] | None = None) -> None:
        """Set the candidates (and their probabilities) of this round's nodes and queue their children."""
        missing = [n.id for n in self._latest if n.id not in tokens]
        if missing:
            raise ValueError(f"no candidate recorded for nodes {missing}")
        for node in self._latest:
            node.token = int(tokens[node.id])
            node.prob = float(probs.get(node.id, 1.0)) if probs else 1.0
            if node.stage < self.K - 1:
                self._pending.append(_Pending("depth", node.id))
            self._pending.append(_Pending("position", node.id))
        self._latest = []

    def commit(self) -> CommitPlan:
        """Commit the anchor's final-stage token and collapse onto the matched subtree."""
        if not self.ready():
            raise RuntimeError(f"cannot commit in state {self.state} of {self.K}")
        anchor = self.slots[self.anchor]
        chain = list(anchor.nodes)
        candidates = [self.nodes[n].token for n in chain]
        y = candidates[-1]
        k = candidates.index(y)
        new_root = self.nodes[chain[k]].position_child if k < self.K - 1 else None
        kept_slots: set[int] = set()
        if new_root is not None:
            root_slot = self.nodes[new_root].slot
            kept_slots = {s.id for s in self.slots.values() if root_slot in s.path}
        kept = sorted(n.id for n in self.nodes.values() if n.slot in kept_slots)
        dropped = sorted(n.id for n in self.nodes.values()
                         if n.slot not in kept_slots and n.slot != anchor.id)
        self.nodes = {n: self.nodes[n] for n in kept}
        self.slots = {s: self.slots[s] for s in kept_slots}
        if new_root is None:
            self.anchor = None
            self._pending = [_Pending("root", chain[-1], y, anchor.position + 1)]
        else:
            self.anchor = self.nodes[new_root].slot
            self._pending = [p for p in self._pending if p.parent in self.nodes]
            for slot in self.slots.values():
                slot.path = slot.path[slot.path.index(self.anchor):]
        return CommitPlan(anchor.position, y, k, chain, candidates, anchor.id, kept, dropped,
                          kept_slots, new_root, self.state)
