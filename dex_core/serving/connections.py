"""Connections a slow or silent client cannot hold: both servers' HTTP protocol (``dex serve --http`` and the app,
also as ``gradio app/main.py``).

uvicorn bounds only the idle time after an answer (``timeout_keep_alive``). A client that opens a connection and
never finishes a request's head, or sends a body a byte at a time and then nothing, holds a socket, and an upload's
share of the server, for as long as it likes: 300 such connections were all still open after a minute.
``BoundedH11`` is uvicorn's h11 protocol with the three bounds a public server needs, checked every
``CHECK_SECONDS``:

- a request's head must arrive whole within ``HEAD_SECONDS`` of the connection opening or of its previous answer;
- a request's body may pause at most ``BODY_GAP_SECONDS`` between two reads (not while the server itself has
  paused reading: that wait is the server's);
- an idle connection after an answer is closed after ``KEEP_ALIVE_SECONDS`` (uvicorn's own timer).

A connection past a bound is closed without an answer: the application sees the client leave (an upload's handler
gets ``ClientDisconnect``, which frees its share). Once a request's body is in, the answer may take as long as the
application needs (a stream of tokens). uvicorn's warnings about a connection (an invalid request, an unsupported
upgrade) are written at most once a minute per client address (``LOG_EVERY_SECONDS``), so a hostile client cannot
fill the log.
"""

from __future__ import annotations

import contextlib
import logging
import time

import h11
import uvicorn
from uvicorn.config import HTTP_PROTOCOLS
from uvicorn.protocols.http.h11_impl import H11Protocol

HEAD_SECONDS = 10.0
BODY_GAP_SECONDS = 15.0
KEEP_ALIVE_SECONDS = 5  # uvicorn's default, stated here so that the docs and the servers agree
CHECK_SECONDS = 1.0
LOG_EVERY_SECONDS = 60.0


_LAST_LINE: dict[str, float] = {}  # client address -> when its connections last wrote to the log


class _QuietLog(logging.LoggerAdapter):
    """uvicorn's connection log, at most one line per client address every ``LOG_EVERY_SECONDS``."""

    def __init__(self, logger: logging.Logger, client: str):
        super().__init__(logger, {})
        self.client = client

    @property
    def level(self) -> int:  # uvicorn reads it before its trace-level lines
        return self.logger.level

    def log(self, level, msg, *args, **kwargs):
        now = time.monotonic()
        if now - _LAST_LINE.get(self.client, -LOG_EVERY_SECONDS) < LOG_EVERY_SECONDS:
            return
        if len(_LAST_LINE) > 10_000:  # forget addresses quiet for a minute: the table stays small
            for client, when in list(_LAST_LINE.items()):
                if now - when >= LOG_EVERY_SECONDS:
                    del _LAST_LINE[client]
        _LAST_LINE[self.client] = now
        super().log(level, msg, *args, **kwargs)


class BoundedH11(H11Protocol):
    """uvicorn's h11 protocol with a bound on a request head's time and on a body's pauses (module docstring)."""

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self.logger = _QuietLog(self.logger, self.client[0] if self.client else "?")
        self.waiting_since = self.last_read = time.monotonic()
        self._next_check = self.loop.call_later(CHECK_SECONDS, self._check)

    def data_received(self, data: bytes) -> None:
        self.last_read = time.monotonic()
        super().data_received(data)

    def on_response_complete(self) -> None:
        self.waiting_since = time.monotonic()
        super().on_response_complete()

    def connection_lost(self, exc) -> None:
        self._next_check.cancel()
        super().connection_lost(exc)

    def overdue(self, now: float) -> bool:
        """Whether the client has broken a bound: no whole head in time, or a body that stopped coming."""
        if self.cycle is None or self.cycle.response_complete:  # waiting for a request's head
            return now - self.waiting_since > HEAD_SECONDS
        if self.conn.their_state is not h11.SEND_BODY:
            return False  # the body is in: the answer takes what it takes
        if self.flow.read_paused:  # the server is not reading: not the client's pause
            self.last_read = now
        return now - self.last_read > BODY_GAP_SECONDS

    def _check(self) -> None:
        upgraded = self.transport.get_protocol() is not self  # a WebSocket now: its own protocol's
        if self.transport.is_closing() or upgraded:
            return
        if self.overdue(time.monotonic()):
            self.transport.close()  # connection_lost tells a request in progress that its client left
            return
        self._next_check = self.loop.call_later(CHECK_SECONDS, self._check)


def server_config(app, host: str, port: int, **options) -> uvicorn.Config:
    """uvicorn's configuration for ``app`` at ``host``:``port`` with the bounded protocol; ``options`` are
    uvicorn's (``log_level``, ``access_log``, ...)."""
    return uvicorn.Config(
        app, host=host, port=port, http=BoundedH11, timeout_keep_alive=KEEP_ALIVE_SECONDS, **options
    )


@contextlib.contextmanager
def bounded_connections():
    """While it lasts, a uvicorn server made without a protocol of its own (Gradio's ``launch`` makes one) gets
    ``BoundedH11``: Gradio passes uvicorn no protocol, and its server reads uvicorn's table before it starts."""
    auto = HTTP_PROTOCOLS["auto"]
    HTTP_PROTOCOLS["auto"] = f"{__name__}:BoundedH11"
    try:
        yield
    finally:
        HTTP_PROTOCOLS["auto"] = auto
