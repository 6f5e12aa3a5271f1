"""Many requests in the same rounds (``Crew``): the runs in flight on one set of explorers, advanced together.

Each request keeps its own run (``engine.Run``: lattice, sampler, stop conditions, trace, link) and its own *seat*
on every explorer (``model.explorer.Seat``: a lane of the stage's KV buffer and its tree masks). A round plans every
run's lattice, then each explorer runs **one step** over every run's batch (``Explorer.expand_seats``: the lanes are
the batch axis, so attention never crosses requests, and the stage's weights are read once for all of them), then
each run chooses its tokens with its own sampler and commits and collapses on its own (``engine.decide``).

A request joins between rounds: its seats are taken and its prompt goes through the stages in chunks of at most
``PREFILL_CHUNK`` tokens, one chunk before each round, so a long prompt delays the others' rounds by one chunk's
prefill at most; once its prompt is in, it runs in the next round. A run that finished, stopped or whose consumer
closed its stream leaves at the round's end and frees its seats. At most ``most`` requests are in flight: the one
past them replaces the oldest, which stops with ``DexError`` (a stream abandoned by its consumer, as a cancelled Gradio
event leaves one, cannot hold a seat). No thread of its own: whichever consumer needs an event runs the next round,
under one lock, and every run's events wait in its queue for its consumer.

A request's seconds are those of the rounds it was in, and of its own prefill: its model tokens/s is its tokens over
them (``GenerationStats.model_seconds``); the wall time it waited for its reader or for others' prefill is the rest.
"""

from __future__ import annotations

import contextlib
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Protocol

import torch

from ..config import SHARED_ROWS
from ..device import to_device
from ..model.explorer import Explorer, Seat
from ..model.view import ModelView
from ..shapes import bucket, padded
from ..values import DexError
from .engine import Run, begin, decide, decs_masks, ended, plan_round, recorded, reset
from .links import LocalLink
from .request import Request
from .settings import RunSettings
from .stage import batch_of, choose_round

# prompt tokens through the stages before a round, at most: the delay a joining prompt costs the others
PREFILL_CHUNK = 256


def replaced(most: int) -> str:
    """What a run replaced by a newer one says (``Crew``: past ``most`` runs in flight)."""
    many = "one run at a time" if most == 1 else f"{most} runs at a time"
    return (
        f"this decoder began another run before this one ended, and its explorers serve {many}: this run, the "
        "oldest, stopped. Let runs end (or close their streams) before starting more, or let more share the rounds "
        "(DexDecoder.share)."
    )


@dataclass(eq=False)
class Member:
    """One request in the crew: its run, its seats (one an explorer), its events for its consumer."""

    run: Run
    seats: list[Seat]
    prompt: list[int]  # prompt tokens its prefill has still to run (all but the prompt's last)
    events: deque = field(default_factory=deque)
    finished: bool = False  # its last round is queued
    done: bool = False  # its end event was given
    error: str | None = None  # why it stopped without an end event
    leaving: bool = False  # its consumer let it go: it leaves before the next round (``Crew._let_go``)


