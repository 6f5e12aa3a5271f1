"""Replay of a DEX trace into one ``RoundView`` per round: the lattice as it stood during the round.

A round event only lists the nodes it created and the ids alive after it: the lattice during round r
is ``alive`` after round r-1 plus the nodes round r created, before round r's collapse. ``replay``
indexes the events once and builds each view when asked for it (no per-round copies of the run);
``ReplayCache`` keeps the replays of the last few traces so that stepping through one is cheap, and
extends the replay of a growing live trace by its new events instead of indexing it again.
It reads typed events (``dex_core.trace.events``: a run's stream, or ``load_trace``/``parse_events`` of a
saved one); a plain record (a trace file's dict) is refused (``typed_events``). Views share the trace's
records (read them, do not change them).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

from dex_core.trace.events import CommitRecord, Event, NodeRecord, RoundEvent, StartEvent


@dataclass
class RoundView:
    """The lattice and the decoding progress during one round (before its collapse)."""

    index: int  # 0-based index among round events
    round: int  # the trace's round number
    start: StartEvent
    nodes: dict[int, NodeRecord]  # id -> node record of every node in the lattice this round
    new: list[int]  # ids created this round
    dropped: list[int]  # ids this round's collapse discarded (empty without a commit)
    committed_ids: list[int]  # anchor node ids committed this round (empty without a commit)
    kept: list[int]  # ids surviving this round's collapse (empty without a commit)
    commit: CommitRecord | None  # the round's (first) commit
    tokens: list[int]  # committed token ids up to and including this round
    texts: list[str | None]  # their texts
    matched: list[int]  # matched stage of each committed token
    anchor_chains: list[list[tuple[int, str | None]]]  # per token: (candidate, text) per stage
    state_before: int
    state_after: int
    commit_position: int  # absolute position of this round's anchor slot
    batches: list[list[int]]  # node ids each explorer computed
    timings: dict = field(default_factory=dict)
    vocab: dict[int, str] = field(default_factory=dict)  # token -> text of every token the run names (shared)
    # the commit record of each committed token up to and including this round (near_tie, margin, drafted)
    token_commits: list[CommitRecord] = field(default_factory=list)
    commits: list[CommitRecord] = field(default_factory=list)  # this round's (several along a draft chain)
    cut: list[int] = field(
        default_factory=list
    )  # chain nodes this round dropped (their predecessor proposed another token)

    @property
    def num_stages(self) -> int:
        return len(self.start.depths)

    @property
    def final_node(self) -> int | None:
        """The anchor's final-stage node on a commit round."""
        return self.commit.anchor_nodes[-1] if self.commit else None

    @property
    def matched_node(self) -> int | None:
        """The shallowest anchor node whose candidate equals the committed token."""
        return self.commit.anchor_nodes[self.commit.matched_stage] if self.commit else None


def lattice_size(view: RoundView) -> int:
    return len(view.nodes)


def typed_events(events):
    """``events``, once every one is a typed trace event; a plain record (the dict form a trace file holds)
    raises ``TypeError``: type those with ``parse_events`` (``load_trace`` reads a file typed)."""
    bad = next((e for e in events if not isinstance(e, Event)), None)
    if bad is not None:
        raise TypeError(
            f"visualize draws typed trace events (dex_core.trace.events), got a {type(bad).__name__}: "
            "type a trace's records with parse_events, or read its file with load_trace"
        )
    return events


def event_texts(event: RoundEvent):
    """(token, text) of every token a round event gives the text of: candidates, the commits, and top
    entries that carry a third element (their text)."""
    for node in event.nodes:
        if isinstance(node.text, str):
            yield node.token, node.text
        for entry in node.top:
            if len(entry) > 2 and isinstance(entry[2], str):
                yield entry[0], entry[2]
    for commit in event.commits:
        if isinstance(commit.text, str):
            yield commit.token, commit.text


def _chain(commit: CommitRecord, seen: dict[int, NodeRecord]) -> list[tuple[int, str | None]]:
    texts = [seen[i].text if i in seen else None for i in commit.anchor_nodes]
    return list(zip(commit.anchor_candidates, texts))


class _Index:
    """The append-only index of one trace, shared by the replays of its growing prefixes: the round
    events, every node by id, and per committed token its id, text, matched stage, anchor chain and
    commit record. ``add`` indexes the events appended since the last call (under a lock, so two
    threads showing one live trace index each event once)."""

    def __init__(self, events: list[Event]):
        self.events, self.consumed, self.lock = events, 1, threading.Lock()
        self.rounds: list[RoundEvent] = []
        self.seen: dict[int, NodeRecord] = {}
        self.before: list[int] = []  # per round: tokens committed before it
        self.tokens: list[int] = []
        self.texts: list[str | None] = []
        self.matched: list[int] = []
        self.chains: list[list[tuple[int, str | None]]] = []
        self.commits: list[CommitRecord] = []
        self.vocab: dict[int, str] = {}

    def add(self, events: list[Event]) -> tuple[int, int]:
        """Index ``events[consumed:]``; returns how many rounds and how many events are indexed."""
        with self.lock:
            new = typed_events(events[self.consumed :])  # one read: the list may grow meanwhile (a live run)
            for event in new:
                if isinstance(event, RoundEvent):
                    self._round(event)
            self.consumed += len(new)
            return len(self.rounds), self.consumed

    def _round(self, event: RoundEvent) -> None:
        self.seen.update((node.id, node) for node in event.nodes)
        self.vocab.update(event_texts(event))
        self.before.append(len(self.tokens))
        for commit in event.commits:
            self.tokens.append(commit.token)
            self.texts.append(commit.text)
            self.matched.append(commit.matched_stage)
            self.chains.append(_chain(commit, self.seen))
            self.commits.append(commit)
        self.rounds.append(event)  # last: a reader sees a round only once all of it is indexed


