"""The app's files on disk, and which files its server hands out.

Left alone, Gradio serves every file under its temp folder (``GRADIO_TEMP_DIR``, default ``/tmp/gradio``)
to anyone who names it, other processes' files included; accepts uploads from anyone (the browser sends
no session with ``POST /gradio_api/upload``) and keeps them for its cache's time-to-live; and copies each
file a handler returns under a content hash, served for as long. ``Files`` narrows that:

- exports (saved traces, GraphML, HTML reports) are written in place in Gradio's temp folder, at
  ``dex-app-XXXX/<token>/NAME`` with a 128-bit random token, one folder each; an export belongs to the
  session that made it and is deleted when that session ends or ``file_ttl`` seconds after it was made;
- the gate (``Gate``, an ASGI middleware) serves from Gradio's temp folder only those exports, while they
  last, and the files Gradio cached for this app's components; uploads, other processes' files and deep
  links are refused;
- uploads are bounded: Gradio's ``max_file_size`` per request, ``upload_mb`` for all uploads still on disk
  together (one more is refused with 413); an upload goes ``READ_GRACE`` seconds after the Debugger read
  it, one never loaded after ``file_ttl`` seconds;
- the ``dex-app-*`` folder is removed when the server stops and at exit, SIGTERM included.
"""

from __future__ import annotations

import atexit
import json
import os
import re
import secrets
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

from gradio.utils import get_upload_folder

FILE_ROUTE = re.compile(r"/gradio_api/file(?:=|/)(.*)$")
UPLOAD_ROUTE = re.compile(r"/gradio_api/upload/?$")
DEEP_LINK = re.compile(r"/gradio_api/deep_link/?$")
READ_GRACE = 10  # seconds an upload stays after it was read (two visitors who upload one file share its path)


