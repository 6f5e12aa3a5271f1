"""Links between explorers: how hidden states and candidates travel. The round loop is the same.

- ``LocalLink``: the sequential schedule. Every explorer lives in this process; a stage's output rows
  wait in a dict for the depth children that the next explorer computes in the next round.
- ``DistLink``: one explorer per process on torch.distributed. Explorer k posts its output rows to
  explorer k + 1 as soon as its layers are done, before its head and token choice (non-blocking
  ``batch_isend_irecv`` on the data group: NCCL on GPUs, gloo on CPU), so the transfer overlaps the
  head; then every rank all-gathers each stage's candidates (one small int64 tensor on a gloo control
  group: token ids as integers, probabilities and seconds as their float64 bit patterns), so every
  rank keeps an identical copy of the lattice bookkeeping. Every wait has a timeout: a dead peer
  surfaces in about a second, a hung one at ``op_timeout``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import timedelta

import torch


@dataclass
class StageOutput:
    """What one explorer produced in one round, for a batch of n nodes."""

    tokens: list[int]  # chosen candidate per node
    top_ids: torch.Tensor  # (n, top) best candidates at this depth (top may be 0)
    top_probs: torch.Tensor  # (n, top)
    hidden: torch.Tensor | None  # (n, hidden) stage output, for the depth children (None at the last stage)
    seconds: float  # expansion time (layers + LM head), masks excluded
    probs: list[float] | None = None  # each chosen candidate's probability (for lattice pruning)


class LocalLink:
    """All explorers in one process (deterministic; tests, debugger, CPU demos)."""

    def __init__(self, count: int):
        self.local = list(range(count))
        self.hidden: dict[int, torch.Tensor] = {}  # node id -> stage output awaiting its depth child
        self.comm_seconds = 0.0
        self.cancelled = False  # set when a participant asked to stop early

    def reset(self) -> None:
        self.hidden = {}
        self.comm_seconds = 0.0
        self.cancelled = False

    def prefill(self, explorers, view, tokens: list[int]) -> None:
        h = view.embed(torch.tensor(tokens, device=view.device))
        for e in explorers:
            h = e.prefill(h)

    def inputs(self, parents: list[int]) -> torch.Tensor:
        return torch.stack([self.hidden.pop(p) for p in parents])

    def post(self, plan, rank: int, hidden: torch.Tensor) -> None:
        """Explorer ``rank``'s output rows are ready (before its head); the local link keeps them in
        ``exchange``."""

    def exchange(self, plan, outputs: dict[int, StageOutput]) -> dict[int, StageOutput]:
        for k, out in outputs.items():
            if out.hidden is not None:
                self.hidden.update(zip((n.id for n in plan.batches[k]), out.hidden))
        return outputs

    def keep(self, node_ids) -> None:
        self.hidden = {i: h for i, h in self.hidden.items() if i in node_ids}


class DistLink(LocalLink):
    """Explorer ``rank`` of ``count`` on an initialized torch.distributed world."""

    def __init__(self, rank: int, count: int, hidden_size: int, dtype: torch.dtype, device,
                 ctrl_group, top: int, op_timeout: float, cancel=None, progress=None):
        super().__init__(count)
        self.cancel = cancel  # has is_set(): the parent asked to stop early
        self.progress = progress  # called with the round number as this rank starts to wait on its peers
        self.local = [rank]
        self.rank, self.count = rank, count
        self.hidden_size, self.dtype, self.device = hidden_size, dtype, torch.device(device)
        self.ctrl = ctrl_group
        self.top = top
        self.timeout = timedelta(seconds=op_timeout)
        self._posted = None  # (works, receive buffer) of this round's hidden rows

    def _wait(self, works) -> None:
        tic = time.perf_counter()
        for w in works:
            w.wait(self.timeout)
        self.comm_seconds += time.perf_counter() - tic

    def _start(self, send: torch.Tensor | None, recv_rows: int):
        """Start sending ``send`` to the next rank and receiving ``recv_rows`` rows from the previous one."""
        import torch.distributed as dist

        ops, buf = [], None
        if send is not None and self.rank < self.count - 1:
            ops.append(dist.P2POp(dist.isend, send.contiguous(), self.rank + 1))
        if recv_rows and self.rank > 0:
            buf = torch.empty(recv_rows, self.hidden_size, dtype=self.dtype, device=self.device)
            ops.append(dist.P2POp(dist.irecv, buf, self.rank - 1))
        return (dist.batch_isend_irecv(ops) if ops else []), buf

    def _swap(self, send: torch.Tensor | None, recv_rows: int) -> torch.Tensor | None:
        works, buf = self._start(send, recv_rows)
        self._wait(works)
        return buf

    def post(self, plan, rank: int, hidden: torch.Tensor) -> None:
        prev = plan.batches[self.rank - 1] if self.rank > 0 else []
        self._posted = self._start(hidden, len(prev))

    def prefill(self, explorers, view, tokens: list[int]) -> None:
        (e,) = explorers
        h = view.embed(torch.tensor(tokens, device=view.device)) if self.rank == 0 else \
            self._swap(None, len(tokens))
        out = e.prefill(h)
        self._swap(out, 0)

    def exchange(self, plan, outputs: dict[int, StageOutput]) -> dict[int, StageOutput]:
        import torch.distributed as dist

        if self.progress is not None:
            self.progress(plan.round)
        mine = outputs.get(self.rank)
        prev = plan.batches[self.rank - 1] if self.rank > 0 else []
        works, rows = self._posted if self._posted is not None else self._start(None, len(prev))
        self._posted = None
        self._wait(works)
        if rows is not None:
            self.hidden.update(zip((n.id for n in prev), rows))

        # control: every stage's tokens, top candidates and expansion time, one int64 tensor
        width, top = max(len(b) for b in plan.batches), self.top
        packed = torch.full((width + 1, 2 + 2 * top), -1, dtype=torch.int64)  # token, prob, top ids, top probs
        if mine is not None:
            n = len(mine.tokens)
            packed[:n, 0] = torch.tensor(mine.tokens, dtype=torch.int64)
            packed[:n, 1] = torch.tensor(mine.probs or [1.0] * n, dtype=torch.float64).view(torch.int64)
            packed[:n, 2:2 + top] = mine.top_ids.cpu()
            packed[:n, 2 + top:2 + 2 * top] = mine.top_probs.double().cpu().view(torch.int64)
            packed[width, 0] = torch.tensor([mine.seconds], dtype=torch.float64).view(torch.int64)[0]
        packed[width, 1] = 1 if self.cancel is not None and self.cancel.is_set() else 0
        gathered = [torch.empty_like(packed) for _ in range(self.count)]
        self._wait([dist.all_gather(gathered, packed, group=self.ctrl, async_op=True)])
        self.cancelled = any(int(g[width, 1]) > 0 for g in gathered)
        result = {}
        for k, batch in enumerate(plan.batches):
            if not batch:
                continue
            g, n = gathered[k], len(batch)
            result[k] = outputs[k] if k == self.rank else StageOutput(
                g[:n, 0].tolist(), g[:n, 2:2 + top].clone(), g[:n, 2 + top:2 + 2 * top].contiguous().view(
                    torch.float64).float(), None, float(g[width, :1].contiguous().view(torch.float64)),
                g[:n, 1].contiguous().view(torch.float64).tolist())
        return result
