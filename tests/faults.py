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


def host_reads_of_rank(rank: int, folder: str, prompt: list, new: int, out) -> None:
    """One explorer rank of a real 2-rank gloo world (a spawned process), running DEX's distributed schedule with
    its real link: puts (rank, host reads in each round, the tokens) on queue ``out``."""
    from datetime import timedelta

    import torch.distributed as dist

    from dex_core import DexDecoder, GenerationOptions
    from dex_core.distributed.rank import connect, init_world, serve_request
    from dex_core.host_reads import reads_per_event
    from dex_core.runtime.request import make_request
    from dex_core.testing import tiny_model
    from dex_core.trace.events import EndEvent, RoundEvent

    torch.set_num_threads(1)
    decoder = DexDecoder(tiny_model("llama", layers=8, seed=0), explorers=2, prune="auto", trace_top=5)
    data, _ = init_world("cpu", f"file://{folder}/rendezvous", rank, 2, timedelta(seconds=60))
    link = connect(decoder.view, rank, 2, data, "cpu", decoder.settings.trace_top, 30.0)
    request = make_request(decoder.view, prompt, GenerationOptions(max_new_tokens=new))
    events = serve_request(decoder.view, decoder.explorers[rank], link, request, decoder.settings)
    reads, tokens = [], None
    for event, counted in reads_per_event(events):
        if isinstance(event, RoundEvent):
            reads.append(counted.count)
        tokens = event.tokens if isinstance(event, EndEvent) else tokens
    out.put((rank, reads, tokens))
    dist.destroy_process_group()
