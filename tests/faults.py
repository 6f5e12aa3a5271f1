"""Picklable stand-ins that explorer processes import (spawned children unpickle them by name)."""

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
