"""The depth x position lattice and its finite-state control, as pure bookkeeping (no model).

Vocabulary (the paper's §3.2, lattice expansion and commit–collapse):
- A *slot* predicts the token at one absolute position under one prefix; its input token is the
  prefix's last token. The anchor slot predicts the commit position under the committed prefix.
- A *node* (exploration token, ETK) is one slot after one stage. Computing it yields a candidate.
- Every computed node spawns, for the next round, a *depth* child (same slot, next stage; none after
  the last stage) and a *position* child (a new slot whose input is the node's candidate, stage 0).
  So a lattice rooted q rounds ago holds 2^q - 1 nodes; the FSM state q counts the anchor's nodes.
- When the anchor has all K nodes, its last candidate y is committed (``validate_and_commit``): the
  shallowest anchor stage k whose candidate equals y (``first_match``) selects the position child that
  becomes the next anchor, and ``collapse`` keeps that child's subtree, nothing else. A token matched at stage
  k thus costs k + 1 rounds; with no earlier match (k = K - 1) the next anchor starts from scratch and the token
  costs K rounds. Exact: y is the final-depth token of the slot under the committed prefix.

The round loop drives it: ``plan_round``, compute, ``insert`` the candidates, ``validate_and_commit`` and
``collapse`` while ``ready``. A row budget (``plan_round(budget=B)``, the ``prune`` option) keeps at most B rows at
stage 0 a round (``trim``): the root, then the new rows worth most (``worth``): the chance the slot is reused,
``Slot.score`` (the product of the candidates' probabilities along the path from the anchor; a draft chain's slot
scores as the slot before it times the rate at which this run's chains were right so far, ``ChainPlanner.odds`` --
docs/BENCHMARKS.md, "The row budget by reuse" and "Chain rows at the rate this run's chains were right"), times the
rounds its reuse saves (a chain slot commits in its predecessor's round, a branch of stage k saves K - 1 - k -- "A
row budget that keeps what pays"). Depth children are never trimmed, so every slot that exists finishes its
stages, and since a stage's rows this round were the stage before's last round, no stage runs more than B rows.
A branch left out waits (``waiting``): the next round it competes again with the new rows, worth the rounds it would
still save, one fewer for each round it waited; when the matched stage's branch never started, the next anchor starts
from scratch, as after a miss. Which B pays depends on the device (``runtime.settings.resolve_prune``). Slots
keep their children (``Slot.children``), so cutting a chain and collapsing touch only the subtrees involved.
Draft chains (the token axis) are planned beside the lattice by a
``chains.ChainPlanner``, which it calls while it plans, inserts and commits.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from .chains import ChainPlanner

NodeKind = Literal["root", "depth", "position", "chain"]  # "chain": a chain slot's stage-0 node
ChildKind = Literal[
    "root", "depth", "position"
]  # what a queued child becomes (a chain node is made directly)
Via = Literal["chain", "position", "root"]  # how the next anchor was found ("root": from scratch)


@dataclass(slots=True)
class Slot:
    id: int
    position: int  # absolute position of the token this slot predicts
    input_token: int  # token at position - 1 under this slot's prefix
    parent: int | None  # slot whose candidate is input_token (None for a root slot)
    path: tuple[int, ...]  # uncommitted slots from the anchor down to this one, inclusive
    nodes: list[int] = field(default_factory=list)  # node id per computed stage
    drafted: bool = False  # a chain slot: its input token was looked up, not proposed
    chain_child: int | None = None  # the next slot of this slot's chain
    score: float = (
        1.0  # the probability that this slot is reused, relative to the anchor's (``Lattice.trim``)
    )
    children: list[int] = field(default_factory=list)  # the slots whose parent this is


@dataclass(slots=True)
class Node:
    id: int
    slot: int
    stage: int
    kind: NodeKind
    parent: int | None  # depth parent (same slot) or the node whose candidate started this slot
    position: int
    input_token: int
    round: int  # round in which it was computed
    token: int | None = None  # candidate, set by insert()
    prob: float = 1.0  # the candidate's probability at its stage, set by insert() when given
    position_child: int | None = None


@dataclass(slots=True)
class Child:
    """A node queued for the next round: a depth or position child of ``parent``, or a root (token, position)."""

    kind: ChildKind
    parent: int | None  # node id
    token: int = -1  # input token of a root
    position: int = -1  # position of a root


@dataclass
class RoundPlan:
    round: int
    state_before: int
    batches: list[list[Node]]  # per stage, the nodes to compute this round
    pruned: list[int] = field(default_factory=list)  # nodes whose position child was not started
    chains: list[list[int]] = field(default_factory=list)  # per chain started this round, its stage-0 nodes


@dataclass(frozen=True)
class Commit:
    """What ``validate_and_commit`` decided: the committed token y and the branch that survives."""

    position: int  # the commit position
    token: int  # y: the anchor's final-stage candidate
    matched_stage: int  # k: the shallowest anchor stage whose candidate is y (K - 1: none earlier)
    anchor_nodes: list[int]  # the committed anchor chain, stage 0..K-1
    anchor_candidates: list[int]
    anchor_slot: int
    next_anchor: int | None  # the first node of the slot that becomes the anchor (None: start from scratch)
    via: Via  # how the next anchor was found
    drafted: bool  # the committed slot was a chain slot (its input a looked-up token)


@dataclass(frozen=True)
class Collapse:
    """What ``collapse`` kept: the next anchor's subtree (nodes and slots); every other node is dropped."""

    kept: list[int]  # node ids, ascending
    dropped: list[int]  # node ids discarded (the committed anchor's own nodes are neither)
    kept_slots: set[int]
    state_after: int


