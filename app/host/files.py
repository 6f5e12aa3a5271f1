"""The app's files on disk, and which files its server hands out.

Left alone, Gradio serves every file under its temp folder (``GRADIO_TEMP_DIR``, default ``/tmp/gradio``)
to anyone who names it, other processes' files included, and copies each file a handler returns under a
content hash, served for its cache's time-to-live. ``Files`` narrows that:

- the app's folder, ``dex-app-XXXX`` in Gradio's temp folder, holds everything the app writes; a lock file in it
  (``filelock``) is held while the server lives, and a server that starts deletes the ``dex-app-*`` folders,
  older than itself, whose lock no live process holds (an earlier server that was killed);
- exports (saved traces, GraphML, HTML reports) are written at ``dex-app-XXXX/<token>/NAME`` with a 128-bit
  random token, one folder each; an export belongs to the session that made it and is deleted when that
  session ends or ``file_ttl`` seconds after it was made;
- uploads land in ``dex-app-XXXX/uploads/<token>/``, one folder per request (``app.host.uploads`` counts them);
- the gate (``app.host.gate``) serves from Gradio's temp folder only those exports, while they last, and the files
  Gradio cached for this app's components; uploads, other processes' files and deep links are refused;
- the app's folder is removed when the server stops and at exit, SIGTERM included.
"""

from __future__ import annotations

import atexit
import os
import secrets
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

from filelock import FileLock, Timeout
from gradio.utils import get_upload_folder

PREFIX = "dex-app-"
LOCK = ".lock"


def within(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def _remove(path: Path, stop: Path) -> None:
    """Delete a file and the folders above it, up to ``stop``, that it leaves empty."""
    path.unlink(missing_ok=True)
    for folder in path.parents:
        if folder == stop or not within(folder, stop):
            break
        try:
            folder.rmdir()
        except OSError:
            break


def sweep_orphans(temp: Path, mine: Path, started: float) -> list[Path]:
    """Delete the ``dex-app-*`` folders in ``temp``, other than ``mine``, made before ``started`` whose lock no live
    process holds (their server was killed); returns them."""
    gone = []
    for folder in temp.glob(PREFIX + "*"):
        if folder == mine or not folder.is_dir() or folder.stat().st_mtime >= started:
            continue
        probe = FileLock(folder / LOCK, timeout=0)
        try:
            probe.acquire()
        except Timeout:
            continue  # a live server's
        probe.release()
        shutil.rmtree(folder, ignore_errors=True)
        gone.append(folder)
    return gone


class Files:
    def __init__(self, settings):
        self.settings = settings
        self.blocks = None  # the launched Blocks: the files Gradio cached for its components
        self._root: Path | None = None
        self._held: FileLock | None = None
        self._lock = threading.Lock()
        self._exports: dict[Path, tuple[str, float]] = {}  # folder -> (session, made at)

    @property
    def temp(self) -> Path:
        """Gradio's temp folder (uploads, its cache), read where Gradio reads it: ``GRADIO_TEMP_DIR``."""
        return Path(get_upload_folder()).resolve()

    def folder(self) -> Path:
        """The app's folder, made (and its lock taken, earlier servers' orphans swept) on first use: at the
        server's start."""
        with self._lock:
            if self._root is None:
                started = time.time()
                self.temp.mkdir(parents=True, exist_ok=True)
                self._root = Path(tempfile.mkdtemp(prefix=PREFIX, dir=self.temp)).resolve()
                self._held = FileLock(self._root / LOCK)
                self._held.acquire()
                atexit.register(self.remove)
                sweep_orphans(self.temp, self._root, started)
            return self._root

    def upload_folder(self) -> Path:
        """A fresh folder for one upload request's files."""
        folder = self.folder() / "uploads" / secrets.token_urlsafe(16)
        folder.mkdir(parents=True)
        return folder

    def remove_upload(self, path: Path) -> None:
        """Delete an upload and the folders it leaves empty, up to the uploads' folder."""
        if self._root is not None:
            _remove(path, self._root / "uploads")

    def export(self, session: str, name: str) -> Path:
        """A fresh path for a file handed to ``session``'s browser, in a folder of its own."""
        folder = self.folder() / secrets.token_urlsafe(16)
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
        """Delete the exports older than ``file_ttl``."""
        limit = time.time() - self.settings.file_ttl
        with self._lock:
            old = [folder for folder, (_, made) in self._exports.items() if made < limit]
            for folder in old:
                del self._exports[folder]
        for folder in old:
            shutil.rmtree(folder, ignore_errors=True)

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

    def denies(self, name: str) -> bool:
        """Whether a file route's path (as requested) is in Gradio's temp folder and not one the app serves; a path
        no file can have (a NUL byte) is denied."""
        if "\x00" in name:
            return True
        path = Path(os.path.abspath(name)).resolve()
        return within(path, self.temp) and not self.serves(path)

    def remove(self) -> None:
        """Delete the app's folder and every file in it (the server stopped, or the process exits)."""
        with self._lock:
            root, self._root = self._root, None
            held, self._held = self._held, None
            self._exports.clear()
        if root is not None:
            shutil.rmtree(root, ignore_errors=True)
        if held is not None:
            held.release()

    def exit_on_sigterm(self) -> None:
        """Make SIGTERM remove the folder and exit through ``sys.exit`` (so ``atexit`` runs too). Only from
        the main thread, and only while SIGTERM still has its default action (a host's handler stays)."""
        if (
            threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
        ):
            signal.signal(signal.SIGTERM, self._terminated)

    def _terminated(self, signum, _frame):
        # a second SIGTERM while this one exits (the parent's death signal, ``gradio_cli``, after the parent forwarded
        # its own) is ignored: raised inside the exit's finalizers it would print a traceback and cut them short
        signal.signal(signum, signal.SIG_IGN)
        self.remove()
        sys.exit(128 + signum)
