"""Who runs a server's requests (``Runner``): up to ``most`` at once, sharing the decoder's rounds
(``DexDecoder.share``), ``queue`` more waiting, a share of them per client, 429 beyond; each run's events go to its
caller until it ends, the client goes or its model time runs out (``Ended``). ``max_batch``: how many share rounds
by default on a device (``MAX_BATCH``)."""

from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass

import torch

from ..runtime.scoring import Scored
from ..trace.events import RoundEvent
from .api_requests import ApiError, Completion


class Runner:
    """Runs up to ``most`` requests at a time on the decoder, sharing its rounds (``DexDecoder.share``), ``queue``
    more waiting and at most ``per_client`` of them (running or waiting) from one client address (None: no such
    bound); 429 (``ApiError``) beyond."""

    def __init__(self, decoder, queue: int, seconds: float, per_client: int | None = None, most: int = 1):
        self.decoder, self.queue, self.seconds, self.per_client = decoder, queue, seconds, per_client
        self.most = most
        share = getattr(decoder, "share", None)
        if share is not None:
            share(most)
        self._model = threading.Semaphore(most)  # a request's run or scoring holds one
        self._count = threading.Lock()
        self.admitted = self.running = 0
        self._clients: dict[str, int] = {}

    def admit(self, client: str = "") -> None:
        with self._count:
            if self.admitted >= self.most + self.queue:
                raise ApiError(
                    429, "the server is busy: its queue is full; try again shortly", kind="rate_limit_error"
                )
            if self.per_client is not None and self._clients.get(client, 0) >= self.per_client:
                raise ApiError(
                    429,
                    f"this client has {self.per_client} request(s) running or waiting already; send the next "
                    "when one ends",
                    kind="rate_limit_error",
                )
            self.admitted += 1
            self._clients[client] = self._clients.get(client, 0) + 1

    def release(self, client: str = "") -> None:
        with self._count:
            self.admitted -= 1
            self._clients[client] -= 1
            if not self._clients[client]:
                del self._clients[client]

    @contextlib.contextmanager
    def holding(self, client: str = ""):
        """One admission (429 beyond the bounds) for all that runs inside (a request's several prompts)."""
        self.admit(client)
        try:
            yield
        finally:
            self.release(client)

    def run(self, job: Completion, emit, gone: threading.Event, since: float | None = None) -> None:
        """In a worker thread: the run's events to ``emit`` (round by round, then the end's); it ends after the
        round in progress when ``gone`` is set or ``seconds`` passed since ``since`` (default: its start)."""
        with self._model:
            with self._count:
                self.running += 1
            try:
                self._run(job, emit, gone, time.monotonic() if since is None else since)
            finally:
                with self._count:
                    self.running -= 1

    def score(self, job: Completion) -> list[Scored]:
        """In a worker thread: each of ``job``'s prompts scored by the model (``DexDecoder.score``)."""
        with self._model:
            return [self.decoder.score(ids, max(1, job.logprobs or 0)) for ids in job.prompts]

    def _run(self, job: Completion, emit, gone: threading.Event, start: float) -> None:
        asked = {} if job.logprobs is None else {"logprobs": job.logprobs}
        stream = self.decoder.stream(job.ids, options=job.options, **asked)
        for event in stream:
            emit(event)
            late = self.seconds and time.monotonic() - start > self.seconds
            if isinstance(event, RoundEvent) and (gone.is_set() or late):
                stream.close()
                emit(Ended("gone" if gone.is_set() else "time"))
                return


@dataclass(frozen=True)
class Ended:
    """What ends a run's queue of events early: the client went (``"gone"``), its model time ran out (``"time"``),
    or the run failed (``"failed"``: ``detail`` says why)."""

    why: str
    detail: str = ""


def max_batch(decoder, asked: int | None) -> int:
    """The requests that share rounds: ``asked``, else ``MAX_BATCH`` for the device of the decoder's final explorer (in
    this process, on explorer processes or under torchrun)."""
    if asked is not None:
        return asked
    return MAX_BATCH.get(torch.device(decoder.schedule.devices[-1]).type, MAX_BATCH["cuda"])


# requests that share each round by default, by device type: on this CPU 8 clients ran 1.89-2.25x their requests one
# at a time in two runs (4: 1.51-1.64x), p95 latency 2.9-3.5x a lone request's (docs/BENCHMARKS.md, "Many strangers
# in one round"); GPUs: the same until a GPU measures it
MAX_BATCH = {"cpu": 8, "cuda": 8}