NO_PROPOSAL = (
    -1
)  # the token of a node whose stage proposes nothing (AR through the stages): it starts no branch


def first_match(candidates: list[int], token: int) -> int:
    """The shallowest stage whose candidate is ``token`` (the final stage's always is)."""
    return candidates.index(token)


class Lattice:
    """Lattice of one decoding run for ``explorers`` stages. ``root_token`` is the last prompt token,
    ``root_position`` the first position to generate; ``chains`` plans draft chains (None: off)."""

    def __init__(
        self, explorers: int, root_token: int, root_position: int, chains: ChainPlanner | None = None
    ):
        if explorers < 1:
            raise ValueError(f"need at least one explorer; got {explorers}")
        self.K, self.chains = explorers, chains
        self.nodes: dict[int, Node] = {}
        self.slots: dict[int, Slot] = {}
        self.cut: list[int] = []  # node ids the last insert() cut (chain slots contradicted)
        self.rounds = 0
        self.anchor: int | None = None  # slot id, set when the root is computed
        self._next_node = self._next_slot = 0
        self.children: list[Child] = [
            Child("root", None, root_token, root_position)
        ]  # queued for the next round
        self._latest: list[Node] = []
        self.waiting: list[int] = []  # nodes whose branch the last round's budget left out (``trim``)

    @property
    def state(self) -> int:
        """FSM state q: rounds the anchor slot has completed (its computed stages)."""
        return 0 if self.anchor is None else len(self.slots[self.anchor].nodes)

    def ready(self) -> bool:
        """True when the anchor reached the final stage and its token can be committed."""
        return self.state == self.K

    def plan_round(self, budget: int | None = None) -> RoundPlan:
        """Materialize the queued children as this round's nodes, grouped by stage, then the round's draft chains;
        with ``budget``, at most that many rows at stage 0 (``trim``), hence at every stage."""
        if self.ready():
            raise RuntimeError("the anchor is complete: commit before planning another round")
        state_before = self.state
        self.rounds += 1
        self.children += self._waiting()
        extensions = self.chains.extensions(self) if self.chains else []
        new = [self._materialize(child) for child in self.children]
        self.children = []
        chains = self.chains.grow(self, extensions, new) if self.chains else []
        new += [n for chain in chains for n in chain]
        pruned = self.trim(new, budget) if budget is not None else []
        self.waiting = pruned
        batches: list[list[Node]] = [[] for _ in range(self.K)]
        for node in new:
            if node.id in self.nodes:
                batches[node.stage].append(node)
        self._latest = [n for n in new if n.id in self.nodes]
        chains = [[n.id for n in chain if n.id in self.nodes] for chain in chains]
        return RoundPlan(self.rounds, state_before, batches, pruned, [c for c in chains if c])

    def _waiting(self) -> list[Child]:
        """The branches the last round's budget left out, queued again: they compete with the new rows, worth the
        rounds they would still save (``worth``); gone once their node is, or once that is nothing."""
        return [
            Child("position", n)
            for n in self.waiting
            if n in self.nodes
            and self.nodes[n].position_child is None
            and self._saves(self.nodes[n], self.rounds) > 0
        ]

    def _saves(self, parent: Node, start: int) -> int:
        """The rounds a branch of ``parent``'s candidate started in round ``start`` saves when reused: K - 1 - k from
        stage k, one fewer for each round it waited (as many stages behind)."""
        return self.K - 1 - parent.stage - (start - 1 - parent.round)

    def trim(self, new: list[Node], budget: int) -> list[int]:
        """Keep at most ``budget`` of the new stage-0 rows ``new``: the root, then the rows worth most (``worth``: the
        chance the slot is reused, ``Slot.score`` -- the product of the candidates' probabilities along the path from
        the anchor; a chain slot's is its predecessor's times ``ChainPlanner.odds``; 0 for a twin of a branch that a
        shallower stage of the same slot started with the same token, which the commit never picks -- times the rounds
        its reuse saves). A row is worth at most its parent's and ties go to the older node, so no kept slot loses its
        parent. Returns the nodes whose position child was not started."""
        heads = [n for n in new if n.stage == 0]
        if len(heads) <= budget:
            return []
        ranked = sorted(heads, key=self.rank)
        pruned = []
        for node in sorted(ranked[budget:], key=lambda n: -n.id):  # a chain's deeper slots first
            slot = self.slots.pop(node.slot)
            del self.nodes[node.id]
            parent = self.slots[slot.parent]
            parent.children.remove(slot.id)
            if slot.drafted:
                parent.chain_child = None
            else:
                self.nodes[node.parent].position_child = None
                pruned.append(node.parent)
        return sorted(pruned)

    def rank(self, node: Node) -> tuple:
        """Where ``trim`` ranks a new stage-0 node, first kept first: the root, then by ``worth``, then the older
        (``benchmarks/chain_pricing.py`` measures other rankings against this one)."""
        return node.kind != "root", -self.worth(node), node.id

    def worth(self, node: Node) -> float:
        """What a new stage-0 row buys: its slot's ``score`` (the chance it is reused) times the rounds its reuse
        saves, K - 1 - k for a branch that a stage-k candidate started (its token then costs k + 1 rounds, not K; 0
        from the final stage, whose branch the commit never takes), less the rounds it waited (``waiting``), and K - 1
        for a draft chain's slot (it commits in its predecessor's round); at most its parent's when that is new this
        round, so no kept slot loses its parent."""
        slot = self.slots[node.slot]
        if node.kind == "root":
            return float("inf")
        saved = self.K - 1 if slot.drafted else self._saves(self.nodes[node.parent], node.round)
        above = self.nodes.get(self.slots[slot.parent].nodes[0])
        if above is not None and above.round == self.rounds:
            return min(slot.score * saved, self.worth(above))
        return slot.score * saved

    def _new_node(self, slot: int, stage: int, kind: NodeKind, parent: int | None) -> Node:
        s = self.slots[slot]
        node = Node(self._next_node, slot, stage, kind, parent, s.position, s.input_token, self.rounds)
        self._next_node += 1
        s.nodes.append(node.id)
        self.nodes[node.id] = node
        return node

    def _new_slot(
        self, position: int, token: int, parent: int | None, drafted: bool = False, odds: float = 1.0
    ) -> Slot:
        """A slot under ``parent`` (None: a root); ``odds``: the chance its input is right, given its parent's."""
        above = None if parent is None else self.slots[parent]
        path = () if above is None else above.path
        slot = Slot(self._next_slot, position, token, parent, path + (self._next_slot,), drafted=drafted)
        if above is not None:
            slot.score = above.score * odds
            above.children.append(slot.id)
        self.slots[slot.id] = slot
        self._next_slot += 1
        return slot

    def _materialize(self, child: Child) -> Node:
        if child.kind == "depth":
            parent = self.nodes[child.parent]
            return self._new_node(parent.slot, parent.stage + 1, "depth", parent.id)
        if child.kind == "root":
            slot = self._new_slot(child.position, child.token, None)
            self.anchor = slot.id
        else:
            parent = self.nodes[child.parent]
            above = self.slots[parent.slot]
            twin = any(self.slots[c].input_token == parent.token for c in above.children)
            # a twin of a branch a shallower stage of the same slot started is never reused (first_match)
            slot = self._new_slot(
                above.position + 1, parent.token, parent.slot, odds=0.0 if twin else parent.prob
            )
            parent.position_child = self._next_node
        return self._new_node(slot.id, 0, child.kind, child.parent)

    def add_chain_slot(self, parent: Node, token: int) -> Node:
        """A chain slot with looked-up input ``token`` after ``parent``'s slot, and its stage-0 node."""
        pslot = self.slots[parent.slot]
        slot = self._new_slot(pslot.position + 1, token, pslot.id, True, self.chains.odds())
        pslot.chain_child = slot.id
        return self._new_node(slot.id, 0, "chain", parent.id)

    def prior_tokens(self, node: Node) -> list[int]:
        """Candidates of the shallower stages of the node's slot chain (what DECS masks)."""
        return [self.nodes[n].token for n in self.slots[node.slot].nodes[: node.stage]]

    def insert(self, tokens: dict[int, int], probs: dict[int, float] | None = None) -> None:
        """Set the candidates (and their probabilities) of this round's nodes, cut the draft chains they
        contradict (``cut``) and queue the surviving nodes' children."""
        if missing := [n.id for n in self._latest if n.id not in tokens]:
            raise ValueError(f"no candidate recorded for nodes {missing}")
        for node in self._latest:
            node.token = int(tokens[node.id])
            node.prob = float(probs.get(node.id, 1.0)) if probs else 1.0
        self.cut = []
        if self.chains:
            self.chains.cut(self, self._latest)
        for node in self._latest:
            if node.id not in self.nodes:
                continue
            if node.stage < self.K - 1:
                self.children.append(Child("depth", node.id))
            if node.token == NO_PROPOSAL:
                continue
            if not self.chains or self.chains.recovers(self, node):
                self.children.append(Child("position", node.id))
        self._latest = []

    def cut_chain(self, slot_id: int) -> None:
        """Drop chain slot ``slot_id`` and every slot under it (called before their children are queued)."""
        gone = self._subtree(slot_id)
        parent = self.slots[self.slots[slot_id].parent]
        parent.chain_child = None
        parent.children.remove(slot_id)
        nodes = sorted(n for s in gone for n in self.slots[s].nodes)
        self.cut += nodes
        for n in nodes:
            del self.nodes[n]
        for s in gone:
            del self.slots[s]

    def _subtree(self, slot_id: int) -> list[int]:
        """``slot_id`` and every slot under it, by the children lists (linear in the subtree)."""
        out, todo = [], [slot_id]
        while todo:
            out.append(todo.pop())
            todo += self.slots[out[-1]].children
        return out

    def validate_and_commit(self) -> Commit:
        """Commit the anchor's final-stage token y; the branch that survives is the anchor's chain slot fed y, else
        the position child of the first anchor stage that proposed y (none when only the final stage did)."""
        if not self.ready():
            raise RuntimeError(f"cannot commit in state {self.state} of {self.K}")
        anchor = self.slots[self.anchor]
        candidates = [self.nodes[n].token for n in anchor.nodes]
        y = candidates[-1]
        k = first_match(candidates, y)
        chained = self.chains.next_anchor(self, anchor, y) if self.chains else None
        position = self.nodes[anchor.nodes[k]].position_child if k < self.K - 1 else None
        via = "chain" if chained is not None else "root" if position is None else "position"
        return Commit(
            position=anchor.position,
            token=y,
            matched_stage=k,
            anchor_nodes=list(anchor.nodes),
            anchor_candidates=candidates,
            anchor_slot=anchor.id,
            next_anchor=chained if chained is not None else position,
            via=via,
            drafted=anchor.drafted,
        )

    def collapse(self, commit: Commit) -> Collapse:
        """Keep the next anchor's subtree (its slots' nodes, re-rooted there) and drop every other node."""
        root = None if commit.next_anchor is None else self.nodes[commit.next_anchor].slot
        kept_slots = set() if root is None else set(self._subtree(root))
        if self.chains:
            chained = self.slots.get(self.slots[commit.anchor_slot].chain_child)
            self.chains.committed(commit.token, None if chained is None else chained.input_token)
        kept = sorted(n for s in kept_slots for n in self.slots[s].nodes)
        dropped = sorted(
            n.id for n in self.nodes.values() if n.slot not in kept_slots and n.slot != commit.anchor_slot
        )
        self.nodes = {n: self.nodes[n] for n in kept}
        self.slots = {s: self.slots[s] for s in kept_slots}
        if root is None:
            self.anchor = None
            self.children = [Child("root", commit.anchor_nodes[-1], commit.token, commit.position + 1)]
        else:
            self.anchor = root
            self.children = [c for c in self.children if c.parent in self.nodes]
            base = self.slots[root].score or 1.0  # scores stay relative to the anchor's
            for slot in self.slots.values():
                slot.path = slot.path[slot.path.index(root) :]
                slot.score /= base
        return Collapse(kept=kept, dropped=dropped, kept_slots=kept_slots, state_after=self.state)
