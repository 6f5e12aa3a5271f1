"""A shared round between explorer processes: ``CrewWire`` carries it; ``LaneLink`` is each request's link on a rank.

On the distributed schedule with shared rounds (``runtime.crew``) each rank runs its one explorer over every request's
lane. A round's traffic is that of one request's round, for all of them at once:

- explorer k posts the output rows of every lane to explorer k + 1 in **one** send, (lanes, rows, hidden), as soon
  as its layers are done, before its head (the transfer overlaps the head, as ``DistLink.post``);
- then **one** all-gather carries every request's choices of every stage: (requests, width + 1, columns) float64
  from each rank (``runtime.readback``'s layout; the last row of a request's block its expansion seconds), read to the
  host in one transfer, the round's one sync.

Each request's ``LaneLink`` then holds its own rows (node ids are a request's own) and gives its run the outputs the
all-gather read for it. The lanes are in the explorers' seat order, alike on every rank: every rank takes and frees
seats in the same order (``distributed.roster``).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ..device import to_device
from ..model.explorer import Explorer
from ..runtime.crew import Crew
from ..runtime.links import LocalLink
from ..runtime.readback import StageOutput, pack_columns, unpack
from ..shapes import bucket
from .link import DistLink


class LaneLink(LocalLink):
    """One request's link on an explorer rank under shared rounds: its rows held as ``LocalLink`` holds them, its
    prompt through the rank's ``DistLink``, its round's outputs those ``CrewWire.gather`` read for it."""

    def __init__(self, link: DistLink):
        super().__init__()
        self.link = link
        self.outputs: dict[int, StageOutput] | None = None  # the round's, set by ``CrewWire.gather``

    def prefill(self, explorers, view, tokens: list[int]) -> None:
        self.link.prefill(explorers, view, tokens)

    def exchange(self, plan, choices) -> dict[int, StageOutput]:
        outputs, self.outputs = self.outputs, None
        return outputs


class CrewWire:
    """The rank's side of every shared round: ``explorer``'s lanes' rows to the next rank, every request's choices to
    every rank (``runtime.crew.Wire``), on ``link``'s groups and with its timeouts."""

    def __init__(self, link: DistLink, explorer: Explorer):
        self.link, self.explorer = link, explorer
        self.rounds = 0  # shared rounds gathered: this rank's slot of the board of rounds
        self._posted = None  # (works, receive buffer) of this round's rows

    def _coming(self, plans: dict) -> int:
        """Rows (lanes x the previous stage's bucket) the previous rank's step of ``plans`` sends; 0: none."""
        if self.link.rank == 0:
            return 0
        sizes = [len(p.batches[self.link.rank - 1]) for p in plans.values()]
        return len(self.explorer.seats) * bucket(max(sizes)) if any(sizes) else 0

    def post(self, k: int, out: torch.Tensor, plans: dict) -> None:
        self._posted = self.link._start(out, self._coming(plans))

    def gather(self, members: list, plans: dict, choices: dict) -> None:
        link, before = self.link, self.link.comm_seconds
        self.rounds += 1
        if link.progress is not None:
            link.progress(self.rounds)
        works, rows = self._posted or link._start(None, self._coming(plans))
        self._posted = None
        link._wait(works, "the lanes' hidden rows", data=not link.staged, block=False)
        if rows is not None:
            self._hold(members, plans, rows.to(link.device, non_blocking=True))
        width = max(bucket(len(b)) for m in members for b in plans[m].batches if b)
        packed = self._packed(members, choices, width)
        gathered = [torch.empty_like(packed) for _ in range(link.count)]
        work = dist.all_gather(gathered, packed, async_op=True)
        link._wait([work], "the candidates all-gather", data=not link.staged)
        read = torch.stack(gathered).tolist()  # (ranks, requests, width + 1, columns): the round's one read
        for i, m in enumerate(members):
            mine = choices[m].get(link.rank)
            m.run.link.outputs = {
                k: unpack(
                    read[k][i][: len(b)],
                    link.top,
                    mine.hidden if k == link.rank else None,
                    read[k][i][width][0],
                )
                for k, b in enumerate(plans[m].batches)
                if b
            }
            m.run.link.comm_seconds += link.comm_seconds - before

    def _hold(self, members: list, plans: dict, rows: torch.Tensor) -> None:
        """The previous rank's lanes ``rows`` (lanes x bucket, hidden), each request's held by its link for its
        depth children."""
        lanes = rows.view(len(self.explorer.seats), -1, rows.shape[-1])  # (lanes, bucket, hidden)
        owner = {id(seat): m for m in members for seat in m.seats}
        for b, seat in enumerate(self.explorer.seats):
            m = owner.get(id(seat))
            prev = plans[m].batches[self.link.rank - 1] if m is not None else []
            if prev:
                m.run.link.hold([n.id for n in prev], lanes[b])

    def _packed(self, members: list, choices: dict, width: int) -> torch.Tensor:
        """This rank's choices of every request: (requests, width + 1, columns) float64 on the data group's device
        (the host when staged), each block's last row its expansion seconds (what the clock has without waiting)."""
        link = self.link
        where = torch.device("cpu") if link.staged else link.device
        packed = torch.full(
            (len(members), width + 1, pack_columns(link.top)), float("nan"), dtype=torch.float64, device=where
        )
        seconds = []
        for i, m in enumerate(members):
            mine = choices[m].get(link.rank)
            if mine is not None:
                packed[i, : len(mine.pack)] = mine.pack.cpu() if link.staged else mine.pack
            seconds.append(mine.seconds(False) if mine is not None else 0.0)
        packed[:, width, 0] = to_device(seconds, where, torch.float64)
        return packed


def rank_crew(view, settings, explorer: Explorer, link: DistLink, most: int = 2**31) -> Crew:
    """This rank's crew of shared rounds: its one explorer, each request's ``LaneLink``, the rounds on a ``CrewWire``;
    at most ``most`` requests (by default as many as rank 0 or the parent lets in)."""
    crew = Crew(view, settings, [explorer], most)
    crew.link, crew.wire = (lambda: LaneLink(link)), CrewWire(link, explorer)
    return crew
