"""The cost model's seconds view: a profile of this machine, timed on the loaded model.

``measure_profile`` times, at n = 1, 2, 4, 8, 16 rows (median of ``repeats``):

- ``layer[n]``: one decoder layer over n new rows after a 64-token context (the mean of layers 0 and
  L/2);
- ``head[n]``: final norm + the full LM head; ``proposal[n]``: a light head of ``proposal_rows`` rows;
- ``exchange[n]``: one round of the distributed link between two explorer processes (gloo on CPU):
  n hidden rows point-to-point, then the all-gather of a small int64 candidates tensor — what
  ``DistLink`` does each round, spawned once, as fresh interpreters.

Profiles are cached as JSON in ``~/.cache/dex/profiles`` per model (embedding fingerprint), dtype,
device, torch threads and torch version. ``exchange_seconds`` interpolates the table; a projected
K-device round then lasts its slowest explorer's measured expansion + bookkeeping + decode (the round
event's ``projected``) + exchange(largest batch), as ``dex bench`` (``bench_report``), the app's Race
and ``benchmarks/distributed_vs_ar.py`` count it.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROWS = (1, 2, 4, 8, 16)
CACHE = Path(os.environ.get("DEX_CACHE", Path.home() / ".cache" / "dex")) / "profiles"


def _median_seconds(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        tic = time.perf_counter()
        fn()
        times.append(time.perf_counter() - tic)
    return statistics.median(times)


@torch.no_grad()
def _compute_profile(model, proposal_rows: int, repeats: int) -> dict:
    from .explorer import Explorer
    from .models import model_view
    from .proposal import ProposalHead

    view = model_view(model)
    out = {"layer": {}, "head": {}, "proposal": {}}
    light = ProposalHead(view, torch.arange(min(proposal_rows, view.vocab)))
    for n in ROWS:
        per_layer = []
        for index in sorted({0, view.num_layers // 2}):
            e = Explorer(view, 0, 2, index, index + 1)
            context = torch.randn(64, model.config.hidden_size, dtype=view.dtype, device=view.device)
            hidden = torch.randn(n, model.config.hidden_size, dtype=view.dtype, device=view.device)

            e.prefill(context)  # then each call adds n rows to the cache (a context of 64 to 64 + 21 n)
            per_layer.append(_median_seconds(
                lambda: e.expand(hidden, list(range(n)), [64] * n, [(i,) for i in range(n)]), repeats))
        out["layer"][n] = sum(per_layer) / len(per_layer)
        h = torch.randn(n, model.config.hidden_size, dtype=view.dtype, device=view.device)
        out["head"][n] = _median_seconds(lambda: view.head(h), repeats)
        out["proposal"][n] = _median_seconds(lambda: light(h), repeats)
    return out


def _exchange_rank() -> None:
    """Body of one of the two processes ``_exchange_profile`` starts (argv: rank folder hidden dtype repeats)."""
    import torch.distributed as dist

    rank, folder, hidden, dtype, repeats = int(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]), sys.argv[4], int(sys.argv[5])
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=(folder / "store").as_uri(), rank=rank, world_size=2)
    result = {}
    for n in ROWS:
        rows = torch.zeros(n, hidden, dtype=getattr(torch, dtype))
        packed = torch.zeros(n + 1, 11, dtype=torch.int64)
        gathered = [torch.empty_like(packed) for _ in range(2)]

        def round_trip():
            op = dist.P2POp(dist.isend, rows, 1) if rank == 0 else dist.P2POp(dist.irecv, rows, 0)
            for w in dist.batch_isend_irecv([op]):
                w.wait()
            dist.all_gather(gathered, packed)

        result[n] = _median_seconds(round_trip, repeats)
    if rank == 0:
        (folder / "exchange.json").write_text(json.dumps(result))
    dist.destroy_process_group()


def _exchange_profile(hidden: int, dtype: torch.dtype, repeats: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="dex-profile-") as folder:
        entry = "from dex_core.profile import _exchange_rank; _exchange_rank()"
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        procs = [subprocess.Popen([sys.executable, "-c", entry, str(r), folder, str(hidden), str(dtype).split(".")[-1],
                                   str(repeats)], env=env, stdin=subprocess.DEVNULL) for r in range(2)]
        try:
            codes = [p.wait(timeout=300) for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
        if any(codes):
            raise RuntimeError(f"the exchange profile's processes failed (exit codes {codes})")
        return {int(k): v for k, v in json.loads((Path(folder) / "exchange.json").read_text()).items()}


def measure_profile(model, proposal_rows: int = 8192, repeats: int = 20, cache: bool = True, log=print) -> dict:
    """The seconds profile of ``model`` on its device with this process's torch threads (cached)."""
    from .adapters import model_identity

    ident = model_identity(model)
    dtype, device = model.model.norm.weight.dtype, model.model.norm.weight.device
    key = (f"{ident['model_type']}-{ident['num_layers']}x{ident['hidden_size']}-{ident['fingerprint']:.4f}-"
           f"{str(dtype).split('.')[-1]}-{device.type}-t{torch.get_num_threads()}-n{proposal_rows}-{torch.__version__}")
    path = CACHE / f"{key}.json"
    if cache and path.is_file():
        profile = json.loads(path.read_text())
        return {k: ({int(n): s for n, s in v.items()} if isinstance(v, dict) else v) for k, v in profile.items()}
    log(f"profiling layers, heads and the exchange at {list(ROWS)} rows (cached in {path.parent})")
    profile = _compute_profile(model, proposal_rows, repeats)
    profile["exchange"] = _exchange_profile(model.config.hidden_size, dtype, repeats)
    profile.update(key=key, threads=torch.get_num_threads(), proposal_rows=proposal_rows)
    if cache:
        CACHE.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(profile, indent=1))
    return profile


def interpolate(table: dict, rows: int) -> float:
    """Seconds at ``rows`` from a {rows: seconds} table: linear between points, extrapolated past the last."""
    if rows <= 0:
        return 0.0
    points = sorted(table.items())
    for (a, sa), (b, sb) in zip(points, points[1:]):
        if rows <= b:
            return sa + (sb - sa) * (max(rows, a) - a) / (b - a)
    (a, sa), (b, sb) = points[-2], points[-1]
    return sb + (sb - sa) * (rows - b) / (b - a)


def exchange_seconds(profile: dict, batch_sizes) -> float:
    """A round's communication on K devices: the largest batch's rows sent, and the candidates gathered."""
    return interpolate(profile["exchange"], max(1, max(batch_sizes)))
