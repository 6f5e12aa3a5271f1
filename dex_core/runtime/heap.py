"""The Python heap of a DEX process, settled once its model is loaded: ``settle`` collects, then moves every object
the collector tracks out of its sight (``gc.freeze``).

A round allocates lattice nodes, slots and trace records that outlive it, and Python runs a *full* collection
whenever enough of them have accumulated: it visits every tracked object of the process, the half a million that
torch and transformers hold among them, with the round waiting (``benchmarks/round_host_work.py --heap settled``
against ``--heap as-is``). The model lives as long as the process, so a collection need not visit it. Collected
first, so no garbage is frozen; called where a process has loaded its model and holds nothing else whose cycles
must stay collectable: an explorer process (``distributed.rank.open_part``), ``dex generate`` and ``dex serve``
once their decoder is built. The app freezes its own heap once, before any session (``app.host.sessions``), for
the same reason.
"""

from __future__ import annotations

import gc


def settle() -> None:
    """Collect, then freeze what is left: later collections visit only what comes after."""
    gc.collect()
    gc.freeze()
