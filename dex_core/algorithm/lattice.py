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

The engine drives it: ``plan_round``, compute, ``record`` the candidates, ``commit`` while ``ready``.
Pruning (``plan_round(prune=B)``) starts at most B new slots (position children) per round, those
whose parent's candidate was the most probable first; the root and depth children are never pruned, so
every slot that exists finishes its stages. A pruned branch only loses reuse: when the matched stage's
position child was pruned, the next anchor starts from scratch, as after a miss. Which B pays depends on
the device (``device.resolve_prune``): B = 1 where a forward's cost grows with its rows (CPUs); none where
a batch costs its weights once (accelerators at small batch) and pruning only adds rounds.

Draft chains (``draft``, see ``dex_core.algorithm.draft``): a new stage-0 slot X (root or position child) whose
prefix ends with an n-gram seen earlier in the context gets a *chain*: slots X_1..X_m with the looked-up
continuation d_1..d_m as inputs (X_j predicts X's position + j, parent X_{j-1}), entering stage 0 with X
and moving down the stages with it; a chain whose last slot's prefix still finds a draft grows by more
slots the next round. With ``gate=1`` a chain slot is *cut* (with all under it) once the slot before it
has candidates and none equals its input. A node whose slot has a chain child starts a position child
only where its candidate differs from the chain's next input: the *recovery* branch, already under way
where the chain breaks (without it the next anchor would start from scratch). At a commit of y the next
anchor is the anchor's child with input y: its chain slot, else the position child of the shallowest
stage whose candidate is y. A chain slot started with its predecessor is as deep, so it commits in
the same round; one grown later commits once it has its K stages, within K - 1 rounds.
Exact: that child's prefix is the committed prefix followed by y, the new committed prefix. Its final
token was computed by the model's layers under exactly that prefix (tree attention over the committed KV
and its own ancestors) and chosen by the final sampler with its position's noise row: the token AR emits
there. The lookup only chose which prefixes to compute.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .draft import PromptLookup


@dataclass
class Slot:
    id: int
    position: int  # absolute position of the token this slot predicts
    input_token: int  # token at position - 1 under this slot's prefix
    parent: int | None  # slot whose candidate is input_token (None for a root slot)
    path: tuple[int, ...]  # uncommitted slots from the anchor down to this one, inclusive
    nodes: list[int] = field(default_factory=list)  # node id per computed stage
    drafted: bool = False  # a chain slot: its input token was looked up, not proposed
    chain_child: int | None = None  # the next slot of this slot's chain


@dataclass
class Node:
    id: int
    slot: int
    stage: int
    kind: str  # "root" | "depth" | "position" | "chain" (a chain slot's stage-0 node)
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
    chains: list[list[int]] = field(default_factory=list)  # per chain started this round, its stage-0 nodes


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
    drafted: bool = False  # the committed slot was a chain slot (its input a looked-up token)
    via: str = "root"  # how the next anchor was found: "chain", "position" or "root" (from scratch)


