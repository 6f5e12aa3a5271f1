"""What every model request of the app shares: a Stop per session and tab (``StopRequests``) and the host's
bound on one request's model time (``Deadline``, ``AppSettings.request_seconds``). The Live and Race
handlers check both after every round or step and end themselves with what they made."""

from __future__ import annotations

import math
import threading
import time


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
