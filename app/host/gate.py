"""The gate: an ASGI middleware in front of Gradio (``Gate``). It refuses what Gradio would hand out or take that a
public Space must not: files in Gradio's temp folder the app did not export (``Files.denies``), deep links, uploads
past a bound (``app.host.uploads``: it answers every upload request itself) and the calls of a client that keeps sending
malformed ones (``Calls``: each is answered with one line, and one line in the server log, never a traceback).
"""

from __future__ import annotations

import re
import sys
import threading
import time
from collections import deque

from .files import Files
from .uploads import FORM_ROOM, Uploads, visitor

FILE_ROUTE = re.compile(r"/gradio_api/file(?:=|/)(.*)$")
UPLOAD_ROUTE = re.compile(r"/gradio_api/upload/?$")
DEEP_LINK = re.compile(r"/gradio_api/deep_link/?$")
CALL_ROUTE = re.compile(r"/gradio_api/(queue/join|call/|run/|api/)")
FLOOD_CALLS = 20  # malformed calls from one client within FLOOD_SECONDS before its calls are refused (429)
FLOOD_SECONDS = 60


class Calls:
    """Malformed API calls (too few inputs for an endpoint), counted per client; a flood is rate-limited."""

    def __init__(self, log=None):
        self._lock = threading.Lock()
        self._recent: dict[str, deque] = {}
        self.count = 0  # malformed calls since the server started
        self._log = log or (lambda line: print(f"[dex-app] {line}", file=sys.stderr, flush=True))

    def malformed(self, who: str, endpoint: str, why: str) -> None:
        now = time.monotonic()
        with self._lock:
            self.count += 1
            recent = self._recent.setdefault(who, deque())
            recent.append(now)
            while recent and now - recent[0] > FLOOD_SECONDS:
                recent.popleft()
            n = len(recent)
        if n <= FLOOD_CALLS:  # past it the client's calls are refused at the gate, and the log stays quiet
            self._log(f"malformed call to {endpoint} from {who}: {why} ({n} in {FLOOD_SECONDS} s)")

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
    def __init__(self, app, files: Files, uploads: Uploads, calls: Calls):
        self.app, self.files, self.uploads, self.calls = app, files, uploads, calls

    def refusal(self, scope, length: int | None) -> tuple[int, str] | None:
        """(HTTP status, text) for a request the gate refuses; None lets it through."""
        method, route = scope["method"], scope["path"]
        if DEEP_LINK.search(route):
            return 404, "Not Found"
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
        headers = dict(scope.get("headers") or [])
        length = headers.get(b"content-length")
        length = int(length) if length and length.isdigit() else None
        refused = self.refusal(scope, length)
        if refused is not None:
            return await _answer(send, *refused)
        if UPLOAD_ROUTE.search(scope["path"]) and scope["method"] == "POST":
            return await self.uploads.serve(scope, receive, send)
        if not (CALL_ROUTE.search(scope["path"]) and scope["method"] == "POST"):
            return await self.app(scope, receive, send)
        started = [False]

        async def noting(message):
            started[0] = started[0] or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, noting)
        except Exception as err:  # Gradio's routing failed on what the call named (an endpoint, an index)
            if started[0]:
                raise
            self.calls.malformed(visitor(scope), scope["path"], f"{type(err).__name__}: {str(err)[:80]}")
            await _answer(send, 404, "no such endpoint or event handler")
