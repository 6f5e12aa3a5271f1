"""``DistLink``: one explorer per process on torch.distributed; the round loop is the same as in one process.

Explorer k posts its output rows to explorer k + 1 as soon as its layers are done, before its head and token choice
(non-blocking ``batch_isend_irecv`` on the data group: NCCL on GPUs, gloo on CPU), so the transfer overlaps the
head; then every rank all-gathers each stage's candidates (one small int64 tensor on a gloo control group: token ids
as integers, probabilities and seconds as their float64 bit patterns), so every rank keeps an identical copy of the
lattice bookkeeping. Every wait has a timeout: a dead peer surfaces in about a second, a hung one at ``op_timeout``.
"""

from __future__ import annotations

import time
from datetime import timedelta

import torch
import torch.distributed as dist

from ..device import to_device
from ..runtime.links import LocalLink, StageOutput


class DistLink(LocalLink):
    """Explorer ``rank`` of ``count`` on an initialized torch.distributed world."""

    def __init__(
        self,
        rank: int,
        count: int,
        hidden_size: int,
        dtype: torch.dtype,
        device,
        ctrl_group,
        top: int,
        op_timeout: float,
        cancel=None,
        progress=None,
        staged: bool = False,
    ):
        super().__init__()
        self.staged = staged  # rows travel as host tensors over a gloo data group (ranks that share a GPU)
        self.cancel = cancel  # has is_set(): the parent asked to stop early
        self.progress = progress  # called with the round number as this rank starts to wait on its peers
        self.rank, self.count = rank, count
        self.hidden_size, self.dtype, self.device = hidden_size, dtype, torch.device(device)
        self.ctrl = ctrl_group
        self.top = top
        self.timeout = timedelta(seconds=op_timeout)
        self._posted = None  # (works, receive buffer) of this round's hidden rows

    def _wait(self, works, what: str = "an exchange with its peers", data: bool = True) -> None:
        """Wait for ``works`` (sends, receives, an all-gather) at most ``op_timeout`` in all; ``data``: they
        are on the data group (NCCL when this rank is on a GPU), else on the gloo control group.

        On CUDA the data works are NCCL's, whose ``wait(timeout)`` blocks the host in 1 ms sleeps (as long
        as a stage at batch 1): poll ``is_completed()`` instead, then ``wait()`` without a timeout, which
        only makes the current stream wait for the transfer. On CPU gloo's ``wait(timeout)`` blocks on a
        condition variable and wakes at completion; a poll there would take a core from the peers (and
        gloo's send/recv works report completion only once waited for). A timeout raises ``TimeoutError``
        naming this rank and ``what`` it waited for.
        """
        tic = time.perf_counter()
        deadline = tic + self.timeout.total_seconds()
        cuda = data and self.device.type == "cuda"
        try:
            if cuda and not self._poll(works, deadline):
                raise TimeoutError(self._timed_out(what))
            for w in works:  # on CUDA: the current stream waits for the (completed) transfer
                if cuda:
                    w.wait()
                else:
                    w.wait(timedelta(seconds=max(deadline - time.perf_counter(), 0.002)))
        except RuntimeError as err:  # gloo: "Timed out waiting 60000ms for recv operation to complete"
            if "timed out" not in str(err).lower():
                raise
            raise TimeoutError(self._timed_out(what)) from err
        finally:
            self.comm_seconds += time.perf_counter() - tic

    @staticmethod
    def _poll(works, deadline: float) -> bool:
        """Spin until every work ``is_completed()`` (True) or ``time.perf_counter()`` passes ``deadline``
        (False), giving up the GIL and the core between checks."""
        pending = list(works)
        while pending := [w for w in pending if not w.is_completed()]:
            if time.perf_counter() > deadline:
                return False
            time.sleep(0)
        return True

    def _timed_out(self, what: str) -> str:
        return (
            f"explorer rank {self.rank} timed out after {self.timeout.total_seconds():g} s (op_timeout) waiting "
            f"for {what}: a peer is hung, stopped or far slower; raise op_timeout only if the peers are slow"
        )

    def _start(self, send: torch.Tensor | None, recv_rows: int):
        """Start sending ``send`` to the next rank and receiving ``recv_rows`` rows from the previous one.

        Staged (ranks that share a GPU; gloo's threads read and fill host memory): ``send`` goes as a host copy
        made before the send starts (a blocking copy, so it has landed; it waits only for the layers, which the
        head waits for too, and the transfer still overlaps the head), and the rows arrive in a host buffer,
        pinned on CUDA, that the receiver moves to its device once received (``_swap``, ``exchange``)."""

        ops, buf = [], None
        if send is not None and self.rank < self.count - 1:
            send = send.to("cpu") if self.staged else send  # (n, hidden)
            ops.append(dist.P2POp(dist.isend, send.contiguous(), self.rank + 1))
        if recv_rows and self.rank > 0:
            buf = torch.empty(
                recv_rows,
                self.hidden_size,
                dtype=self.dtype,
                device="cpu" if self.staged else self.device,
                pin_memory=self.staged and self.device.type == "cuda",
            )  # (n, hidden)
            ops.append(dist.P2POp(dist.irecv, buf, self.rank - 1))
        return (dist.batch_isend_irecv(ops) if ops else []), buf

    def _swap(self, send: torch.Tensor | None, recv_rows: int) -> torch.Tensor | None:
        works, buf = self._start(send, recv_rows)
        self._wait(
            works,
            "the prompt's hidden rows"
            + (f" from rank {self.rank - 1}" if recv_rows else f" to reach rank {self.rank + 1}"),
            data=not self.staged,
        )
        return (
            None if buf is None else buf.to(self.device, non_blocking=True)
        )  # staged: host -> device, no sync

    def post(self, plan, rank: int, hidden: torch.Tensor) -> None:
        prev = plan.batches[self.rank - 1] if self.rank > 0 else []
        self._posted = self._start(hidden, len(prev))

    def prefill(self, explorers, view, tokens: list[int]) -> None:
        (e,) = explorers
        h = view.embed(to_device(tokens, view.device)) if self.rank == 0 else self._swap(None, len(tokens))
        out = e.prefill(h)
        self._swap(out, 0)

    def exchange(self, plan, outputs: dict[int, StageOutput]) -> dict[int, StageOutput]:
        if self.progress is not None:
            self.progress(plan.round)
        prev = plan.batches[self.rank - 1] if self.rank > 0 else []
        works, rows = self._posted if self._posted is not None else self._start(None, len(prev))
        self._posted = None
        came = f"the hidden rows from rank {self.rank - 1}" if rows is not None else None
        self._wait(works, came or f"the hidden rows to reach rank {self.rank + 1}", data=not self.staged)
        if rows is not None:  # staged: host -> device from pinned memory, no sync; the stream orders its use
            self.hidden.update(zip((n.id for n in prev), rows.to(self.device, non_blocking=True)))
        width = max(len(b) for b in plan.batches)
        packed = _pack(
            outputs.get(self.rank), width, self.top, self.cancel is not None and self.cancel.is_set()
        )
        gathered = [torch.empty_like(packed) for _ in range(self.count)]
        self._wait(
            [dist.all_gather(gathered, packed, group=self.ctrl, async_op=True)],
            "the candidates all-gather",
            data=False,
        )
        self.cancelled = any(int(g[width, 1]) > 0 for g in gathered)
        return {
            k: outputs[k] if k == self.rank else _unpack(gathered[k], len(batch), width, self.top)
            for k, batch in enumerate(plan.batches)
            if batch
        }


