"""Draft chains: the token axis inside the lattice, planned beside it (``ChainPlanner``).

A new stage-0 slot X (root or position child) whose prefix ends with an n-gram seen earlier in the context (the
prompt and the commits, ``draft.PromptLookup``) gets a *chain*: slots X_1..X_m with the looked-up continuation
d_1..d_m as inputs (X_j predicts X's position + j, parent X_{j-1}), entering stage 0 with X and moving down the
stages with it; a chain whose last slot's prefix still finds a draft grows by more slots the next round. With
``gate=1`` a chain slot is *cut* (with all under it) once the slot before it has candidates and none equals its
input. A node whose slot has a chain child starts a position child only where its candidate differs from the
chain's next input: the *recovery* branch, already under way where the chain breaks. At a commit of y the next
anchor is the anchor's chain slot when its input is y. A chain slot started with its predecessor is as deep, so it
commits in the same round; one grown later commits once it has its K stages, within K - 1 rounds.

Exact: a chain slot's prefix is a committed prefix followed by its inputs; when it commits, its final token was
computed by the model under exactly the committed prefix and chosen by the final sampler with its position's noise
row: the token AR emits there. The lookup only chose which prefixes to compute.

The lattice calls its planner at three points: ``extensions`` and ``grow`` while it plans a round, ``cut`` and
``recovers`` while it inserts candidates, ``next_anchor`` and ``committed`` at a commit.
"""

from __future__ import annotations

from ..config import DraftBounds
from .draft import PromptLookup


class ChainPlanner:
    """The draft chains of one lattice: bounds, the lookup over the context, and the rows still free."""

    def __init__(self, bounds: DraftBounds, context: list[int], stop_position: int | None = None):
        self.bounds, self.stop = bounds, stop_position
        self.lookup = PromptLookup(list(context), bounds.ngram)
        self.room = 0  # chain rows still free this round
        self.right = self.tried = 0  # commits whose anchor had a chain slot: its input right; all

    def odds(self) -> float:
        """The chance a chain slot's input is right given its predecessor's: how often this run's chains were right
        at a commit so far, (right + 1) / (tried + 2). A run that copies its context keeps its chains; one whose
        drafts miss gives their rows to branches (docs/BENCHMARKS.md, "Chain rows at the rate this run's chains
        were right")."""
        return (self.right + 1) / (self.tried + 2)  # Laplace: 1/2 before the first

    def extensions(self, lattice) -> list[tuple]:
        """At the start of a round: the chains whose last slot still finds a draft (at most ``chains``, shallowest
        first) as (slot, tokens), and the queued branches their first new slot repeats dropped."""
        self.room = self.bounds.rows - sum(
            s.drafted for s in lattice.slots.values()
        )  # alive chain slots count
        ends = sorted(
            (s for s in lattice.slots.values() if s.drafted and s.chain_child is None),
            key=lambda s: s.position,
        )
        out = [(s, t) for s in ends[: self.bounds.chains] if (t := self._draft(lattice, s))]
        first = {s.id: t[0] for s, t in out}
        lattice.children = [
            c
            for c in lattice.children
            if c.kind != "position"
            or first.get(lattice.nodes[c.parent].slot) != lattice.nodes[c.parent].token
        ]
        return out

    def grow(self, lattice, extensions: list[tuple], new: list) -> list[list]:
        """After the round's nodes are made: the extensions, then chains for the new stage-0 slots (the root first,
        then the most probable branches), within ``chains`` per round; each chain as its stage-0 nodes."""
        chains = [self._grow(lattice, lattice.nodes[slot.nodes[0]], tokens) for slot, tokens in extensions]
        heads = sorted(
            (n for n in new if n.kind in ("root", "position")),
            key=lambda n: (
                n.kind != "root",
                -(lattice.nodes[n.parent].prob if n.parent in lattice.nodes else 1),
            ),
        )
        for head in heads:
            if len(chains) < self.bounds.chains and (
                tokens := self._draft(lattice, lattice.slots[head.slot])
            ):
                chains.append(self._grow(lattice, head, tokens))
        return chains

    def _draft(self, lattice, slot) -> list[int]:
        """The looked-up continuation of ``slot``'s prefix, within the bounds (it takes rows from ``room``)."""
        d = self.bounds
        room = min(d.length, self.room, d.length if self.stop is None else self.stop - slot.position)
        tokens = self.lookup.draft([lattice.slots[s].input_token for s in slot.path[1:]], room, d.min_ngram)
        self.room -= len(tokens)
        return tokens

    @staticmethod
    def _grow(lattice, head, tokens: list[int]) -> list:
        """Chain slots with inputs ``tokens`` after ``head``'s slot, at stage 0 this round."""
        chain, parent = [], head
        for token in tokens:
            parent = lattice.add_chain_slot(parent, token)
            chain.append(parent)
        return chain

    def cut(self, lattice, inserted: list) -> None:
        """With ``gate=1``: cut every chain slot whose predecessor's candidates (all its stages so far) all differ
        from its input, in the order of ``inserted`` (a slot under one cut already is gone with it)."""
        for node in inserted:
            child = lattice.slots[node.slot].chain_child if node.id in lattice.nodes else None
            if (
                child is not None
                and self.bounds.gate
                and lattice.slots[child].input_token not in lattice.prior_tokens(node) + [node.token]
            ):
                lattice.cut_chain(child)

    @staticmethod
    def recovers(lattice, node) -> bool:
        """Whether ``node`` starts a position child: always, but where its slot's chain goes on with the very token
        it proposed (that chain slot is the branch already)."""
        child = lattice.slots[node.slot].chain_child
        return child is None or lattice.slots[child].input_token != node.token

    @staticmethod
    def next_anchor(lattice, anchor, token: int) -> int | None:
        """The anchor's chain slot's first node when its input is the committed ``token``, else None."""
        child = lattice.slots.get(anchor.chain_child)
        return child.nodes[0] if child is not None and child.input_token == token else None

    def committed(self, token: int, chain_input: int | None) -> None:
        """``token`` was committed: the lookup's context grows by it; ``chain_input``, the committed anchor's chain
        slot's input (None: it had none), counts toward ``odds``."""
        self.lookup.extend(token)
        if chain_input is not None:
            self.right += chain_input == token
            self.tried += 1
