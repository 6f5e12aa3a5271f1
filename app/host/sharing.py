"""Who has the model at once (``Sharing``): Live runs share it, and their rounds (``DexDecoder.share``); a Race or an
Analysis has it alone, so that its clocks count its own work. One that waits to be alone goes before Live runs that
arrive after it, so a stream of Live visitors cannot keep it waiting."""

from __future__ import annotations

import contextlib
import threading


class Sharing:
    """Shared (Live runs, at most the Live queue's concurrency) or alone (the Race, the Analysis)."""

    def __init__(self):
        self._changed = threading.Condition()
        self._shared = 0  # runs sharing the model now
        self._alone = False  # one has it alone now
        self._waiting = 0  # those waiting to have it alone

    @contextlib.contextmanager
    def shared(self):
        with self._changed:
            self._changed.wait_for(lambda: not self._alone and not self._waiting)
            self._shared += 1
        try:
            yield
        finally:
            with self._changed:
                self._shared -= 1
                self._changed.notify_all()

    @contextlib.contextmanager
    def alone(self):
        with self._changed:
            self._waiting += 1
            self._changed.wait_for(lambda: not self._alone and not self._shared)
            self._waiting -= 1
            self._alone = True
        try:
            yield
        finally:
            with self._changed:
                self._alone = False
                self._changed.notify_all()
