"""Picklable stand-ins that explorer processes import (spawned children unpickle them by name)."""

import time
from pathlib import Path

import torch


class RaiseOnce(torch.nn.Module):
    """An identity adapter that raises on its ``at``-th call, once per flag file (then never again)."""

    def __init__(self, flag: str, at: int = 3):
        super().__init__()
        self.flag, self.at, self.calls = flag, at, 0

    def forward(self, h):
        self.calls += 1
        if self.calls == self.at and not Path(self.flag).exists():
            Path(self.flag).write_text("raised")
            raise RuntimeError(f"injected fault at call {self.at}")
        return h


class SlowLoad(torch.nn.Module):
    """An identity adapter that slows down the loading of the explorer process that receives it: once unpickled
    there (before that process builds its part of the model), each tensor the process places waits ``seconds``
    first. The process still reports every tensor, so it is slow but not silent."""

    def __init__(self, seconds: float):
        super().__init__()
        self.seconds = seconds

    def forward(self, h):
        return h

    def __setstate__(self, state):
        super().__setstate__(state)
        from dex_core.model import stage_load

        place, seconds = stage_load._place, self.seconds

        def slow(*args, **kwargs):
            time.sleep(seconds)
            return place(*args, **kwargs)

        stage_load._place = slow


class Silent(SlowLoad):
    """An identity adapter that hangs the loading of the explorer process that receives it: its first tensor
    waits ``seconds`` before it is placed, and the process says nothing meanwhile."""
