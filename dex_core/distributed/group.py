"""The explorer processes of the distributed schedule, owned by a parent: ``ExplorerGroup``.

The parent (``DexDecoder(..., backend="distributed")``) starts K rank processes that run
``dex_core.rank.main`` (fresh interpreters, as torchrun starts its ranks), so they never re-import the caller's
``__main__``: a plain script without a ``__main__`` guard works. It talks to each over an authenticated local
connection: one start message (the run's ``RunSettings`` and where the rank's part of the model comes from), then
typed ``Request``s; it receives rank 0's trace events, in batches (``event_batch.EventBatch``). It writes no weights
anywhere: ranks read their own tensors from the checkpoint (``DexDecoder.from_pretrained``: the parent holds config
and tokenizer only), or, for a model built in memory, receive their part's tensors over the connection. The
processes idle between calls and end with ``close()``, at interpreter exit, or by themselves within a second of the
parent's death (idle or busy).

Starting is bounded by silence, not by a flat deadline: each rank reports its loading progress (bytes of its
part placed) at least every ``REPORT_SECONDS``; a rank silent for ``start_timeout`` while loading is named and
the group ends. Importing torch before the first report has its own bound (``IMPORT_SECONDS``), and the whole
start a total one that grows with the bytes the ranks load (``LOAD_RATE``).

Faults end the call with an ``ExplorerError`` that names the rank at fault, in this order: a rank that
died without reporting (its exit code or signal), a rank whose process is stopped, a rank that raised
(its cause and traceback), a rank that fell silent behind its peers (each rank stores the round it
starts to wait on its peers in the group's board of rounds, ``rank.round_board``: shared memory the parent
reads, not a message a round). With every rank silent (no message, no slot of the board moving), the parent
gives up after ``op_timeout``. Every process is then ended; the next call starts a fresh group.
"""

from __future__ import annotations

import atexit
import dataclasses
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from multiprocessing.connection import Client, wait
from pathlib import Path

from ..config import DecoderOptions, DexError
from ..model.stage_load import PartSource, StateDict, part_bytes
from ..runtime.request import Request
from ..runtime.settings import RunSettings
from ..trace.events import EndEvent
from .blame import blamed, stopped
from .flights import Flights, Tally
from .placement import default_threads, resolve_devices
from .rank import KEY_ENV, Start, round_board

_LIVE: weakref.WeakSet = weakref.WeakSet()


class ExplorerError(RuntimeError):
    """An explorer process failed; the message names the rank and the cause."""


def _close_all() -> None:
    for group in list(_LIVE):
        group.close()


IMPORT_SECONDS = 120.0  # a rank's interpreter start and imports, before it can report anything
LOAD_RATE = 20 * 2**20  # bytes a second a rank is granted for its part, at least, in the total start bound