def _within(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def _remove(path: Path, temp: Path) -> None:
    """Delete a file and the folder Gradio made for it in ``temp`` when that is left empty."""
    path.unlink(missing_ok=True)
    if path.parent != temp:
        try:
            path.parent.rmdir()
        except OSError:
            pass


class Files:
    def __init__(self, settings):
        self.settings = settings
        self.blocks = None  # the launched Blocks: the files Gradio cached for its components
        self._root: Path | None = None
        self._lock = threading.Lock()
        self._exports: dict[Path, tuple[str, float]] = {}  # folder -> (session, made at)
        self._uploads: dict[Path, tuple[int, float]] = {}  # upload -> (bytes, received at)
        self._arriving = 0  # bytes of uploads being received (their Content-Length)

    @property
    def temp(self) -> Path:
        """Gradio's temp folder (uploads, its cache), read where Gradio reads it: ``GRADIO_TEMP_DIR``."""
        return Path(get_upload_folder()).resolve()

    def _folder(self) -> Path:
        with self._lock:
            if self._root is None:
                self.temp.mkdir(parents=True, exist_ok=True)
                self._root = Path(tempfile.mkdtemp(prefix="dex-app-", dir=self.temp)).resolve()
                atexit.register(self.remove)
            return self._root

    def export(self, session: str, name: str) -> Path:
        """A fresh path for a file handed to ``session``'s browser, in a folder of its own."""
        folder = self._folder() / secrets.token_urlsafe(16)
        folder.mkdir()
        with self._lock:
            self._exports[folder] = (session, time.time())
        return folder / name

    def drop(self, session: str) -> None:
        """Delete every export of ``session`` (its tab closed, or it was dropped)."""
        with self._lock:
            gone = [folder for folder, (owner, _) in self._exports.items() if owner == session]
            for folder in gone:
                del self._exports[folder]
        for folder in gone:
            shutil.rmtree(folder, ignore_errors=True)

    def expire(self) -> None:
        """Delete the exports and the uploads older than ``file_ttl``."""
        limit = time.time() - self.settings.file_ttl
        with self._lock:
            old = [folder for folder, (_, made) in self._exports.items() if made < limit]
            for folder in old:
                del self._exports[folder]
            stale = [path for path, (_, came) in self._uploads.items() if came < limit]
        for folder in old:
            shutil.rmtree(folder, ignore_errors=True)
        for path in stale:
            self._delete_upload(path)

    def serves(self, path: Path) -> bool:
        """Whether the gate lets ``path`` (resolved, in Gradio's temp folder) out: a live export, or a file
        Gradio cached for one of this app's components (not an upload)."""
        with self._lock:
            export = self._exports.get(path.parent)
        if export is not None:
            return time.time() - export[1] <= self.settings.file_ttl
        blocks = self.blocks
        if blocks is None:
            return False
        cached = [files for files in list(blocks.temp_file_sets) if files is not blocks.upload_file_set]
        return any(str(path) in files for files in cached)

    def uploaded_bytes(self) -> int:
        with self._lock:
            return sum(size for size, _ in self._uploads.values()) + self._arriving

    def received(self, paths: list[str], length: int) -> None:
        """Note the files an upload request of ``length`` bytes stored (Gradio's reply lists them; one that
        Gradio still moves in the background counts as the request's share)."""
        now, temp = time.time(), self.temp
        for name in paths:
            path = Path(name).resolve()
            if _within(path, temp):
                size = path.stat().st_size if path.is_file() else length // max(1, len(paths))
                with self._lock:
                    self._uploads[path] = (size, now)

    def consumed(self, name: str | Path) -> None:
        """An upload the app has read: it goes ``READ_GRACE`` seconds later (or ``file_ttl``, if shorter)."""
        path = Path(name).resolve()
        with self._lock:
            if path in self._uploads:
                size, came = self._uploads[path]
                grace = min(READ_GRACE, self.settings.file_ttl)
                self._uploads[path] = (size, min(came, time.time() - self.settings.file_ttl + grace))

    def _delete_upload(self, path: Path) -> None:
        with self._lock:
            self._uploads.pop(path, None)
        _remove(path, self.temp)
        if self.blocks is not None:
            self.blocks.upload_file_set.discard(str(path))

    def refusal(self, method: str, route: str, length: int | None) -> tuple[int, str] | None:
        """(HTTP status, text) for a request the gate refuses; None lets it through to Gradio."""
        if DEEP_LINK.search(route):
            return 404, "Not Found"
        found = FILE_ROUTE.search(route)
        if found and method in ("GET", "HEAD") and "://" not in found.group(1):
            path = Path(os.path.abspath(found.group(1))).resolve()
            if _within(path, self.temp) and not self.serves(path):
                return 403, "File not allowed: files are served only while the session that made them lasts."
        if UPLOAD_ROUTE.search(route) and method == "POST":
            if length is None:
                return 411, "An upload must say its size (Content-Length)."
            most = getattr(self.blocks, "max_file_size", None)
            if most is not None and length > most + 2**20:  # a file's limit, and room for the form around it
                return 413, f"An upload may be at most {most // 2**20} MB."
            limit = self.settings.upload_mb * 2**20
            if self.uploaded_bytes() + length > limit:
                return 413, (
                    f"This server holds {self.settings.upload_mb} MB of recent uploads, its limit for all "
                    "visitors (DEX_UPLOAD_MB); try again in a few minutes."
                )
        return None

    def arriving(self, size: int) -> None:
        with self._lock:
            self._arriving += size

    def remove(self) -> None:
        """Delete the app's folder and every file in it (the server stopped, or the process exits)."""
        with self._lock:
            root, self._root = self._root, None
            self._exports.clear()
        if root is not None:
            shutil.rmtree(root, ignore_errors=True)

    def exit_on_sigterm(self) -> None:
        """Make SIGTERM remove the folder and exit through ``sys.exit`` (so ``atexit`` runs too). Only from
        the main thread, and only while SIGTERM still has its default action (a host's handler stays)."""
        if (
            threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
        ):
            signal.signal(signal.SIGTERM, self._terminated)

    def _terminated(self, signum, _frame):
        self.remove()
        sys.exit(128 + signum)


class Gate:
    """ASGI middleware in front of Gradio: refuses what ``Files.refusal`` names, counts uploads in flight
    against the upload budget and notes the files each upload stored."""

    def __init__(self, app, files: Files):
        self.app, self.files = app, files

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        length = headers.get(b"content-length")
        length = int(length) if length and length.isdigit() else None
        refused = self.files.refusal(scope["method"], scope["path"], length)
        if refused is not None:
            status, text = refused
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
            return await send({"type": "http.response.body", "body": body})
        if not (UPLOAD_ROUTE.search(scope["path"]) and scope["method"] == "POST"):
            return await self.app(scope, receive, send)
        reply, ok = [], [False]

        async def noting(message):
            if message["type"] == "http.response.start":
                ok[0] = message["status"] == 200
            elif message["type"] == "http.response.body" and ok[0]:
                reply.append(message.get("body", b""))
            await send(message)

        self.files.arriving(length)
        try:
            await self.app(scope, receive, noting)
            if ok[0]:
                self.files.received(_paths(b"".join(reply)), length)
        finally:
            self.files.arriving(-length)


def _paths(reply: bytes) -> list[str]:
    """The stored paths an upload's reply lists (a JSON list of strings)."""
    try:
        paths = json.loads(reply)
    except ValueError:
        return []
    return [p for p in paths if isinstance(p, str)] if isinstance(paths, list) else []
