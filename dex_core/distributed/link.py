"""``DistLink``: one explorer per process on torch.distributed; the round loop is the same as in one process.

Explorer k posts its output rows to explorer k + 1 as soon as its layers are done, before its head and token choice
(non-blocking ``batch_isend_irecv`` on the data group: NCCL on GPUs, gloo on CPU), so the transfer overlaps the
head; then every rank all-gathers each stage's choices (``runtime.readback``'s float64 rows, padded to the round's
widest batch, on the data group: NCCL from device memory on GPUs, gloo on CPU, the same code) and reads them to
the host in one transfer, the round's one sync, so every rank keeps an identical copy of the lattice bookkeeping.
On NCCL the received rows are waited for on the stream only (the all-gather, queued after them on the same
communicator, is what the host waits for). Ranks that share a GPU (rows staged through the host over gloo) read
their own choices to the host first: two reads a round. Every wait has a timeout: a dead peer surfaces in about
a second, a hung one at ``op_timeout``.
"""

from __future__ import annotations

import time
from datetime import timedelta

import torch
import torch.distributed as dist

from ..device import to_device
from ..runtime.links import LocalLink
from ..runtime.readback import Choice, StageOutput, pack_columns, unpack
from ..shapes import bucket


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
        # called with the round number as this rank starts to wait on its peers: a store into the group's board
        # of rounds (``rank.round_board``) under ``ExplorerGroup``, None under torchrun
        self.progress = progress
        self.rank, self.count = rank, count
        self.hidden_size, self.dtype, self.device = hidden_size, dtype, torch.device(device)
        self.ctrl = ctrl_group
        self.top = top
        self.timeout = timedelta(seconds=op_timeout)
        self._posted = None  # (works, receive buffer) of this round's hidden rows

    def _wait(
        self, works, what: str = "an exchange with its peers", data: bool = True, block: bool = True
    ) -> None:
        """Wait for ``works`` (sends, receives, an all-gather) at most ``op_timeout`` in all; ``data``: they
        are on the data group (NCCL when this rank is on a GPU), else on the gloo control group.

        On CUDA the data works are NCCL's, whose ``wait(timeout)`` blocks the host in 1 ms sleeps (as long
        as a stage at batch 1): poll ``is_completed()`` instead, then ``wait()`` without a timeout, which
        only makes the current stream wait for the transfer. On CPU gloo's ``wait(timeout)`` blocks on a
        condition variable and wakes at completion; a poll there would take a core from the peers (and
        gloo's send/recv works report completion only once waited for). A timeout raises ``TimeoutError``
        naming this rank and ``what`` it waited for. ``block=False`` on CUDA: the stream waits, the host does not
        (a later blocking wait on the same communicator covers the timeout).
        """
        tic = time.perf_counter()
        deadline = tic + self.timeout.total_seconds()
        cuda = data and self.device.type == "cuda"
        try:
            if cuda and block and not self._poll(works, deadline):
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

    def _expected(self, plan) -> tuple[list, int]:
        """The previous stage's batch of ``plan`` and the rows (its bucket) that come with it."""
        prev = plan.batches[self.rank - 1] if self.rank > 0 else []
        return prev, bucket(len(prev)) if prev else 0

    def post(self, plan, rank: int, hidden: torch.Tensor) -> None:
        self._posted = self._start(hidden, self._expected(plan)[1])

    def prefill(self, explorers, view, tokens: list[int]) -> None:
        (e,) = explorers
        h = view.embed(to_device(tokens, view.device)) if self.rank == 0 else self._swap(None, len(tokens))
        out = e.prefill(h)
        self._swap(out, 0)

    def exchange(self, plan, choices: dict[int, Choice]) -> dict[int, StageOutput]:
        if self.progress is not None:
            self.progress(plan.round)
        prev, coming = self._expected(plan)
        works, rows = self._posted if self._posted is not None else self._start(None, coming)
        self._posted = None
        came = f"the hidden rows from rank {self.rank - 1}" if rows is not None else None
        self._wait(
            works, came or f"the hidden rows to reach rank {self.rank + 1}", data=not self.staged, block=False
        )
        if rows is not None:  # staged: host -> device from pinned memory, no sync; the stream orders its use
            self.hold([n.id for n in prev], rows.to(self.device, non_blocking=True))
        width, mine = max(bucket(len(b)) for b in plan.batches), choices.get(self.rank)
        cancel = self.cancel is not None and self.cancel.is_set()
        packed = self._packed(mine, width, cancel)
        gathered = [torch.empty_like(packed) for _ in range(self.count)]
        work = dist.all_gather(gathered, packed, async_op=True)
        self._wait([work], "the candidates all-gather", data=not self.staged)
        rows = torch.stack(gathered).tolist()  # the round's one read: every stage's choices
        self.cancelled = any(r[width][1] > 0 for r in rows)
        return {
            k: unpack(
                rows[k][: len(batch)], self.top, mine.hidden if k == self.rank else None, rows[k][width][0]
            )
            for k, batch in enumerate(plan.batches)
            if batch
        }

    def _packed(self, mine: Choice | None, width: int, cancel: bool) -> torch.Tensor:
        """This rank's choices for the all-gather: (width + 1, columns) float64 in ``readback``'s layout on the
        data group's device (the host when staged), its last row this rank's expansion seconds and whether its
        caller asked to stop. The seconds are what the clock has without waiting for the device (on CUDA the
        expansion the device has not passed yet is reported in a later round's row, and counted in the run's
        totals at its end)."""
        where = torch.device("cpu") if self.staged else self.device
        packed = torch.full(
            (width + 1, pack_columns(self.top)), float("nan"), dtype=torch.float64, device=where
        )
        seconds = 0.0
        if mine is not None:
            packed[: len(mine.pack)] = mine.pack.cpu() if self.staged else mine.pack  # staged: the one read
            seconds = mine.seconds(False)
        packed[width, :2] = to_device([seconds, float(cancel)], where, torch.float64)
        return packed