class Lattice:
    """Lattice of one decoding run for ``explorers`` stages.

    ``root_token`` is the last prompt token, ``root_position`` the first position to generate. With ``draft``
    (``DraftBounds``) chains are looked up in ``context`` (the prompt) and the commits, up to ``stop_position``.
    """

    def __init__(self, explorers: int, root_token: int, root_position: int, draft=None,
                 context: list[int] | None = None, stop_position: int | None = None):
        if explorers < 1:
            raise ValueError(f"need at least one explorer; got {explorers}")
        self.K = explorers
        self.draft, self.stop_position = draft, stop_position
        self.lookup = PromptLookup(list(context or [root_token]), draft.ngram) if draft else None
        self.cut: list[int] = []  # node ids the last record() cut; their slots and nodes by id until the next:
        self._gone, self._gone_nodes = {}, {}
        self.nodes: dict[int, Node] = {}
        self.slots: dict[int, Slot] = {}
        self.rounds = 0
        self.anchor: int | None = None  # slot id, set when the root is computed
        self._next_node = self._next_slot = self._room = 0
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
        if self.draft is not None:  # chain rows still free this round (the alive chain slots counted once)
            self._room = self.draft.rows - sum(s.drafted for s in self.slots.values())
        extend = self._extensions() if self.draft is not None else []
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
        chains = [self._grow(self.nodes[slot.nodes[0]], tokens) for slot, tokens in extend]
        heads = [] if self.draft is None else sorted((n for n in new if n.kind in ("root", "position")), key=lambda n: (
            n.kind != "root", -(self.nodes[n.parent].prob if n.parent in self.nodes else 1)))
        for head in heads:
            if len(chains) < self.draft.chains and (tokens := self._draft(self.slots[head.slot])):
                chains.append(self._grow(head, tokens))
        for chain in chains:
            batches[0] += chain
            new += chain
        self._latest = new
        return RoundPlan(self.rounds, state_before, batches, pruned, [[n.id for n in c] for c in chains])

    def _extensions(self) -> list[tuple[Slot, list[int]]]:
        """Chains whose last slot still finds a draft go on (at most ``chains``, shallowest first): (slot, tokens)."""
        ends = sorted((s for s in self.slots.values() if s.drafted and s.chain_child is None), key=lambda s: s.position)
        out = [(s, t) for s in ends[:self.draft.chains] if (t := self._draft(s))]
        first = {s.id: t[0] for s, t in out}  # pending branches that the chain's first slot repeats are dropped
        self._pending = [p for p in self._pending if p.kind != "position"
                         or first.get(self.nodes[p.parent].slot) != self.nodes[p.parent].token]
        return out

    def _draft(self, slot: Slot) -> list[int]:
        """The looked-up continuation of ``slot``'s prefix, within the bounds (it takes rows from ``_room``)."""
        d, stop = self.draft, self.stop_position
        room = min(d.length, self._room, d.length if stop is None else stop - slot.position)
        tokens = self.lookup.draft([self.slots[s].input_token for s in slot.path[1:]], room, d.min_ngram)
        self._room -= len(tokens)
        return tokens

    def _grow(self, head: Node, tokens: list[int]) -> list[Node]:
        """Chain slots with inputs ``tokens`` after ``head``'s slot, at stage 0 this round."""
        chain, parent = [], head
        for token in tokens:
            pslot = self.slots[parent.slot]
            sid, nid = self._next_slot, self._next_node
            self._next_slot, self._next_node = sid + 1, nid + 1
            self.slots[sid] = Slot(sid, pslot.position + 1, token, pslot.id, pslot.path + (sid,), [nid], drafted=True)
            pslot.chain_child = sid
            parent = self.nodes[nid] = Node(nid, sid, 0, "chain", parent.id, pslot.position + 1, token, self.rounds)
            chain.append(parent)
        return chain

    def _materialize(self, item: _Pending) -> Node:
        nid, self._next_node = self._next_node, self._next_node + 1
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
            sid, self._next_slot = self._next_slot, self._next_slot + 1
            self.slots[sid] = Slot(sid, position, token, parent_slot, path_head + (sid,))
            if item.kind == "root":
                self.anchor = sid
            node = Node(nid, sid, 0, item.kind, item.parent, position, token, self.rounds)
        self.slots[node.slot].nodes.append(nid)
        self.nodes[nid] = node
        return node

    def prior_tokens(self, node: Node) -> list[int]:
        """Candidates of the shallower stages of the node's slot chain (what DECS masks)."""
        slot = self.slots.get(node.slot) or self._gone[node.slot]
        return [(self.nodes.get(n) or self._gone_nodes[n]).token for n in slot.nodes[: node.stage]]

    def record(self, tokens: dict[int, int], probs: dict[int, float] | None = None) -> None:
        """Set the candidates (and their probabilities) of this round's nodes and queue their children."""
        if missing := [n.id for n in self._latest if n.id not in tokens]:
            raise ValueError(f"no candidate recorded for nodes {missing}")
        for node in self._latest:
            node.token = int(tokens[node.id])
            node.prob = float(probs.get(node.id, 1.0)) if probs else 1.0
        self.cut, self._gone, self._gone_nodes = [], {}, {}
        for node in self._latest:
            child = self.slots[node.slot].chain_child if node.id in self.nodes else None
            if child is not None and self.draft.gate and self.slots[child].input_token not in \
                    self.prior_tokens(node) + [node.token]:
                self._cut(child)
        for node in self._latest:
            if node.id not in self.nodes:
                continue
            if node.stage < self.K - 1:
                self._pending.append(_Pending("depth", node.id))
            child = self.slots[node.slot].chain_child  # a recovery branch only where the chain's input differs
            if child is None or self.slots[child].input_token != node.token:
                self._pending.append(_Pending("position", node.id))
        self._latest = []

    def _cut(self, slot_id: int) -> None:
        """Drop chain slot ``slot_id`` and every slot under it (called before their children are queued)."""
        gone = {s.id for s in self.slots.values() if slot_id in s.path}
        self.slots[self.slots[slot_id].parent].chain_child = None
        nodes = sorted(n.id for n in self.nodes.values() if n.slot in gone)
        self.cut += nodes
        self._gone_nodes.update((n, self.nodes.pop(n)) for n in nodes)
        self._gone.update((s, self.slots.pop(s)) for s in gone)

    def commit(self) -> CommitPlan:
        """Commit the anchor's final-stage token and collapse onto the matched subtree."""
        if not self.ready():
            raise RuntimeError(f"cannot commit in state {self.state} of {self.K}")
        anchor = self.slots[self.anchor]
        chain = list(anchor.nodes)
        candidates = [self.nodes[n].token for n in chain]
        y, k = candidates[-1], candidates.index(candidates[-1])
        child = self.slots.get(anchor.chain_child)
        if child is not None and child.input_token == y:
            new_root, via = child.nodes[0], "chain"
        else:
            new_root = self.nodes[chain[k]].position_child if k < self.K - 1 else None
            via = "root" if new_root is None else "position"
        if self.lookup is not None:
            self.lookup.extend(y)
        root_slot = None if new_root is None else self.nodes[new_root].slot
        kept_slots = {s.id for s in self.slots.values() if root_slot is not None and root_slot in s.path}
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
                          kept_slots, new_root, self.state, anchor.drafted, via)
