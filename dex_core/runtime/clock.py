"""``Clock``: seconds of named spans, read from the device, not from the host's clock.

On CUDA a span is a pair of events on the device's current stream, read after the device has passed them, so queued
kernels are counted in the span that queued them (a host clock would see only their launch). Spans that follow one
another tile the stream's timeline, so they add up to the wall time. On CPU, ``time.perf_counter``.
"""

from __future__ import annotations

import itertools
import statistics
import time
from collections.abc import Collection, Hashable

import torch


class _Span:
    """One timed block of a ``Clock``."""

    __slots__ = ("clock", "name", "start")

    def __init__(self, clock: Clock, name: Hashable):
        self.clock, self.name = clock, name

    def __enter__(self) -> None:
        self.start = self.clock.stamp()

    def __exit__(self, *exc) -> None:
        self.clock._spans.setdefault(self.name, []).append((self.start, self.clock.stamp()))


class Clock:
    """Seconds of named spans on ``device``: ``with clock.span("decode"): ...``, then ``read()``."""

    def __init__(self, device):
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self._spans: dict[
            Hashable, list[tuple[object, object]]
        ] = {}  # name -> its unread (start, stop), in order
        self._free: list = []  # CUDA events already read, recorded again by later stamps: none made a round

    def stamp(self):
        """A point in time: a recorded CUDA event on the device's stream, or the host's clock."""
        if not self.cuda:
            return time.perf_counter()
        event = self._free.pop() if self._free else torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(self.device))
        return event

    def span(self, name: Hashable) -> _Span:
        """``with clock.span(name): ...`` times the block (a plain object, not a generator: a round opens ~20)."""
        return _Span(self, name)

    def read(self, names: Collection[Hashable] | None = None, wait: bool = True) -> dict:
        """Seconds per span name (only those in ``names`` when given) since the last read of those spans. On CUDA,
        with ``wait`` this waits until the device has passed the last of them (no wait when it has: ``query``);
        without, it takes only the spans the device has passed and leaves the rest to a later read, so a
        round's timings never stop the host (they may then count in the next round's)."""
        seconds: dict = {}
        for name in list(self._spans) if names is None else names:
            taken = self._spans.pop(name, [])
            if (
                self.cuda and taken and not wait
            ):  # the stream passes events in order: the done ones are a prefix
                done = sum(1 for _ in itertools.takewhile(lambda s: s[1].query(), taken))
                taken, rest = taken[:done], taken[done:]
                if rest:
                    self._spans[name] = rest
            elif self.cuda and taken and not taken[-1][1].query():
                taken[-1][1].synchronize()
            if taken:
                seconds[name] = sum(
                    start.elapsed_time(stop) / 1000 if self.cuda else stop - start for start, stop in taken
                )
                if self.cuda:  # passed and read: free to record again
                    self._free += [event for pair in taken for event in pair]
        return seconds

    def since(self, start) -> float:
        """Seconds from ``start`` (a ``stamp()``) to now; on CUDA, once the device has caught up."""
        stop = self.stamp()
        if not self.cuda:
            return stop - start
        stop.synchronize()
        return start.elapsed_time(stop) / 1000

    def seconds(self, name: Hashable, wait: bool = True) -> float:
        """``read((name,), wait)`` as one number (0 when the span did not run, or without ``wait`` has not ended on
        the device yet)."""
        return self.read((name,), wait).get(name, 0.0)


@torch.inference_mode()  # no autograd bookkeeping in what is timed: a decode records none
def decode_order_seconds(blocks: dict, repeats: int, clock: Clock) -> dict:
    """Median seconds of each of ``blocks`` ({name: fn}) on ``clock``'s device, after one warm-up pass.

    Each repeat runs every block once, in the given order, as a decode does: the same call repeated in a
    loop runs from the caches its previous call warmed and looks several times faster than it is.
    """
    for fn in blocks.values():
        fn()
    times: dict = {name: [] for name in blocks}
    for _ in range(repeats):
        for name, fn in blocks.items():
            start = clock.stamp()
            fn()
            times[name].append(clock.since(start))  # on CUDA: once the device has run fn's kernels
    return {name: statistics.median(t) for name, t in times.items()}