class Crew:
    """The runs in flight on ``explorers`` (every explorer of the schedule, in this process), at most ``most``."""

    def __init__(self, view: ModelView, settings: RunSettings, explorers: list[Explorer], most: int = 1):
        self.view, self.settings, self.explorers, self.most = view, settings, explorers, most
        self.link = (
            LocalLink  # a run's link (each its own): an explorer rank's are ``distributed.crew_wire``'s
        )
        self.wire: Wire | None = None  # what carries a round's rows and choices between processes (none: one)
        # the ranks that follow this crew's (torchrun): told before each step who joined ("join", request) and left
        # ("leave", request id) since the last, to do the same (``distributed.torchrun``); None: no followers
        self.tell = None
        self._told: list = []
        self.members: list[Member] = []  # in the order they joined
        self.rows = 0  # the rows the last round ran, every stage's and every lane's (padding included)
        self.rounds = 0  # shared rounds run
        self._lock = (
            threading.RLock()
        )  # one round at a time; re-entrant: a stream closed mid-round lets go under it
        self._busy = False  # a round (or a prefill chunk) under way: nobody leaves before it ends

    def take(self, request: Request):
        """``request``'s trace events (its rounds, then its end event), its rounds shared with every run in flight."""
        with self._lock:
            self._drop_leaving()
            member = self._join(request)
        try:
            while True:
                with self._lock:
                    while not member.events and not member.finished and member.error is None:
                        self._advance()
                    if member.events:
                        event = member.events.popleft()
                    elif member.error is not None:
                        raise DexError(member.error)
                    elif member.done:
                        return
                    else:  # made now: its wall time ends after its reader had its last round
                        event, member.done = ended(member.run, None), True
                yield event
        finally:
            self._let_go(member)

    def _let_go(self, member: Member) -> None:
        """``member``'s consumer is done with it (its stream ended or was closed): it leaves now, or before the next
        round when one is under way: in this thread (the collector closed its stream mid-round), or in another (a
        closing event loop is not kept waiting for a round)."""
        member.leaving = True
        if self._lock.acquire(blocking=False):
            try:
                if not self._busy:
                    self._leave(member)
            finally:
                self._lock.release()

    def _drop_leaving(self) -> None:
        for m in [m for m in self.members if m.leaving]:
            self._leave(m)

    def _join(self, request: Request) -> Member:
        """A member for ``request``: its seats taken (the oldest member stopped when all are taken), its run begun;
        its seats given back if that fails."""
        if len(self.members) >= self.most:
            oldest = self.members[0]
            self._leave(oldest)
            oldest.error = replaced(self.most)
        seats = [e.add_seat() if self.members else e.seats[0] for e in self.explorers]
        try:
            run = begin(self.view, self.settings, self.explorers, self.link(), request)
            run.overlap = (
                False  # each round recorded at once: the runs of a crew share its steps, not its records
            )
            member = Member(run, seats, list(request.prompt[:-1]))
            with seated(member), run.clock.span("prefill"):
                reset(run)
        except BaseException:
            if self.members:
                for e, seat in zip(self.explorers, seats):
                    e.remove_seat(seat)
            raise
        self.members.append(member)
        if self.tell is not None:
            self._told.append(("join", request))
        return member

    def _leave(self, member: Member) -> None:
        """``member`` out of the crew, its seats freed (nothing when it left already)."""
        if member not in self.members:
            return
        self.members.remove(member)
        if self.tell is not None:
            self._told.append(("leave", member.run.request.id))
        for e, seat in zip(self.explorers, member.seats):
            e.remove_seat(seat)

    def _advance(self) -> None:
        """One chunk of a joining member's prompt (a failure there ends that member alone), then one round of every
        member whose prompt is in (a failure there ends every member in flight with its message)."""
        self._drop_leaving()
        self._busy = True
        try:
            if self.tell is not None:  # the followers' membership, before their step
                told, self._told = self._told, []
                self.tell(told)
            self._prefill()
            flying = [m for m in self.members if not m.prompt and not m.finished and not m.leaving]
            for m in flying:
                m.run.prune = share(self.settings.prune, len(flying), self.view.device.type)
            if flying:
                self.rows = shared_round(flying, self.explorers, self.view, self.wire)
                self.rounds += 1
            for m in flying:
                if m.finished:
                    self._leave(m)
        except Exception as err:
            for m in list(self.members):
                m.error = f"the round failed: {err}"
                self._leave(m)
            raise
        finally:
            self._busy = False

    def _prefill(self) -> None:
        """The next chunk of the first joining member's prompt; if it fails, that member ends with the error."""
        joining = next((m for m in self.members if m.prompt and not m.leaving), None)
        if joining is None:
            return
        try:
            prefill(joining, self.view)
        except Exception as err:
            if (
                self.wire is not None
            ):  # between processes its peers wait on it: the group fails (``distributed``)
                raise
            joining.error = f"its prompt failed to go in: {err}"
            self._leave(joining)


def share(prune: int | None, flying: int, device: str) -> int | None:
    """A request's row budget in a round that ``flying`` requests share: its even share of the device's
    ``SHARED_ROWS`` a stage, down to a power of two, at least 1 (its anchor), at most ``prune`` (its own); unbounded
    stays unbounded."""
    if prune is None:
        return None
    rows = SHARED_ROWS["cpu" if device == "cpu" else "accelerator"] // flying
    bucketed = 1 << (rows.bit_length() - 1) if rows else 1  # a bucket: no lane runs padding for it
    return max(1, min(prune, bucketed))


def prefill(member: Member, view: ModelView) -> None:
    """The next chunk of ``member``'s prompt through every stage (its own seconds: the run's prefill span)."""
    chunk, member.prompt = member.prompt[:PREFILL_CHUNK], member.prompt[PREFILL_CHUNK:]
    run = member.run
    with seated(member), run.clock.span("prefill"):
        run.link.prefill(run.explorers, view, chunk)


class Wire(Protocol):
    """What carries a shared round between explorer processes (``distributed.crew_wire``); in one process, nothing."""

    def post(self, k: int, out: torch.Tensor, plans: dict) -> None:
        """Explorer ``k``'s output rows of every lane ``out`` (lanes, rows, hidden) are ready, before its head."""

    def gather(self, members: list[Member], plans: dict, choices: dict) -> None:
        """Every member's choices (member -> {stage: Choice}) to every process, in one exchange: each member's
        link then gives its run every stage's outputs."""


