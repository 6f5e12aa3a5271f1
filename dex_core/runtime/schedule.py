"""Where a decoder's explorers run (``Schedule``): in this process, one after another each round (``InProcess``), or
on explorer processes (``dex_core.distributed.group.ExplorerGroup``, a torchrun launch's
``dex_core.distributed.torchrun.TorchrunGroup``). ``DexDecoder`` is one face over any of them: same requests, same
trace events."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

from ..config import DexError, stage_bounds
from ..model.explorer import Explorer
from ..model.proposal import ProposalHead
from ..model.view import ModelView
from ..trace.events import EndEvent, RoundEvent
from .crew import Crew
from .engine import run_rounds
from .links import LocalLink
from .request import Request
from .settings import RunSettings


class Schedule(Protocol):
    settings: RunSettings  # what every run of this schedule runs
    devices: list  # each explorer's device; the last one makes the token choices

    def run(self, request: Request) -> Iterator[RoundEvent | EndEvent]:
        """The request's round events, then its end event (token text is the decoder's: ``with_text``)."""

    def share(self, most: int) -> None:
        """Let ``most`` requests in flight share each round (``runtime.crew``); 1: one at a time."""

    @property
    def shares(self) -> bool:
        """Whether requests in flight share rounds (else one runs at a time: ``runtime.turns``)."""

    def close(self) -> None:
        """Free what the schedule holds (explorer processes end); a no-op in this process."""


class InProcess:
    """Every explorer in this process (the sequential schedule): deterministic; the debugger's and the tests'."""

    def __init__(self, view: ModelView, settings: RunSettings):
        self.view, self.settings = view, settings
        self.adapters = settings.adapters.build(settings.depths, view.device, view.dtype)  # depth -> module
        head = (
            None if settings.shortlist is None else ProposalHead(view, settings.shortlist)
        )  # shared by stages
        K = len(settings.depths)
        self.explorers = [
            Explorer(view, k, K, *stage_bounds(settings.depths, k), self.adapters.get(d), head)
            for k, d in enumerate(settings.depths)
        ]
        if settings.compile:
            for e in self.explorers:
                e.compile_step(settings.compile)
        self.devices = [view.device] * K
        self.crew = Crew(
            view, settings, self.explorers
        )  # runs that share rounds: at most one unless ``share``d

    def share(self, most: int) -> None:
        """Let ``most`` requests in flight share each round (``runtime.crew``); 1: one run at a time (not while runs
        share rounds: the next one would run alone on a lane of theirs)."""
        if most == 1 and self.crew.members:
            raise DexError(
                f"{len(self.crew.members)} runs share this decoder's rounds: let them end before sharing stops"
            )
        self.crew.most = most

    @property
    def shares(self) -> bool:
        """Whether runs in flight share rounds (else one runs at a time: ``runtime.turns``)."""
        return self.crew.most > 1

    def run(self, request: Request) -> Iterator[RoundEvent | EndEvent]:
        """The request's events: through Algorithm 1's loop alone (``engine.run_rounds``), or in rounds shared with
        every run in flight."""
        if self.shares:
            return self.crew.take(request)
        return run_rounds(self.view, self.settings, self.explorers, LocalLink(), request)

    def close(self) -> None:
        pass
