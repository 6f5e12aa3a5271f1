"""What a visitor's session holds in the server's memory, and its bounds.

Gradio keeps a session's ``gr.State`` values (here the Debugger's trace and the pinned run, held by
reference, not copied) for an hour after its tab closed, and the last value of every output (for deep
links, which this app does not offer: the timeline's figure JSON is larger than its trace) until 10,000
newer sessions push the session out. ``Sessions`` bounds that:

- a tab that closes frees its session at once (``closed``, Gradio's unload event): values, outputs, files;
- a session idle for ``session_ttl`` seconds is dropped by the sweep (``app.host.server`` runs it every second);
- all sessions' traces together stay within ``trace_memory_mb``: a load asks ``admit`` first and the sweep
  checks the traces that grow (live runs); the least recently used sessions' traces go first, and the
  session's next Debugger action says so (``notice``); the sessions of one client address (a visitor,
  ``app.host.uploads.visitor``) hold at most ``visitor_trace_mb``: a load past it drops that visitor's own first;
- the sweep drops the large output values Gradio keeps for deep links (the browser has them), and the
  replays of traces no session holds (``REPLAYS``); freed heap pages go back to the OS (``_trim``).
- the first sweep, before any session, moves what the started server holds out of the collector's sight
  (``gc.freeze``), so that a full collection, which stops every thread, visits only what came since.

A loaded trace's memory is estimated from its file: its typed events (``dex_core.trace.events``), their repeated
values shared as the server reads them (``app.host.trace_worker.compacted``), take at most about ``COMPACT_FACTOR``
bytes of the process's RSS per byte of JSON, the allocator's own overhead included (the system allocator that
``app/main.py`` runs the server with): 4.3 to 4.8 for an 11 MB K=8 trace (7.3 not shared; the plain dicts they
replaced took 8.9 shared), 5.6 for a 17 MB one held by a session of a running server, its replay and page outputs
included. A trace held otherwise (a live run's, a bundled one) is measured: its objects' own sizes
(``footprint``, what tracemalloc counts) times ``HEAP_FACTOR``, the allocator's overhead (1.17 to 1.29 there).
"""

from __future__ import annotations

import copy
import ctypes
import dataclasses
import gc
import sys
import threading
import time
from datetime import datetime

import anyio
import gradio as gr

import visualize as viz
from dex_core import DexError
from dex_core.trace.events import Event, StartEvent

from .files import Files

COMPACT_FACTOR = 7  # a margin over the 5.6 measured below
HEAP_FACTOR = 1.3
RESERVE_SECONDS = 60  # a load's reservation counts until its trace is in the session's State
RECORD_SECONDS = 5  # a size recorded for a loaded trace is kept this long for its session to hold it
RECENT_SECONDS = 60  # sessions used this recently get their large output values dropped
LARGE_OUTPUT = 64 * 2**10  # characters of an output value Gradio keeps that the sweep drops
_BUDGET = (
    "this session's trace was dropped to free memory: the server keeps {s.trace_memory_mb} MB of traces for all "
    "visitors together and drops the least recently used first"
)
_SLICE = (
    "this session's trace was dropped to make room for a newer one of yours: the server keeps "
    "{s.visitor_trace_mb} MB of traces for each visitor (DEX_VISITOR_TRACE_MB)"
)
REPLAYS = viz.ReplayCache(size=8)  # the process's replays (Prev/Next/Play); the sweep keeps only held traces'


def traces_in(value) -> list[list[Event]]:
    """The event lists a State value holds: a trace (a list that opens with a start event) or a run's."""
    if isinstance(value, dict):
        value = value.get("events")
    if isinstance(value, list) and value and isinstance(value[0], StartEvent):
        return [value]
    return []


