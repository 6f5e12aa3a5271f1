"""The gate: an ASGI middleware in front of Gradio (``Gate``). It refuses what Gradio would hand out or take that a
public Space must not: files in Gradio's temp folder the app did not export (``Files.denies``), deep links, uploads
past a bound (``app.host.uploads``: it answers every upload request itself), any other request body of Gradio's
past ``BODY_BYTES`` (413, read whole before Gradio sees it: Gradio would hold a body of any size in memory; the
OpenAI API under ``/openai`` bounds its own, with OpenAI's error bodies) and the calls
of a client that keeps sending malformed ones (``Calls``: each is answered with one line, and one line in the server
log, never a traceback). A peer that sends ``X-Forwarded-For`` which uvicorn did not trust is named once in the log
(``Proxies``): every client behind it counts as one visitor. On the MCP route (``app.host.mcp_route``) it refuses
the transports the app does not serve and vouches for the caller, whose tool calls Gradio makes back over loopback.
"""

from __future__ import annotations

import re
import sys
import threading
import time
from collections import deque

import anyio

from dex_core import BODY_SECONDS, MAX_BODY_BYTES

from . import mcp_route
from .files import Files
from .uploads import FORM_ROOM, Uploads, visitor

FILE_ROUTE = re.compile(r"/gradio_api/file(?:=|/)(.*)$")
UPLOAD_ROUTE = re.compile(r"/gradio_api/upload/?$")
DEEP_LINK = re.compile(r"/gradio_api/deep_link/?$")
CALL_ROUTE = re.compile(r"/gradio_api/(queue/join|call/|run/|api/)")
FLOOD_CALLS = 20  # malformed calls from one client within FLOOD_SECONDS before its calls are refused (429)
FLOOD_SECONDS = 60
BODY_BYTES = MAX_BODY_BYTES  # bytes of any request body but an upload's (the API's bound: 4 MiB)


class Calls:
    """Malformed API calls (too few inputs for an endpoint), counted per client; a flood is rate-limited, and the
    log has at most one line per client every ``FLOOD_SECONDS``."""

    def __init__(self, log=None):
        self._lock = threading.Lock()
        self._recent: dict[str, deque] = {}
        self._logged: dict[str, float] = {}  # client -> when its last line was written
        self.count = 0  # malformed calls since the server started
        self.log = log or (lambda line: print(f"[dex-app] {line}", file=sys.stderr, flush=True))

    def malformed(self, who: str, endpoint: str, why: str) -> None:
        now = time.monotonic()
        with self._lock:
            self.count += 1
            recent = self._recent.setdefault(who, deque())
            recent.append(now)
            while recent and now - recent[0] > FLOOD_SECONDS:
                recent.popleft()
            quiet = now - self._logged.get(who, -FLOOD_SECONDS) < FLOOD_SECONDS
            if not quiet:
                if len(self._logged) > 1024:  # forget clients quiet for a minute: the table stays small
                    self._logged = {c: t for c, t in self._logged.items() if now - t < FLOOD_SECONDS}
                self._logged[who] = now
        if not quiet:
            self.log(
                f"malformed call to {endpoint} from {who}: {why} (the next ones from it in {FLOOD_SECONDS} s "
                "are counted, not logged)"
            )

    def refusal(self, who: str) -> str | None:
        """Why ``who``'s calls are refused now (too many malformed calls lately), or None."""
        now = time.monotonic()
        with self._lock:
            recent = self._recent.get(who)
            while recent and now - recent[0] > FLOOD_SECONDS:
                recent.popleft()
            if not recent:
                self._recent.pop(who, None)
                return None
            if len(recent) < FLOOD_CALLS:
                return None
            wait = FLOOD_SECONDS - (now - recent[0])
        return f"too many malformed calls from this client; try again in {max(1, int(wait))} s"


class Proxies:
    """Peers whose ``X-Forwarded-For`` uvicorn ignored (they are not in ``FORWARDED_ALLOW_IPS``): each is named in
    the log once, as every client behind it counts as one visitor (docs/HOSTING.md, Visitors)."""

    MOST = 1024  # peers remembered; past it the log stays quiet

    def __init__(self, log):
        self._seen: set[str] = set()
        self.log = log

    def note(self, scope) -> None:
        forwarded = dict(scope.get("headers") or []).get(b"x-forwarded-for")
        who = visitor(scope)
        if not forwarded or who in self._seen or len(self._seen) >= self.MOST:
            return
        if who in (part.strip() for part in forwarded.decode("latin-1").split(",")):
            return  # uvicorn trusted the peer and took the client from the header
        self._seen.add(who)
        self.log(
            f"requests from {who} carry X-Forwarded-For, which this server does not trust: every client behind "
            f"{who} counts as one visitor; if it is your proxy, start the app with FORWARDED_ALLOW_IPS={who} "
            "(docs/HOSTING.md, Visitors)"
        )


async def _whole_body(receive, limit: int) -> list | None:
    """The messages of a request body read to its end, or None once it passes ``limit`` bytes; a client that
    leaves is a disconnect message, passed on as it came."""
    messages, size = [], 0
    while True:
        message = await receive()
        messages.append(message)
        if message["type"] != "http.request":
            return messages
        size += len(message.get("body", b""))
        if size > limit:
            return None
        if not message.get("more_body", False):
            return messages