class ExplorerGroup:
    """K explorer processes owned by this (parent) process; see the module docstring. ``model`` is the loaded model,
    whose parts' tensors the ranks receive, or, with a checkpoint ``folder`` the ranks read their parts from, the
    model's skeleton on the meta device."""

    stage_rows = False  # stage hidden rows through the host even on CPU or one GPU each (tests run that path)
    entry = (
        "from dex_core.distributed.rank import main; main()"  # a module's code, never the caller's __main__
    )

    def __init__(self, settings: RunSettings, model, options: DecoderOptions, folder=None):
        self.settings, self.model, self.folder, self.config = settings, model, folder, model.config
        self.count = settings.K
        self.devices = resolve_devices(options.devices, self.count)
        self.threads = options.threads or default_threads(self.count)
        self.op_timeout, self.start_timeout = options.op_timeout, options.start_timeout
        self.part_bytes = [sum(part_bytes(model, settings.part(k)).values()) for k in range(self.count)]
        self.loaded: list[
            dict
        ] = []  # per rank, once started: the checkpoint keys it read and the bytes it placed
        self._procs: list[subprocess.Popen] | None = None
        self._next_id = 0
        self.flights = Flights(self, 1)  # requests in flight at once: one unless ``share``d
        self._sending = threading.RLock()  # messages reach every rank in one order
        self.start()

    @property
    def alive(self) -> bool:
        return self._procs is not None

    def pids(self) -> list[int]:
        return [p.pid for p in self._procs or []]

    def _source(self, rank: int) -> PartSource:
        if self.folder is not None:
            return PartSource(self.config, folder=str(self.folder))
        return PartSource(self.config, blob=StateDict.of(self.model, self.settings.part(rank)).to_bytes())

    def _start_message(self, rank: int, join_timeout: float) -> bytes:
        depth = self.settings.depths[rank]
        settings = dataclasses.replace(self.settings, adapters=self.settings.adapters.only(depth))
        return pickle.dumps(
            Start(
                settings=settings,
                source=self._source(rank),
                device=self.devices[rank],
                threads=self.threads,
                count=self.count,
                init_method=(self._tmp / "rendezvous").as_uri(),
                op_timeout=self.op_timeout,
                join_timeout=join_timeout,
                share=True,
                stage=self.stage_rows,
                rounds=str(self._tmp / "rounds"),
            )
        )

    def start(self) -> None:
        if not _LIVE:
            atexit.register(_close_all)
        self._tmp = Path(tempfile.mkdtemp(prefix="dex-group-"))
        key = os.urandom(32)
        env = dict(
            os.environ, **{KEY_ENV: key.hex(), "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        )
        self._procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    self.entry,
                    "--rank",
                    str(k),
                    "--folder",
                    str(self._tmp),
                    "--parent",
                    str(os.getpid()),
                ],
                env=env,
                stdin=subprocess.DEVNULL,
            )
            for k in range(self.count)
        ]
        _LIVE.add(self)
        self._conns: list = [None] * self.count
        # the board of rounds (``rank.round_board``): an int64 a rank, then rank 0's two of shared rounds (``Tally``)
        board = self._tmp / "rounds"
        board.write_bytes(bytes(8 * (self.count + 2)))
        self._rounds, self._activity = round_board(str(board)), time.monotonic()
        self._seen = list(self._rounds)  # the board as the last check read it
        self._status = [
            ("starting", 0, 0, "")
        ] * self.count  # per rank: (phase, bytes done, of bytes, tensor)
        self._heard = [time.monotonic()] * self.count
        self._begun = time.monotonic()
        self._bound = IMPORT_SECONDS + self.start_timeout + max(self.part_bytes) / LOAD_RATE
        for k in range(self.count):
            self._conns[k] = self._connect(k, key)
            self._conns[k].send_bytes(self._start_message(k, self._bound))
        self.loaded = [{}] * self.count
        ready: set[int] = set()
        while len(ready) < self.count:
            kind, rank, (link, report) = self._get(self._check_start)
            if kind == "ready":
                ready.add(rank)
                self._status[rank] = ("ready", 0, 0, "")
                self.loaded[rank] = report
                self.data_link = link  # rank.DataLink, alike on every rank: (backend, staged)
        if self.shares:  # a fresh group after a failure: its ranks share rounds as the last ones did
            self._send_all(("share", self.flights.most))

    def _connect(self, rank: int, key: bytes):
        address = str(self._tmp / f"rank-{rank}.sock")
        while True:
            try:
                return Client(address, family="AF_UNIX", authkey=key)
            except (FileNotFoundError, ConnectionRefusedError):
                self._check_start()
                time.sleep(0.05)

    def _doing(self, rank: int) -> str:
        """What rank ``rank`` was last heard doing while starting."""
        phase, done, total, key = self._status[rank]
        if phase == "loading":
            where = f"; last tensor {key}" if key else ""
            total = total or self.part_bytes[rank]
            return f"loading its part of the model ({done / 1e6:.0f} of {total / 1e6:.0f} MB placed{where})"
        return {
            "starting": "starting (its interpreter and imports)",
            "joining": "joining the process group",
            "ready": "ready",
        }[phase]

    def _check_start(self) -> None:
        """While starting: raise for a dead rank, a rank silent for ``start_timeout`` while it loads (or for
        ``IMPORT_SECONDS`` before its first report), ranks that do not join within ``start_timeout`` once all are
        loaded, or a start past the total bound."""
        dead = [(k, p.poll()) for k, p in enumerate(self._procs) if p.poll() is not None]
        if dead:
            self._fail([], dead)
        now = time.monotonic()
        for k, (phase, *_) in enumerate(self._status):
            limit = IMPORT_SECONDS if phase == "starting" else self.start_timeout
            if phase in ("starting", "loading") and now - self._heard[k] > limit:
                self._fail(
                    [],
                    [],
                    f"sent nothing for {limit:.0f} s while {self._doing(k)}; raise start_timeout "
                    "if its storage is that slow, or check the device",
                    rank=k,
                )
        waiting = [k for k, (phase, *_) in enumerate(self._status) if phase == "joining"]
        if len(waiting) == self.count and now - max(self._heard) > self.start_timeout:
            self._fail(
                [],
                [],
                f"loaded their parts but did not join within {self.start_timeout:.0f} s (start_timeout)",
            )
        if now - self._begun > self._bound:
            slow = min(range(self.count), key=lambda k: self._status[k][1] - (self._status[k][0] == "ready"))
            self._fail(
                [],
                [],
                f"did not start within {self._bound:.0f} s (the bound for {max(self.part_bytes) / 1e6:.0f} "
                f"MB a rank); rank {slow} was {self._doing(slow)}",
            )

    def _check_run(self) -> None:
        """While serving: raise for a dead rank, or when every rank fell silent (no message, no round started)
        for ``op_timeout``."""
        dead = [(k, p.poll()) for k, p in enumerate(self._procs) if p.poll() is not None]
        if dead:
            self._fail([], dead)
        if (rounds := list(self._rounds)) != self._seen:
            self._seen, self._activity = rounds, time.monotonic()
        if time.monotonic() - self._activity > self.op_timeout:
            self._fail([], [], f"sent nothing for {self.op_timeout:.0f} s (op_timeout) while generating")

    def _get(self, check):
        """Next message from the explorers (status reports, and the steps training ranks report, are noted, not
        returned); ``check`` raises when the explorers fail or fall silent."""
        while True:
            for conn in wait([c for c in self._conns if c is not None], timeout=0.1):
                try:
                    msg = conn.recv()
                except (EOFError, OSError):  # that rank is gone; its exit code says how
                    self._conns[self._conns.index(conn)] = None
                    continue
                self._activity = time.monotonic()
                if msg[0] == "progress":
                    self._rounds[msg[1]] = msg[2]  # a training rank's step (training.group), on its slot
                    continue
                if msg[0] == "status":
                    self._status[msg[1]], self._heard[msg[1]] = msg[2], time.monotonic()
                    continue
                if msg[0] == "error":
                    self._fail([msg])
                return msg
            check()

    def _blame(self, errors: list, dead, silent: str | None, rank: int | None = None) -> str:
        """The message naming the rank at fault (``blame.blamed``; the module docstring gives the order)."""
        held = [k for k, pid in enumerate(self.pids()) if stopped(pid)]
        return blamed(errors, dead, held, list(self._rounds)[: self.count], silent, rank)

    def _fail(self, errors: list, dead=(), silent: str | None = None, rank: int | None = None) -> None:
        """Collect the reports for a moment, name the rank at fault, end every process, and raise."""
        settle = time.monotonic() + (1.0 if errors or dead else 0.0)
        while time.monotonic() < settle:
            for conn in wait([c for c in self._conns if c is not None], timeout=0.05):
                try:
                    msg = conn.recv()
                except (EOFError, OSError):
                    self._conns[self._conns.index(conn)] = None
                    continue
                if msg[0] == "error":
                    errors.append(msg)
        dead = list(dead) + [
            (k, p.poll())
            for k, p in enumerate(self._procs)
            if p.poll() is not None and k not in {d[0] for d in dead}
        ]
        message = self._blame(errors, dead, silent, rank)
        self.close()
        raise ExplorerError(message)

    def share(self, most: int) -> None:
        """Let ``most`` requests in flight share each round (``flights``, ``roster``); 1: one at a time (not while
        requests share rounds)."""
        with self.flights.lock:  # between one request's launch and the next
            if most == 1 and self.flights.flying:
                raise DexError(
                    f"{len(self.flights.flying)} requests share these explorers' rounds: let them end first"
                )
            was, self.flights.most = self.shares, most
            if self.alive and was != self.shares:
                self._send_all(("share", most))

    @property
    def shares(self) -> bool:
        return self.flights.most > 1

    @property
    def crew(self) -> Tally:
        """What the ranks' shared rounds ran, for ``/metrics``."""
        return Tally(self)

    def run(self, request: Request):
        """The request's trace events: in rounds shared with every request in flight, or alone."""
        return self.flights.run(request) if self.shares else self._alone(request)

    def _alone(self, request: Request):
        """Send a request to every explorer; yield rank 0's trace events until the end event."""
        if self._procs is None:
            self.start()
        rid, self._next_id = self._next_id, self._next_id + 1
        self._activity = time.monotonic()
        self._send_all(("request", dataclasses.replace(request, id=rid)))
        finished = False
        try:
            while True:
                kind, key, events = self._get(self._check_run)
                for event in events if kind == "events" and key == rid else ():  # rank 0's batches
                    finished = isinstance(event, EndEvent)
                    yield event
                if finished:
                    return
        finally:
            if not finished and self._procs is not None:  # the caller stopped early: stop the ranks too
                self._send_all(("cancel", rid))
                while self._procs is not None:
                    kind, key, events = self._get(self._check_run)
                    if kind == "events" and key == rid and isinstance(events[-1], EndEvent):
                        break

    def _send_all(self, msg) -> None:
        """``msg`` to every rank, in the order every other message reaches them (one sender at a time)."""
        with self._sending:
            self._send_each(msg)

    def _send_each(self, msg) -> None:
        for conn in self._conns:
            try:
                if conn is not None:
                    conn.send(msg)
            except OSError:  # that rank is gone; the next check names it
                pass

    def close(self) -> None:
        """Ask the explorers to exit, then end any that do not; remove the private folder."""
        if self._procs is None:
            return
        procs, self._procs = self._procs, None
        _LIVE.discard(self)
        self._send_all(("close",))
        deadline = time.monotonic() + 5.0
        for p in procs:
            if stopped(p.pid):
                p.kill()
            try:
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=5.0)
        for conn in self._conns:
            if conn is not None:
                conn.close()
        shutil.rmtree(self._tmp, ignore_errors=True)

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