def footprint(event: Event) -> int:
    """Bytes of an event's own objects (``sys.getsizeof``, each object once): its records, their lists, dicts,
    strings and numbers."""
    seen, stack, total = set(), [event], 0
    while stack:
        x = stack.pop()
        if id(x) in seen:
            continue
        seen.add(id(x))
        total += sys.getsizeof(x)
        if isinstance(x, (list, tuple)):
            stack.extend(x)
        elif isinstance(x, dict):
            stack.extend(x.values())
        elif dataclasses.is_dataclass(x):
            total += sys.getsizeof(vars(x)) if hasattr(x, "__dict__") else 0  # GenerationStats has one
            stack.extend(getattr(x, f.name) for f in dataclasses.fields(x))
    return total


def _large(value) -> bool:
    """Whether an output value Gradio keeps is worth dropping: a long text (HTML, a figure's JSON) in it."""
    if isinstance(value, str):
        return len(value) > LARGE_OUTPUT
    return isinstance(value, dict) and any(_large(v) for v in value.values())


def _trim() -> None:
    """Hand freed heap pages back to the OS (glibc's ``malloc_trim``; elsewhere nothing). Python frees a
    trace's records at once, but glibc keeps their pages for reuse, and the RSS would not go down."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass


class Sessions:
    def __init__(self, settings, files: Files):
        self.settings, self.files = settings, files
        self.blocks = None  # the launched Blocks, whose state holder keeps the sessions
        self._lock = threading.RLock()
        self._sizes: dict[
            int, tuple[dict, int, int, float]
        ] = {}  # id(events) -> (events[0], counted, bytes, when)
        self._reserved: dict[str, tuple[int, float]] = {}  # session -> (bytes, when) of a load under way
        self._notices: dict[str, tuple[str, float]] = {}  # session -> (why its trace went, when)
        self._freed = False  # something was let go of since the last sweep's collection
        self._frozen = False  # the server's start-up objects are out of the collector's sight (``sweep``)
        self._visitors: dict[str, str] = {}  # session -> the client address it loaded a trace from

    @property
    def budget(self) -> int:
        return self.settings.trace_memory_mb * 2**20

    def _holder(self):
        return getattr(self.blocks, "state_holder", None)

    def _bytes(self, events: list[Event]) -> int:
        """A held trace's estimated size, measured once per event (an entry keeps the trace's first event,
        so a new list at a freed list's id is measured afresh)."""
        first, counted, size, _ = self._sizes.get(id(events), (None, 0, 0, 0.0))
        if first is not events[0]:
            counted, size = 0, 0
        if counted < len(events):
            new = events[counted:]  # one read: a live run appends meanwhile
            size += int(HEAP_FACTOR * sum(map(footprint, new)))
            self._sizes[id(events)] = (events[0], counted + len(new), size, time.monotonic())
        return size

    def record(self, events: list[Event], file_bytes: int) -> None:
        """The size of a trace loaded from a file of ``file_bytes`` (``COMPACT_FACTOR``), before its session holds
        it."""
        with self._lock:
            self._sizes[id(events)] = (
                events[0],
                len(events),
                int(COMPACT_FACTOR * file_bytes),
                time.monotonic(),
            )

    def usage(self) -> dict[str, int]:
        """Estimated bytes of the traces only that session holds, a load under way counted by its
        reservation (a list several sessions hold, like the bundled example, is nobody's to drop)."""
        with self._lock:
            return {session: size for session, (size, _) in self._survey()[0].items()}

    def _survey(self):
        """({session: (bytes, [(state, key)])}, every held list, bytes of shared lists). Under ``_lock``."""
        holder, now = self._holder(), time.monotonic()
        found, held, owners = {}, [], {}
        for session, state in list(holder.session_data.items()) if holder else []:
            slots = [
                (state, key, events)
                for key, value in list(state.state_data.items())
                for events in traces_in(value)
            ]
            found[session] = slots
            for events in {id(e): e for *_, e in slots}.values():
                held.append(events)
                owners[id(events)] = owners.get(id(events), 0) + 1
        sessions, shared = {}, 0
        for session, slots in found.items():
            mine = {id(e): e for *_, e in slots if owners[id(e)] == 1}
            sessions[session] = (
                sum(self._bytes(e) for e in mine.values()),
                [(state, key) for state, key, _ in slots],
            )
        for events in {id(e): e for e in held if owners[id(e)] > 1}.values():
            shared += self._bytes(events)
        for session, (size, when) in list(self._reserved.items()):
            if now - when > RESERVE_SECONDS:
                del self._reserved[session]
                continue
            held_size, slots = sessions.get(session, (0, []))
            sessions[session] = (max(size, held_size), slots)
        self._sizes = {
            key: entry
            for key, entry in self._sizes.items()
            if key in owners or now - entry[3] < RECORD_SECONDS
        }
        return sessions, held, shared

    def enforce(self, keep: str | None = None, visitor: str | None = None) -> int:
        """Drop the least recently used sessions' traces (never ``keep``'s) until ``visitor``'s sessions fit its
        slice and all fit the budget; returns how many sessions lost theirs."""
        s = self.settings
        with self._lock:
            sessions, _, shared = self._survey()
            holder = self._holder()
            used = holder.time_last_used if holder else {}
            order = sorted(
                (x for x, (size, _) in sessions.items() if x != keep and size > 0),
                key=lambda x: used.get(x, datetime.min),
            )
            evicted = 0
            if visitor is not None:
                mine = [x for x in order if self._visitors.get(x) == visitor]
                total = sum(sessions[x][0] for x in sessions if self._visitors.get(x) == visitor)
                evicted += self._evict(mine, sessions, total, s.visitor_trace_mb * 2**20, _SLICE.format(s=s))
            total = shared + sum(size for size, _ in sessions.values())
            left = [x for x in order if x in sessions and sessions[x][0] > 0]
            evicted += self._evict(left, sessions, total, self.budget, _BUDGET.format(s=s))
        if evicted:
            self._release()
        return evicted

    def _evict(self, order: list[str], sessions: dict, total: int, limit: int, why: str) -> int:
        """Drop the traces of ``order``'s sessions, first first, until ``total`` fits ``limit``. Under ``_lock``."""
        evicted = 0
        for session in order:
            if total <= limit:
                break
            size, slots = sessions[session]
            for state, key in slots:
                block = state.blocks_config.blocks.get(key)
                state.state_data[key] = copy.deepcopy(
                    getattr(block, "value", None)
                )  # a key it has: no resize
            sessions[session] = (0, [])
            self._reserved.pop(session, None)
            self._notices[session] = (why, time.monotonic())
            total -= size
            evicted += 1
        return evicted

    def admit(self, session: str, nbytes: int, visitor: str = "") -> None:
        """Make room for a trace of about ``nbytes`` that ``session`` (of client address ``visitor``) is loading:
        the visitor's own least recently used traces go first while its sessions pass its slice, then anyone's.
        DexError when it alone is larger than the slice or the budget."""
        s = self.settings
        for limit, name, what in (
            (s.visitor_trace_mb, "DEX_VISITOR_TRACE_MB", "each visitor's traces"),
            (s.trace_memory_mb, "DEX_TRACE_MEMORY_MB", "all visitors' traces"),
        ):
            if nbytes > limit * 2**20:
                raise DexError(
                    f"this trace needs about {nbytes / 2**20:.0f} MB of server memory, more than the {limit} MB "
                    f"this server keeps for {what} ({name}); view it on your machine with python -m visualize.report"
                )
        with self._lock:
            self._reserved[session] = (nbytes, time.monotonic())
            self._visitors[session] = visitor
        self.enforce(keep=session, visitor=visitor)

    def notice(self, session: str) -> str | None:
        """Why ``session``'s trace went (once), or None."""
        with self._lock:
            found = self._notices.pop(session, None)
        return found[0] if found else None

    async def closed(self, request: gr.Request):
        """The tab closed (``demo.unload``): its session's values, outputs and files go now. On the event loop,
        like Gradio's own state sweep, so the two never change the session table at once."""
        self._forget(getattr(request, "session_hash", None) or "")
        await anyio.to_thread.run_sync(self._release)

    def _forget(self, session: str, why: str | None = None) -> None:
        """Drop a session from Gradio's table (on the event loop only), its files, and what this keeps of it."""
        holder = self._holder()
        if holder is not None:
            holder.session_data.pop(session, None)
            holder.time_last_used.pop(session, None)
        self.files.drop(session)
        self._freed = True
        with self._lock:
            self._reserved.pop(session, None)
            self._notices.pop(session, None)
            self._visitors.pop(session, None)
            if why:
                self._notices[session] = (why, time.monotonic())

    def drop_idle(self) -> bool:
        """Drop the sessions idle past ``session_ttl`` and closed ones whose unload never ran (event loop only)."""
        holder, now = self._holder(), datetime.now()
        if holder is None:
            return False
        why = (
            f"this session was idle for over {self.settings.session_ttl} s, so the server let go of its trace"
        )
        gone = 0
        for session, used in list(holder.time_last_used.items()):
            if getattr(holder.session_data.get(session), "is_closed", False):  # a tab whose unload never ran
                self._forget(session)
            elif (now - used).total_seconds() > self.settings.session_ttl:
                self._forget(session, why)
            else:
                continue
            gone += 1
        return gone > 0

    def sweep(self) -> None:
        """Budget, large outputs, replays, expired files, then freed memory back to the OS (a worker thread)."""
        self.freeze_start_up()
        freed = self.enforce() > 0
        dropped = self._drop_large_outputs()
        with self._lock:
            _, held, _ = self._survey()
            stale = [
                s
                for s, (_, when) in self._notices.items()
                if time.monotonic() - when > self.settings.session_ttl
            ]
            for session in stale:
                del self._notices[session]
        freed |= REPLAYS.retain(held) > 0
        self.files.expire()
        collect, self._freed = freed or self._freed, False
        if collect:
            gc.collect()  # Gradio's copies of components and Plotly's figures free only as cycles
        if collect or dropped:
            _trim()

    def _drop_large_outputs(self) -> bool:
        """Drop the large output values Gradio keeps for the recently used sessions' deep links (the browser has
        them): plain JSON, freed as they go, so no collection follows. A full collection holds the interpreter's
        lock for every object it visits; run every second while Live streams a run, it slowed the run's own rounds
        about 15x on the tiny model (``benchmarks/live_estimate.py``'s model tokens/s)."""
        holder, now, dropped = self._holder(), datetime.now(), False
        for session, state in list(holder.session_data.items()) if holder else []:
            used = holder.time_last_used.get(session)
            if used is None or (now - used).total_seconds() > RECENT_SECONDS:
                continue
            for config in list(state.config_values.values()):
                props = config.get("props") if isinstance(config, dict) else None
                if isinstance(props, dict) and _large(props.get("value")):
                    props["value"], dropped = None, True
        return dropped

    def freeze_start_up(self) -> None:
        """Once, before any session: move what the server holds out of the collector's sight (``gc.freeze``).

        A full collection holds the interpreter's lock while it visits every object the collector tracks, and every
        other thread waits: a started server's half a million (torch, Gradio, the app) took 0.26 s of it on a busy
        2-core machine, at every sweep that collects (a tab closed) and at Python's own full collections, and a
        visitor's stream stalled that long (docs/HOSTING.md). They live as long as the server, so a collection
        need not visit them; it then visits what came since, mostly the sessions' traces. Collected first, so no
        garbage is frozen, and never while a session exists, whose cycles must stay collectable."""
        holder = self._holder()
        if self._frozen or holder is None or holder.session_data:
            return
        self._frozen = True
        gc.collect()
        gc.freeze()

    def _release(self) -> None:
        """Drop the replays of traces no session holds; the next sweep collects and trims."""
        with self._lock:
            _, held, _ = self._survey()
        REPLAYS.retain(held)
        self._freed = True
