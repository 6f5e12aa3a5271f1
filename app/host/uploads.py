"""Uploads, counted from their first byte (``Uploads``).

Gradio's own upload route writes a request's files into its temp folder as the bytes arrive and answers 200 to a
multipart body cut off before its closing boundary, leaving the part it had begun on disk, unnamed by any reply; a
body shorter than its declared length leaves its file the same way. The app answers ``POST /gradio_api/upload``
itself (``serve``, called by the gate, ``app.host.gate``), through Gradio's own parser (``route_utils.upload_fn``):

- each request writes into a folder of its own (``Files.upload_folder``), so every file that lands during it is
  known, and at its end every file the reply does not name is deleted, whether or not the request succeeded;
- every byte received counts at once against the visitor's slice (``visitor_upload_mb``) and the server's budget
  (``upload_mb``); a request that would pass either is refused before it is read (by its Content-Length) or cut
  off with 413 the moment it does (a body may lie about its length); a refusal names the bound and when it frees;
- a stored upload counts until the Debugger read it (and ``READ_GRACE`` seconds more), ``UNREAD_SECONDS`` if it
  is never read, or ``file_ttl`` passed, whichever is first.

A visitor is the client's address as uvicorn reports it: behind a proxy, the address the trusted proxy put in
``X-Forwarded-For`` (uvicorn's ``FORWARDED_ALLOW_IPS``, docs/HOSTING.md), else the peer's own. An upload that sends
nothing for ``BODY_GAP_SECONDS`` is dropped by the server's protocol (``dex_core.serving.connections``): its
handler sees the client leave and its bytes stop counting.
"""

from __future__ import annotations

import json
import math
import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from gradio.route_utils import upload_fn
from gradio.routes import file_upload_statuses
from starlette.exceptions import HTTPException
from starlette.formparsers import MultiPartException
from starlette.requests import ClientDisconnect, Request

READ_GRACE = 10  # seconds an upload stays after it was read (two visitors who upload one file share its path)
# seconds an upload the app never read stays: the page loads an upload the moment it lands, a client of the API
# right after its upload call, so one unread this long was left (or sent to hold the upload budget)
UNREAD_SECONDS = 120
FORM_ROOM = 2**20  # bytes of multipart framing allowed around a file of the largest size


@dataclass
class Stored:
    """An upload a reply named: whose, its bytes, when it came and when the app read it (``time.time()``)."""

    visitor: str
    size: int
    came: float
    read: float | None = None

    def ends(self, ttl: float) -> float:
        """When it goes: ``UNREAD_SECONDS`` after it came if it is never read, ``READ_GRACE`` after it was read,
        ``ttl`` after it came at the latest."""
        if self.read is None:
            return self.came + min(UNREAD_SECONDS, ttl)
        return min(self.came + ttl, self.read + min(READ_GRACE, ttl))


class _Over(Exception):
    """A request whose bytes passed a bound while they arrived."""


def visitor(scope) -> str:
    """The client address of an ASGI request (``scope["client"]``, set by uvicorn's proxy-header handling)."""
    client = scope.get("client")
    return str(client[0]) if client else "unknown"


def request_visitor(request) -> str:
    """The same address for a handler's ``gr.Request`` (None outside a request: "unknown")."""
    client = getattr(request, "client", None)
    return str(client.host) if getattr(client, "host", None) else "unknown"