def _replaying(messages: list, receive):
    """A ``receive`` that gives ``messages`` first, then what ``receive`` gives (a later disconnect)."""
    pending = list(messages)

    async def replay():
        return pending.pop(0) if pending else await receive()

    return replay


async def _answer(send, status: int, text: str) -> None:
    body = text.encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"text/plain; charset=utf-8"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


class Gate:
    def __init__(self, app, files: Files, uploads: Uploads, calls: Calls, api: str | None = None):
        """``api``: the route prefix of the OpenAI API, whose door bounds its bodies with OpenAI's error bodies."""
        self.app, self.files, self.uploads, self.calls, self.api = app, files, uploads, calls, api
        self.proxies = Proxies(calls.log)
        self.callers = mcp_route.Callers()

    def _own_bounds(self, route: str) -> bool:
        """Whether the request's route bounds its body itself: an upload (``app.host.uploads``), the API."""
        return bool(UPLOAD_ROUTE.search(route)) or (self.api is not None and route.startswith(f"{self.api}/"))

    def refusal(self, scope, length: int | None) -> tuple[int, str] | None:
        """(HTTP status, text) for a request the gate refuses; None lets it through."""
        method, route = scope["method"], scope["path"]
        if DEEP_LINK.search(route):
            return 404, "Not Found"
        if why := mcp_route.refusal(scope):
            return why
        found = FILE_ROUTE.search(route)
        if (
            found
            and method in ("GET", "HEAD")
            and "://" not in found.group(1)
            and self.files.denies(found.group(1))
        ):
            return 403, "File not allowed: files are served only while the session that made them lasts."
        if CALL_ROUTE.search(route) and method == "POST" and (why := self.calls.refusal(visitor(scope))):
            return 429, why
        if length is not None and length > BODY_BYTES and not self._own_bounds(route):
            return 413, f"A request body may be at most {BODY_BYTES // 2**20} MB."
        if UPLOAD_ROUTE.search(route) and method == "POST":
            if length is None:
                return 411, "An upload must say its size (Content-Length)."
            most = self.uploads.largest()
            if most is not None and length > most:
                return 413, f"An upload may be at most {(most - FORM_ROOM) // 2**20} MB."
            if why := self.uploads.refusal(visitor(scope), length):
                return 413, why
        return None

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        scope = self.callers.caller(scope)  # a tool call Gradio makes back: the MCP caller it is for
        headers = dict(scope.get("headers") or [])
        length = headers.get(b"content-length")
        length = int(length) if length and length.isdigit() else None
        self.proxies.note(scope)
        refused = self.refusal(scope, length)
        if refused is not None:
            return await _answer(send, *refused)
        if UPLOAD_ROUTE.search(scope["path"]) and scope["method"] == "POST":
            if await _failed(self.uploads.serve, scope, receive, send):  # Gradio's form parser failed on it
                await _answer(
                    send, 400, "The upload's form could not be read: send each file as a file part."
                )
            return
        if scope["method"] in ("POST", "PUT", "PATCH") and not self._own_bounds(scope["path"]):
            with anyio.move_on_after(BODY_SECONDS) as waited:
                messages = await _whole_body(receive, BODY_BYTES)
            if waited.cancelled_caught:
                return await _answer(send, 408, f"The request body did not arrive within {BODY_SECONDS:g} s.")
            if messages is None:
                return await _answer(send, 413, f"A request body may be at most {BODY_BYTES // 2**20} MB.")
            receive = _replaying(messages, receive)
            if mcp_route.ROUTE.match(scope["path"]) and await _nested_too_deep(messages):
                return await _answer(
                    send, 400, f"A request's JSON may nest at most {mcp_route.DEPTH} levels."
                )
        if mcp_route.ROUTE.match(scope["path"]):
            scope = self.callers.vouch(scope)
        if not (CALL_ROUTE.search(scope["path"]) and scope["method"] == "POST"):
            return await self.app(scope, receive, send)
        err = await _failed(self.app, scope, receive, send)
        if err is not None:  # Gradio's routing failed on what the call named (an endpoint, an index)
            self.calls.malformed(visitor(scope), scope["path"], f"{type(err).__name__}: {str(err)[:80]}")
            await _answer(send, 404, "no such endpoint or event handler")


async def _nested_too_deep(messages: list) -> bool:
    """Whether a body (its messages) nests too deeply for the MCP route (``mcp_route.too_deep``, in a thread)."""
    return await anyio.to_thread.run_sync(mcp_route.too_deep, b"".join(m.get("body", b"") for m in messages))


async def _failed(app, scope, receive, send) -> Exception | None:
    """Run ``app`` on the request; the exception it raised before its answer began (the caller answers in one
    line, not Gradio's traceback and 500), else None."""
    started = [False]

    async def noting(message):
        started[0] = started[0] or message["type"] == "http.response.start"
        await send(message)

    try:
        await app(scope, receive, noting)
    except Exception as err:
        if started[0]:
            raise
        return err
    return None