def _pack(mine: StageOutput | None, width: int, top: int, cancel: bool) -> torch.Tensor:
    """One stage's choices for the control all-gather, as one int64 tensor on the host (gloo), floats as their
    float64 bit patterns: per node token, probability, margin, tie gap, top ids, top probabilities; in the last row
    the expansion seconds and whether this rank's caller asked to stop."""
    packed = torch.full((width + 1, 4 + 2 * top), -1, dtype=torch.int64, device="cpu")
    if mine is not None:
        n = len(mine.tokens)
        floats = list(zip(mine.probs or [1.0] * n, mine.margins or [0.0] * n, mine.tie_gaps or [0.0] * n))
        packed[:n, 0] = to_device(mine.tokens, "cpu")
        packed[:n, 1:4] = to_device(floats, "cpu", torch.float64).view(torch.int64)
        if top and all(mine.top):  # a stage that proposes nothing has no candidates (left -1: none)
            packed[:n, 4 : 4 + top] = to_device([[t for t, _ in row] for row in mine.top], "cpu")
            probs = to_device([[p for _, p in row] for row in mine.top], "cpu", torch.float64)
            packed[:n, 4 + top :] = probs.view(torch.int64)
        packed[width, 0] = to_device([mine.seconds], "cpu", torch.float64).view(torch.int64)[0]
    packed[width, 1] = int(cancel)
    return packed


def _unpack(g: torch.Tensor, n: int, width: int, top: int) -> StageOutput:
    """Another stage's choices from its packed tensor (``_pack``) for its ``n`` nodes."""
    probs, margins, gaps = g[:n, 1:4].contiguous().view(torch.float64).T.tolist()
    ids, top_probs = g[:n, 4 : 4 + top].tolist(), g[:n, 4 + top :].contiguous().view(torch.float64).tolist()
    return StageOutput(
        tokens=g[:n, 0].tolist(),
        top=[[(t, p) for t, p in zip(i, ps) if t >= 0] for i, ps in zip(ids, top_probs)],
        hidden=None,
        seconds=float(g[width, :1].contiguous().view(torch.float64)),
        probs=probs,
        margins=margins,
        tie_gaps=gaps,
    )