class Uploads:
    def __init__(self, settings, files):
        self.settings, self.files = settings, files
        self.blocks = (
            None  # the launched Blocks (its upload size limit, the set of files Gradio lets handlers read)
        )
        self._lock = threading.Lock()
        self._stored: dict[Path, Stored] = {}
        self._arriving: dict[str, int] = {}  # visitor -> bytes of its requests in flight, received so far

    def used(self, who: str | None = None) -> int:
        """Bytes on disk or arriving: one visitor's, or everyone's."""
        with self._lock:
            stored = sum(s.size for s in self._stored.values() if who in (None, s.visitor))
            arriving = sum(n for v, n in self._arriving.items() if who in (None, v))
        return stored + arriving

    def _frees(self, who: str | None) -> str:
        """When the earliest of a visitor's (or anyone's) stored uploads goes."""
        with self._lock:
            times = [
                s.ends(self.settings.file_ttl) for s in self._stored.values() if who in (None, s.visitor)
            ]
        if not times:
            return "they free as the uploads under way end"
        return f"the oldest goes in {max(1, math.ceil(min(times) - time.time()))} s"

    def refusal(self, who: str, more: int) -> str | None:
        """Why ``more`` bytes from ``who`` would pass a bound, or None."""
        s = self.settings
        if self.used(who) + more > s.visitor_upload_mb * 2**20:
            return (
                f"you hold {self.used(who) / 2**20:.0f} MB of uploads on this server; each visitor may hold "
                f"{s.visitor_upload_mb} MB (DEX_VISITOR_UPLOAD_MB): {self._frees(who)}, or at once when loaded"
            )
        if self.used() + more > s.upload_mb * 2**20:
            return (
                f"this server holds {s.upload_mb} MB of recent uploads, its limit for all visitors "
                f"(DEX_UPLOAD_MB): {self._frees(None)}; try again then"
            )
        return None

    def largest(self) -> int | None:
        """The most bytes one upload request may send: Gradio's ``max_file_size`` and the form around it."""
        most = getattr(self.blocks, "max_file_size", None)
        return None if most is None else most + FORM_ROOM

    def _take(self, who: str, size: int) -> None:
        """Count ``size`` more bytes of ``who``'s request; ``_Over`` when they pass a bound."""
        refused = self.refusal(who, size)
        with self._lock:
            self._arriving[who] = self._arriving.get(who, 0) + size
        if refused is not None:
            raise _Over(refused)

    async def serve(self, scope, receive, send) -> None:
        """One upload request, its Content-Length already checked against the bounds (``app.host.gate``)."""
        who, folder, stored, got = visitor(scope), self.files.upload_folder(), [], [0]

        async def counted():
            message = await receive()
            if message["type"] == "http.request":
                got[0] += len(message.get("body", b""))
                self._take(who, len(message.get("body", b"")))
            return message

        upload_id = Request(scope).query_params.get("upload_id")
        status, body = 200, b""
        try:
            stored, *_ = await upload_fn(
                Request(scope, counted),
                str(folder),
                getattr(self.blocks, "max_file_size", None) or math.inf,
                upload_id,
                force_move=True,
                upload_progress=file_upload_statuses if upload_id else None,
            )
            if not stored:  # Gradio answers 200 to a body cut off before its closing boundary
                raise MultiPartException(
                    "the upload held no complete file: its body ended before its last boundary"
                )
            body = json.dumps(stored).encode()
        except _Over as over:
            status, body = 413, str(over).encode()
        except MultiPartException as exc:
            too_big = "File size exceeded" in exc.message  # a part's head Gradio cannot parse is a 400
            status, body = (413 if too_big else 400), exc.message.encode()
        except HTTPException as exc:
            status, body = exc.status_code, str(exc.detail).encode()
        except ClientDisconnect:
            status = None  # nobody is left to answer
        finally:
            self._settle(who, got[0], folder, stored)
        if status is not None:
            kind = b"application/json" if status == 200 else b"text/plain; charset=utf-8"
            await send(
                {
                    "type": "http.response.start",
                    "status": status,
                    "headers": [(b"content-type", kind), (b"content-length", str(len(body)).encode())],
                }
            )
            await send({"type": "http.response.body", "body": body})

    def _settle(self, who: str, arrived: int, folder: Path, stored: list[str]) -> None:
        """A request ended: its bytes in flight become the files its reply names; every other file goes."""
        keep, now = {Path(p).resolve() for p in stored}, time.time()
        with self._lock:
            self._arriving[who] = self._arriving.get(who, 0) - arrived
            if self._arriving[who] <= 0:
                del self._arriving[who]
            for path in keep:
                self._stored[path] = Stored(who, path.stat().st_size if path.is_file() else 0, now)
        if not keep:
            shutil.rmtree(folder, ignore_errors=True)
            return
        for path in sorted(folder.rglob("*"), reverse=True):  # files first, then the folders left empty
            if path.is_file() and path not in keep:
                path.unlink(missing_ok=True)
            elif path.is_dir() and not any(path.iterdir()):
                path.rmdir()
        if self.blocks is not None:
            self.blocks.upload_file_set.update(str(p) for p in keep)

    def consumed(self, name: str | Path) -> None:
        """An upload the app has read: it goes ``READ_GRACE`` seconds later (or ``file_ttl``, if shorter)."""
        path = Path(name).resolve()
        with self._lock:
            if path in self._stored:
                self._stored[path].read = time.time()

    def expire(self) -> None:
        """Delete the uploads whose time is up (read, or never loaded for ``file_ttl``); each counts as used until
        its file is gone."""
        now, ttl = time.time(), self.settings.file_ttl
        with self._lock:
            gone = [path for path, s in self._stored.items() if s.ends(ttl) < now]
        for path in gone:
            self.files.remove_upload(path)
            if self.blocks is not None:
                self.blocks.upload_file_set.discard(str(path))
            with self._lock:
                self._stored.pop(path, None)