def shared_round(
    members: list[Member], explorers: list[Explorer], view: ModelView, wire: Wire | None = None
) -> int:
    """One round of every run of ``members``, each explorer's step shared (between processes over ``wire``): every
    member's round event queued for its consumer (its end event is made when its consumer asks for it:
    ``Crew.take``). Returns the rows its steps ran."""
    with contextlib.ExitStack() as rounds:
        for m in members:  # each run's round: the whole shared round's seconds
            rounds.enter_context(m.run.clock.span("round"))
        plans, masked = {}, {}
        for m in members:
            plans[m] = plan_round(m.run)
            masked[m] = decs_masks(m.run, plans[m])
        expanded = explore_all(members, plans, explorers, view, wire)
        choices, decided = {}, {}
        for m in members:
            with seated(m), m.run.clock.span("decode"):
                choices[m] = choose_round(m.run.choosing, explorers, plans[m], expanded[m], masked[m])
        if wire is not None:
            wire.gather(members, plans, choices)
        for m in members:
            with seated(m):
                decided[m] = decide(m.run, plans[m], masked[m], choices[m])
    for m in members:
        m.events.append(recorded(m.run, decided[m]))
        m.finished = m.run.finished
    return rows_run(members, plans, len(explorers[0].seats))


def rows_run(members: list[Member], plans: dict, lanes: int) -> int:
    """The rows a shared round's steps ran, every stage's and every one of its ``lanes``' (padding included): read
    off the plans, which every process holds, so that an explorer rank counts its peers' steps as the sequential
    schedule counts them."""
    return sum(step_rows(members, plans, k) for k in range(len(plans[members[0]].batches))) * lanes


def step_rows(members: list[Member], plans: dict, k: int) -> int:
    """The rows every lane runs in stage ``k``'s step this round: its longest batch's, in a bucket; 0 where no member
    has nodes there (the stage runs no step)."""
    longest = max(len(plans[m].batches[k]) for m in members)
    return bucket(longest) if longest else 0


def explore_all(
    members: list[Member], plans: dict, explorers: list[Explorer], view: ModelView, wire=None
) -> dict:
    """Every explorer's step over every member's batch (``expand_seats``; its output rows posted on ``wire`` before
    its head) and its candidate logits: member -> {stage: (its output rows, its logits or None)} for the stages where
    it has nodes."""
    expanded: dict = {m: {} for m in members}
    owner = {id(seat): m for m in members for seat in m.seats}
    for e in explorers:
        k = e.index
        rows = step_rows(members, plans, k)
        if not rows:
            continue
        lanes = [(seat, owner.get(id(seat))) for seat in e.seats]  # lane order; a seat no member holds idles
        hidden, tables, books = [], [], []
        for seat, m in lanes:
            nodes = plans[m].batches[k] if m is not None else []
            paths = [m.run.lattice.slots[n.slot].path for n in nodes]
            with e.seated(seat):
                batch = batch_of(e, nodes, paths, view.device, rows)
            hidden.append(lane_inputs(e, m, nodes, batch, view))
            tables.append(batch.table)
            books.append((batch.slots, batch.inputs))
        with contextlib.ExitStack() as spans:
            for m in members:
                spans.enter_context(m.run.clock.span(("expand", k)))
            out = e.expand_seats(stacked(hidden), [s for s, _ in lanes], tables, books)
            if wire is not None:
                wire.post(k, out, plans)
            real = [
                (b, m, len(plans[m].batches[k]))
                for b, (_, m) in enumerate(lanes)
                if m and plans[m].batches[k]
            ]
            proposes = e.final or any(not m.run.request.pipeline for m in members)
            logits = proposed(e, out, real, view) if proposes else None
        at = 0
        for b, m, n in real:
            mine = None if logits is None or (m.run.request.pipeline and not e.final) else logits[at : at + n]
            expanded[m][k], at = (out[b], mine), at + n
    return expanded


def proposed(e: Explorer, out: torch.Tensor, real: list, view: ModelView) -> torch.Tensor:
    """Explorer ``e``'s candidate logits for the lanes' real rows only (``real``: (lane, member, nodes)), one after
    another, padded to a bucket: the head, the dearest matrix of a stage, never scores a lane's padding."""
    rows = out.shape[1]
    index = [b * rows + i for b, _, n in real for i in range(n)]
    flat = out.flatten(0, 1).index_select(
        0, to_device(padded(index, bucket(len(index)), index[0]), view.device)
    )
    return e.propose(flat)


def lane_inputs(e: Explorer, m: Member | None, nodes: list, batch, view: ModelView) -> torch.Tensor:
    """A lane's input rows (rows, hidden) to explorer ``e``: its tokens' embeddings at stage 0, else the rows its
    depth parents produced (its link holds them); None for a lane with no nodes this round (``stacked``)."""
    if e.index == 0:
        return view.embed(batch.tokens)
    return m.run.link.inputs([n.parent for n in nodes], batch.rows) if nodes else None


def stacked(hidden: list) -> torch.Tensor:
    """The lanes' input rows (lanes, rows, hidden); a lane with none (None) runs zeros."""
    real = next(h for h in hidden if h is not None)
    return torch.stack([real.new_zeros(real.shape) if h is None else h for h in hidden])


@contextlib.contextmanager
def seated(member: Member):
    """Every explorer works on ``member``'s seat within the block."""
    with contextlib.ExitStack() as stack:
        for e, seat in zip(member.run.explorers, member.seats):
            stack.enter_context(e.seated(seat))
        yield
