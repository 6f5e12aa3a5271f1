"""What the benchmark scripts share: ``--baseline DIR``, the same script run in a child process that imports
``dex_core`` (and ``visualize``) from DIR, a checkout of another revision (e.g. ``git worktree add /tmp/dex-head
HEAD``); ``emit``, a report printed and written."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile


def measured_in(checkout: str, script: str, argv: list[str]) -> dict:
    """What ``script`` (run with ``argv`` and ``--out FILE``) wrote under "after", measured on ``checkout``'s code."""
    with tempfile.NamedTemporaryFile(suffix=".json") as tmp:
        env = {**os.environ, "PYTHONPATH": os.path.abspath(checkout)}
        command = [sys.executable, os.path.abspath(script), *argv, "--out", tmp.name]
        subprocess.run(command, env=env, check=True, stdout=subprocess.DEVNULL)
        with open(tmp.name) as f:
            return json.load(f)["after"]


def emit(report: dict, out) -> None:
    """``report`` as indented JSON on stdout, and to ``out`` (a Path) when given."""
    text = json.dumps(report, indent=1)
    print(text)
    if out:
        out.write_text(text + "\n")
