"""What the app's handlers share: how Gradio calls them (``bind``, an endpoint's inputs as one record, the event
options ``QUIET`` and ``HUSH``), the session of a request, short errors, and what ends a model request — a Stop per
session and tab (``StopRequests``) and the host's bound on its model time (``Deadline``), checked together after
every round or step (``Stopping``) — and slow work run in a thread while a status line says how long it has taken
(``in_background``, ``loading``)."""

from __future__ import annotations

import functools
import inspect
import math
import sys
import threading
import time
from dataclasses import dataclass

import gradio as gr

from dex_core import ExplorerError

from ..host.state import Runtime

QUIET = {"api_visibility": "undocumented"}  # event options: UI plumbing, not part of the documented API
HUSH = {**QUIET, "show_progress": "hidden"}  # and quick: no progress overlay over the panels it redraws


def bind(fn, *bound, record=None, names=None):
    """``functools.partial(fn, *bound)`` as Gradio needs it: Gradio fills a ``gr.Request`` parameter only when it
    reads the annotation, which a partial hides (every session then looked the same to Stop), and streams only from
    a generator function. With ``record`` (a dataclass), ``fn``'s next parameter takes the event's inputs as one
    record: the handler's parameters are the record's fields named in ``names`` (all by default) instead, in that
    order (the API's names, order and defaults); the record's other fields keep their defaults."""
    call = functools.partial(fn, *bound)
    signature = inspect.signature(call)
    if record is not None:
        call, signature = _packing(call, signature, record, names)
    if inspect.isgeneratorfunction(fn):

        def handler(*args, **kwargs):
            yield from call(*args, **kwargs)
    else:

        def handler(*args, **kwargs):
            return call(*args, **kwargs)

    functools.update_wrapper(handler, fn)
    handler.__signature__ = signature
    handler.__annotations__ = {
        p.name: p.annotation for p in signature.parameters.values() if p.annotation is not p.empty
    }
    return handler


def _packing(call, signature: inspect.Signature, record, names=None):
    """``call`` whose first parameter is a ``record``, as a call that takes the record's fields ``names``, and its
    signature."""
    _, *rest = signature.parameters.values()
    every = inspect.signature(record).parameters
    fields = [every[name] for name in names or every]
    spread = signature.replace(parameters=[*fields, *rest])

    def packed(*args, **kwargs):
        given = spread.bind(*args, **kwargs)
        given.apply_defaults()
        values = record(**{p.name: given.arguments[p.name] for p in fields})
        return call(values, **{p.name: given.arguments[p.name] for p in rest})

    return packed, spread


def session_of(request: gr.Request | None) -> str:
    return getattr(request, "session_hash", None) or ""


def short_error(err: Exception):
    return gr.Error(str(err), print_exception=False)


def explorer_line(err: ExplorerError) -> str:
    """A short message naming the rank (the cause and its traceback go to the server log only)."""
    print(f"[dex] {err}", file=sys.stderr, flush=True)
    line = str(err).splitlines()[0]
    if " failed: " in line:
        line = line.split(" failed: ")[0] + " failed (the cause is in the server log)"
    return f"{line}; the next request starts fresh explorers"


def busy():
    """A run button while its request runs or waits in the queue: not clickable (``idle`` after it ends,
    however it ends: finished, stopped, refused or failed)."""
    return gr.Button(interactive=False)


def idle():
    return gr.Button(interactive=True)


class StopRequests:
    """Sessions whose Stop was pressed (one set per tab). The Live handler checks its session after every
    round, the Race's after every step, and ends itself with a "stopped" frame (a cancelled generator
    could still deliver a round after the Stop handler's "stopped" and overwrite it)."""

    def __init__(self):
        self._sessions: set[str] = set()
        self._lock = threading.Lock()

    def request(self, session: str) -> None:
        with self._lock:
            self._sessions.add(session)

    def take(self, session: str) -> bool:
        with self._lock:
            found = session in self._sessions
            self._sessions.discard(session)
            return found


class Deadline:
    """The host's bound on one request's model time (``AppSettings.request_seconds``; 0: none), counted
    from when the model work starts (first-use loading and the Race's profile are not in it)."""

    def __init__(self, seconds: int):
        self.seconds = seconds
        self.end = time.monotonic() + seconds if seconds else math.inf

    def left(self) -> float:
        return self.end - time.monotonic()

    def reason(self) -> str | None:
        """Why the request must end now ("at this host's limit …"), or None while it may go on."""
        return (
            f"at this host's limit of {self.seconds} s of model time per request" if self.left() < 0 else None
        )


@dataclass(frozen=True)
class Stopping:
    """What ends a session's model request after its round or step: its Stop, or the host's bound."""

    stops: StopRequests
    session: str
    deadline: Deadline

    def reason(self) -> str | None:
        """Why the request ends now ("by you", "at this host's limit …"), or None while it may go on."""
        return "by you" if self.stops.take(self.session) else self.deadline.reason()


def in_background(work, status):
    """Run ``work()`` in a thread, yielding ``status(elapsed seconds)`` twice a second until it is done; an
    exception it raised is raised again here, in the request's own thread."""
    failed, done = [], threading.Event()

    def run():
        try:
            work()
        except Exception as err:
            failed.append(err)
        finally:
            done.set()

    threading.Thread(target=run, daemon=True).start()
    tic = time.monotonic()
    while not done.wait(0.5):
        yield status(time.monotonic() - tic)
    if failed:
        raise failed[0]


def loading(runtime: Runtime):
    """Load the model in a thread (when it is not loaded yet), yielding a status line twice a second: the
    loading stage ``load_model`` reports (fetching, converting, loading) and its elapsed time."""
    if runtime.loaded:
        return
    stage = [f"loading {runtime.settings.model}"]
    yield from in_background(
        lambda: runtime.prepare(log=lambda line: stage.__setitem__(0, line)),
        lambda s: f"first use: {stage[0]} ({s:.0f} s)",
    )
