"""Which explorer rank is at fault when a group fails (``blamed``), from what the parent saw."""

from __future__ import annotations

import signal
from pathlib import Path

# what a rank reports when a peer, not itself, failed: a lost connection or a timed-out wait
PEER_LOSS = (
    "Connection closed by peer",
    "Connection reset",
    "Broken pipe",
    "timed out",
    "Timeout",
    "NCCL communicator was aborted",
)


def stopped(pid: int) -> bool:
    """Whether a process is stopped (SIGSTOP, a debugger): its state in /proc (Linux; False elsewhere)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("T", "t")
    except (OSError, IndexError):
        return False


def blamed(
    errors: list, dead, held: list[int], rounds: list[int], silent: str | None, rank: int | None = None
) -> str:
    """The message naming the rank at fault, in this order: a rank that died without reporting (``dead``: (rank, exit
    code)), ranks whose process is stopped (``held``), a rank that raised for a cause of its own (``errors``: the
    ranks' error messages), ranks that fell behind on the board of ``rounds``, then ``silent`` (what every rank, or
    ``rank``, failed to do), then the first error reported."""
    reported = {e[1] for e in errors}
    for k, code in dead:
        if k not in reported:
            how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
            return f"explorer rank {k} died ({how}) without reporting an error"
    if held:
        return (
            f"explorer rank{'s' if len(held) > 1 else ''} {', '.join(map(str, held))} stopped "
            f"(the process is suspended) and the group could not go on"
        )
    root = next((e for e in errors if not any(s in e[2][0] for s in PEER_LOSS)), None)
    if root:
        _, rank, (cause, tb) = root
        return f"explorer rank {rank} failed: {cause}\n--- traceback of rank {rank} ---\n{tb}"
    behind = [k for k, r in enumerate(rounds) if r == min(rounds)]
    if len(behind) < len(rounds):
        return (
            f"explorer rank{'s' if len(behind) > 1 else ''} {', '.join(map(str, behind))} went silent at "
            f"round {min(rounds) + 1} while the others waited at round {max(rounds)}"
        )
    if silent and rank is not None:
        return f"explorer rank {rank} {silent}"
    if silent:
        return f"explorer ranks {', '.join(map(str, range(len(rounds))))} {silent}"
    _, rank, (cause, tb) = errors[0]
    return f"explorer rank {rank} failed: {cause}\n--- traceback of rank {rank} ---\n{tb}"
