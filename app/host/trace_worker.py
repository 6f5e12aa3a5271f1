"""Uploaded traces are read in a worker process (``read_trace``), never in the server's own.

Reading JSON holds the interpreter's lock for as long as it runs and builds objects many times larger than
their source (``{}`` costs 64 bytes for its 2), so a trace read in the server froze every visitor's request
while it parsed and held gigabytes after it was refused. Here a helper process (``python -m
app.host.trace_worker``, started on the first upload, ended with the server or when its stdin closes) imports
and compiles the validator once and forks one worker per file: the worker reads and validates it
(``dex_core.trace.files.read_records``) within ``MEMORY_FACTOR`` times the file of address space beyond its
start, ``MEMORY_FLOOR`` at least (``RLIMIT_AS``), and ``SECONDS`` of time (``SIGALRM``), writes the validated
meta and records one per line next to the upload, and exits. The server reads them back a line at a time, so
other requests run in between, and types them once (``parse_events``), their repeated values shared
(``compacted``), Python's automatic collections paused meanwhile (``_uncollected``); it holds them only once the
worker's memory is gone. A file the worker cannot read within its bounds is refused with a message naming them.
One file is read at a time (``PARSES``), so the workers together take at most one file's bound. Forking needs
POSIX; the helper is single-threaded, so the fork is safe. Of ``dex_core`` it imports only the trace package (no
torch): 28 to 32 MB resident, 21 to 25 MB its own (``benchmarks/hostile_upload.py``; a test bounds it:
``tests/app/test_app_uploads.py``).
"""

from __future__ import annotations

import gc
import json
import os
import resource
import select
import signal
import subprocess
import sys
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil

from dex_core.config import DexError
from dex_core.trace.events import Event, parse_events
from dex_core.trace.files import read_records
from dex_core.trace.validate import prepare

MEMORY_FACTOR = (
    11  # bytes of a worker's memory beyond its start per byte of the file (a DEX trace takes about 9)
)
MEMORY_FLOOR = (
    128 * 2**20
)  # bytes a worker may always take: a small file needs about 64 (the allocator's arenas)
SECONDS = 120  # a worker still reading after this is ended
PARSES = threading.Lock()  # one file at a time; also guards the helper
_helper: list[subprocess.Popen] = []


def _work(path: str, out: str, limit: int) -> dict:
    """In the worker: read and validate ``path`` within ``limit`` more bytes of address space and ``SECONDS``,
    write its meta and records to ``out`` one per line; the verdict ({"kind": ok/refused/memory, ...})."""
    signal.alarm(SECONDS)
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = psutil.Process().memory_info().vms + limit
    resource.setrlimit(resource.RLIMIT_AS, (cap if hard == resource.RLIM_INFINITY else min(cap, hard), hard))
    try:
        records, meta = read_records(path)
        with open(out, "w", encoding="utf-8") as f:
            for record in (meta, *records):
                f.write(json.dumps(record, separators=(",", ":")) + "\n")
        return {"kind": "ok"}
    except DexError as err:
        return {"kind": "refused", "why": str(err)}
    except MemoryError:
        return {"kind": "memory"}