class Replay(Sequence[RoundView]):
    """The round views of a DEX trace, built on demand from a one-time index of the events.

    The index holds references, not copies, so memory and the indexing time are linear in the trace,
    and ``replay[i]`` costs the size of round i's lattice plus its committed tokens. A live trace
    grows: ``extended`` gives the replay of the longer trace by indexing only the new events (the
    index is shared and only appended to; each replay shows its own number of rounds).
    """

    def __init__(self, events: list[Event], _index: _Index | None = None):
        if not events or not isinstance(typed_events(events[:1])[0], StartEvent):
            raise ValueError(
                f"a trace must begin with its start event; got {events[0].event if events else 'an empty list'}"
            )
        self.start = events[0]
        self._index = _index or _Index(events)
        self._count, self.length = self._index.add(events)  # its rounds, and the trace's events it covers
        self.vocab = self._index.vocab  # token -> text of every token the indexed events name

    def extended(self, events: list[Event]) -> Replay:
        """The replay of ``events``: this replay's trace (the same list) with events appended since."""
        index = self._index
        if events is not index.events or len(events) < index.consumed:
            return Replay(events)
        return Replay(events, index)

    def __len__(self) -> int:
        return self._count

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if not -len(self) <= i < len(self):
            raise IndexError(f"round index {i} out of range for a trace of {len(self)} rounds")
        return self._view(i % len(self))

    def __eq__(self, other) -> bool:
        return (
            isinstance(other, (list, Replay))
            and len(self) == len(other)
            and all(a == b for a, b in zip(self, other))
        )

    __hash__ = None

    def _view(self, i: int) -> RoundView:
        x = self._index
        event = x.rounds[i]
        alive = x.rounds[i - 1].alive if i else []
        new = [node.id for node in event.nodes]
        collapse, commits = event.collapse, event.commits
        n = x.before[i] + len(commits)
        return RoundView(
            index=i,
            round=event.round,
            start=self.start,
            nodes={j: x.seen[j] for j in dict.fromkeys([*alive, *new])},
            new=new,
            dropped=list(collapse["dropped"]) if collapse else [],
            committed_ids=list(collapse["committed"]) if collapse else [],
            kept=list(collapse["kept"]) if collapse else [],
            commit=event.commit,
            tokens=x.tokens[:n],
            texts=x.texts[:n],
            matched=x.matched[:n],
            anchor_chains=x.chains[:n],
            state_before=event.state_before,
            state_after=event.state_after,
            commit_position=len(self.start.prompt) + x.before[i],
            batches=event.batches,
            timings=event.timings or {},
            vocab=self.vocab,
            token_commits=x.commits[:n],
            commits=commits,
            cut=list(event.cut or []),
        )


def replay(events: list[Event]) -> Replay:
    """The ``RoundView`` of every round event of a DEX trace (typed events), as a lazy sequence (``len``,
    indexing, negative indices, slices, iteration); an AR trace has no rounds and gives an empty one."""
    return Replay(events)


class ReplayCache:
    """The replays of the last ``size`` traces, keyed by the trace list's identity.

    An entry holds its trace, so the list cannot be freed and its id reused while the entry lives; a
    trace that grew (a live generation: events are only appended) is extended by its new events, not
    indexed again, so following a run round by round costs O(run), not O(run²). ``retain`` drops the
    entries of traces no one else holds any more (the app calls it as sessions let go of theirs), so the
    cache does not keep a trace alive on its own; an entry adds only its index (references: about 3% of
    the trace's records). Safe to share between threads.
    """

    def __init__(self, size: int = 4):
        self.size = size
        self._items: OrderedDict[int, tuple[list[Event], Replay]] = OrderedDict()
        self._lock = threading.Lock()

    def __call__(self, events: list[Event]) -> Replay:
        key = id(events)
        with self._lock:
            hit = self._items.get(key)
            if hit is not None and hit[0] is events:
                self._items.move_to_end(key)
                if hit[1].length == len(events):
                    return hit[1]
        views = hit[1].extended(events) if hit is not None and hit[0] is events else replay(events)
        with self._lock:
            self._items[key] = (events, views)
            self._items.move_to_end(key)
            while len(self._items) > self.size:
                self._items.popitem(last=False)
        return views

    def __contains__(self, events) -> bool:
        """Whether the cache holds a replay of this very list."""
        with self._lock:
            hit = self._items.get(id(events))
        return hit is not None and hit[0] is events

    def retain(self, held) -> int:
        """Keep only the replays of the event lists in ``held`` (by identity: an entry keeps its list alive,
        so no other list has its id); returns how many entries were dropped."""
        keep = {id(events) for events in held}
        with self._lock:
            gone = [key for key in self._items if key not in keep]
            for key in gone:
                del self._items[key]
        return len(gone)
