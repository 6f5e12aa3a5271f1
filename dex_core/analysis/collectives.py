"""The links a projection charges, timed among W fresh processes: a round's exchange at W ranks, one row sent point
to point, one row all-reduced.

``link_seconds(hiddens, dtype, repeats, devices, rows)`` starts one process per entry of ``devices`` (NCCL when they
are distinct GPUs, else gloo on CPU tensors: explorers that share a GPU stage their rows through the host) and
times on rank 0, for each hidden size, in a decode's order (``runtime.clock.decode_order_seconds``, each repeat running
every block once); ``links_at(..., worlds)`` does so for several world sizes W in one launch, each on the group of
ranks 0..W-1 (the others skip its blocks), so that W = 2, 4 and 8 start 8 processes, not 14:

- ``exchange[n]``: one round of ``DistLink`` at W ranks: every rank r < W - 1 sends n hidden rows to rank r + 1
  (all the pairs at once), then all ranks all-gather the round's choices (``runtime.readback``'s float64 rows,
  n + 1 of them, on the same group and device) and read them to the host once;
- ``p2p``: one hidden row from rank 0 to rank 1 (a pipeline's hop: AR on W stages makes W - 1 of them a token);
- ``all_reduce``: one hidden row summed over the W ranks (tensor parallelism makes two a layer).

``exchange_profile`` of ``profile`` is the two-rank ``exchange`` table of this.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist

from ..device import dtype_name
from ..distributed.rank import init_options
from ..runtime.clock import Clock, decode_order_seconds
from ..runtime.readback import pack_columns

# the columns DistLink gathers a round per row, with the app's 5 trace candidates
CONTROL_COLUMNS = pack_columns(5)


def backend_of(devices) -> str:
    """NCCL when every rank has a GPU of its own, else gloo (CPU tensors; NCCL refuses two ranks on one GPU)."""
    distinct = len(set(devices)) == len(devices)
    return "nccl" if distinct and all(torch.device(d).type == "cuda" for d in devices) else "gloo"


def _blocks(rank: int, world: int, hidden: int, dtype, device, row_counts, group=None) -> dict:
    """{name: fn} of the timed blocks at this rank for one hidden size among ranks 0..``world`` - 1 (``group``; the
    default group when it is the whole world) (module docstring)."""

    def exchange(n: int):
        rows = torch.zeros(n, hidden, dtype=dtype, device=device)  # (n, hidden)
        packed = torch.zeros(n + 1, CONTROL_COLUMNS, dtype=torch.float64, device=device)  # (n + 1, columns)
        gathered = [torch.empty_like(packed) for _ in range(world)]
        inbox = torch.empty_like(rows)

        def run():
            ops = [dist.P2POp(dist.isend, rows, rank + 1, group)] if rank < world - 1 else []
            ops += [dist.P2POp(dist.irecv, inbox, rank - 1, group)] if rank > 0 else []
            for work in dist.batch_isend_irecv(ops):
                work.wait()  # on NCCL: the current stream waits for the transfer, which the clock then includes
            dist.all_gather(gathered, packed, group=group)
            torch.stack(gathered).tolist()  # the round's one read

        return run

    row = torch.zeros(1, hidden, dtype=dtype, device=device)  # (1, hidden)

    def p2p():  # ranks past the pair go on to the all-reduce and wait for them there
        if rank < 2:
            op = dist.P2POp(dist.isend, row, 1, group) if rank == 0 else dist.P2POp(dist.irecv, row, 0, group)
            for work in dist.batch_isend_irecv([op]):
                work.wait()

    blocks = {f"{world} {hidden} exchange {n}": exchange(n) for n in row_counts}
    blocks[f"{world} {hidden} p2p"] = p2p
    blocks[f"{world} {hidden} all_reduce"] = lambda: dist.all_reduce(row, group=group)
    return blocks


def _rank() -> None:
    """Body of one of the processes ``links_at`` starts (argv: rank world folder hiddens dtype repeats device rows
    backend worlds)."""
    rank, world, folder = int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
    hiddens = [int(h) for h in sys.argv[4].split(",")]
    dtype, repeats = getattr(torch, sys.argv[5]), int(sys.argv[6])
    device, row_counts = torch.device(sys.argv[7]), [int(n) for n in sys.argv[8].split(",")]
    backend, worlds = sys.argv[9], [int(w) for w in sys.argv[10].split(",")]
    torch.set_num_threads(1)
    if backend == "nccl":
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    dist.init_process_group(
        backend,
        init_method=(folder / "store").as_uri(),
        rank=rank,
        world_size=world,
        **init_options(backend, str(device)),
    )
    blocks = {}
    for W in worlds:  # every rank makes every group, in the same order; the ranks past W skip its blocks
        group = None if W == world else dist.new_group(list(range(W)))
        for hidden in hiddens:
            if rank < W:
                blocks.update(_blocks(rank, W, hidden, dtype, device, row_counts, group))
    seconds = decode_order_seconds(blocks, repeats, Clock(device))
    if rank == 0:
        result = {
            W: {
                h: {
                    "exchange": {n: seconds[f"{W} {h} exchange {n}"] for n in row_counts},
                    "p2p": seconds[f"{W} {h} p2p"],
                    "all_reduce": seconds[f"{W} {h} all_reduce"],
                }
                for h in hiddens
            }
            for W in worlds
        }
        (folder / "links.json").write_text(json.dumps(result))
    dist.destroy_process_group()


def link_seconds(hiddens, dtype: torch.dtype, repeats: int, devices, rows) -> dict:
    """{hidden: {"exchange": {rows: seconds}, "p2p": seconds, "all_reduce": seconds, "backend": name, "ranks": W}}
    among W = ``len(devices)`` fresh processes, rank r on ``devices[r]`` (module docstring)."""
    return links_at(hiddens, dtype, repeats, devices, rows, [len(devices)])[len(devices)]


def links_at(hiddens, dtype: torch.dtype, repeats: int, devices, rows, worlds) -> dict:
    """{W: ``link_seconds``'s result among ranks 0..W-1} for each W of ``worlds`` (at most ``len(devices)``), all
    timed in one launch of ``len(devices)`` fresh processes (module docstring)."""
    world, backend = len(devices), backend_of(devices)
    if not worlds or max(worlds) > world or min(worlds) < 2:
        raise ValueError(f"link worlds must lie in 2..{world} (the processes started); got {list(worlds)}")
    with tempfile.TemporaryDirectory(prefix="dex-links-") as folder:
        entry = "from dex_core.analysis.collectives import _rank; _rank()"
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        argv = [folder, ",".join(map(str, hiddens)), dtype_name(dtype), str(repeats)]
        more = [",".join(map(str, rows)), backend, ",".join(map(str, sorted(worlds)))]
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", entry, str(r), str(world), *argv, devices[r], *more],
                env=env,
                stdin=subprocess.DEVNULL,
            )
            for r in range(world)
        ]
        try:
            codes = [p.wait(timeout=300) for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
        if any(codes):
            raise RuntimeError(f"the link timing's {world} processes failed (exit codes {codes})")
        result = json.loads((Path(folder) / "links.json").read_text())
    return {
        int(W): {
            int(h): r
            | {"exchange": {int(n): s for n, s in r["exchange"].items()}, "backend": backend, "ranks": int(W)}
            for h, r in by_hidden.items()
        }
        for W, by_hidden in result.items()
    }