def _fork(request: dict) -> dict:
    """In the helper: one worker for ``request`` ({path, out, limit}); its verdict, or how it died."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the worker
        os.close(read)
        try:
            try:
                verdict = _work(request["path"], request["out"], request["limit"])
            except Exception as err:  # anything else the file caused: refused, named by its kind only
                verdict = {
                    "kind": "refused",
                    "why": f"not a trace this server can read ({type(err).__name__})",
                }
            os.write(write, json.dumps(verdict).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as said:
        text = said.read()
    _, status = os.waitpid(pid, 0)
    if text:
        return json.loads(text)
    killed = os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGALRM
    return {
        "kind": "time" if killed else "memory"
    }  # died without a word: out of memory where Python could not say


def serve() -> None:
    """The helper: one request per line on stdin, one verdict per line on stdout, until stdin closes. The
    validators are compiled once, here, so every worker starts with them."""
    prepare()
    for line in sys.stdin:
        print(json.dumps(_fork(json.loads(line))), flush=True)


def _ask(request: dict) -> dict:
    """Send ``request`` to the helper (started when there is none) and wait for its verdict. Under ``PARSES``."""
    if not _helper or _helper[0].poll() is not None:
        root = str(Path(__file__).resolve().parents[2])  # the folder app/ is in
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])),
        }
        _helper[:] = [
            subprocess.Popen(
                [sys.executable, "-m", "app.host.trace_worker"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                env=env,
                text=True,
            )
        ]
    helper = _helper[0]
    helper.stdin.write(json.dumps(request) + "\n")
    helper.stdin.flush()
    ready, _, _ = select.select([helper.stdout], [], [], SECONDS + 30)
    line = helper.stdout.readline() if ready else ""
    if not line:  # the helper died or hung: the next file gets a fresh one
        stop()
        return {"kind": "time" if not ready else "memory"}
    return json.loads(line)


def stop() -> None:
    """End the helper (the server stops); the next upload starts another."""
    for helper in _helper:
        helper.kill()
        helper.wait()
    _helper.clear()


def compacted(lines: Iterable[str]) -> Iterator[dict]:
    """The records of ``lines`` (one JSON record a line), their repeated values shared as they are parsed: one
    string per token text, one float per probability, one int per node id of the alive lists, and top entries as
    tuples. JSON parsing makes a new object for every occurrence; shared, a trace's typed events take about 35%
    less memory (``tests/app/test_app_sessions.py`` measures it)."""
    texts, probs, ids = {}, {}, {}

    def text(x):
        return texts.setdefault(x, x) if isinstance(x, str) else x

    for line in lines:
        record = json.loads(line)
        for node in record.get("nodes") or ():
            node["text"] = text(node.get("text"))
            if node.get("top"):
                node["top"] = [
                    (t, probs.setdefault(p, p) if type(p) is float else p, *map(text, rest))
                    for t, p, *rest in node["top"]
                ]
        if record.get("alive"):
            record["alive"] = [ids.setdefault(i, i) for i in record["alive"]]
        yield record


@contextmanager
def _uncollected():
    """Python's automatic collections paused while the typed events are built: they are acyclic, and each full
    collection their growth sets off visits every object the server tracks with the interpreter's lock held, every
    other thread waiting (six of 0.17 to 0.36 s while a 21 MB trace was read here). Other threads' cycles wait for
    the next collection after it."""
    paused = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if paused:
            gc.enable()


def read_trace(path: str | Path) -> tuple[list[Event], dict]:
    """``(events, meta)`` of an uploaded trace, read and validated in a worker within its bounds, typed here;
    ``DexError`` when the file is not a valid trace or cannot be read within them."""
    path = Path(path)
    if not path.is_file():
        read_records(path)  # its own message: cannot read the file
    limit = max(MEMORY_FLOOR, MEMORY_FACTOR * path.stat().st_size)
    out = path.with_name(path.name + ".events")
    try:
        with PARSES:
            verdict = _ask({"path": str(path), "out": str(out), "limit": limit})
        kind = verdict["kind"]
        if kind == "refused":
            raise DexError(verdict["why"])
        if kind == "memory":
            raise DexError(
                f"reading this file took more than {limit / 2**20:.0f} MB of memory, {MEMORY_FACTOR}x its size "
                "(a trace DEX saved takes about 9x); not a trace this server can load"
            )
        if kind == "time":
            raise DexError(
                f"reading this file took longer than {SECONDS} s; not a trace this server can load"
            )
        with out.open(encoding="utf-8") as f, _uncollected():
            meta = json.loads(next(f))
            return parse_events(compacted(f)), meta  # a line at a time: other requests run between
    finally:
        out.unlink(missing_ok=True)


if __name__ == "__main__":
    serve()
