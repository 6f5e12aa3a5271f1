"""``HostReads``: count the places a decode waits for its device — every read of a tensor's values into Python.

On a GPU each of them is a sync: the host stops queueing kernels until the device has caught up, and a round
that reads K times runs K pipeline bubbles. Counted, through a ``TorchFunctionMode`` (which sees every tensor
method call in its scope): ``.item``, ``.tolist``, ``.cpu``, ``.numpy`` and the conversions ``bool``, ``int``,
``float`` and ``index`` (``if t:``, ``int(t)``, ``range(t)``), on any device — on CPU the same code runs, so a
test there counts what a GPU would wait for; and ``torch.cuda.Event.synchronize`` (a timing read), patched while
the counter is open. A ``.to("cpu")`` is a read too but is not seen by name; the runtime uses ``.cpu()``.

    with HostReads() as reads:
        ...
    reads.count, reads.where  # how many, and (name, caller file:line) of each

    for event, reads in reads_per_event(decoder.stream(prompt, 32)): ...  # a round's reads with its event
"""

from __future__ import annotations

import os
import sys
from collections import Counter
from collections.abc import Iterable, Iterator

import torch
from torch.overrides import TorchFunctionMode

READS = frozenset({"item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__"})


class HostReads(TorchFunctionMode):
    """A context that counts host reads of tensor values (and CUDA event syncs) made inside it."""

    def __init__(self):
        super().__init__()
        self.where: list[tuple[str, str]] = []
        self._sync = None

    @property
    def count(self) -> int:
        return len(self.where)

    def by_place(self) -> Counter:
        """How many reads each (name, caller) made."""
        return Counter(self.where)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in READS:
            self._note(name)
        return func(*args, **(kwargs or {}))

    def _note(self, name: str) -> None:
        frame = sys._getframe(1)
        while frame is not None and _inside_torch(frame.f_code.co_filename):
            frame = frame.f_back
        place = "?" if frame is None else f"{frame.f_code.co_filename.rsplit('/', 2)[-1]}:{frame.f_lineno}"
        self.where.append((name, place))

    def __enter__(self):
        original = torch.cuda.Event.synchronize
        counter = self

        def synchronize(event):
            counter._note("Event.synchronize")
            return original(event)

        self._sync = original
        torch.cuda.Event.synchronize = synchronize
        return super().__enter__()

    def __exit__(self, *exc):
        torch.cuda.Event.synchronize = self._sync
        return super().__exit__(*exc)


def _inside_torch(filename: str) -> bool:
    """Frames of this counter and of torch itself, skipped to name the caller that read."""
    return filename == __file__ or f"{os.sep}torch{os.sep}" in filename


def reads_per_event(events: Iterable) -> Iterator[tuple[object, HostReads]]:
    """Each item of ``events`` (a DEX stream: one event a round) with the host reads made while it was produced."""
    events = iter(events)
    while True:
        with HostReads() as counted:
            event = next(events, None)
        if event is None:
            return
        yield event, counted
