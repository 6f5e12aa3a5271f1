"""What a long evaluation has finished, kept on disk so that a stopped run resumes (``Finished``).

``dex paper`` on a GPU box runs for hours; each prompt set of each ``dex bench`` pass (and each later phase) is
a piece that is saved as soon as it is done, under a name, in one JSON file beside the report. A run started
again with the same options reads the pieces back and computes only the rest; a run with other options refuses
the file rather than mixing two matrices. The file is written whole and renamed, so a kill at any moment leaves
the previous version, never half of one.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from ...config import DexError


class Finished:
    """The pieces of one run finished so far, in ``path``, for a run whose options are ``key`` (JSON-able)."""

    def __init__(self, path: str | Path, key: dict):
        self.path, self.key = Path(path), json.loads(json.dumps(key))
        self.pieces: dict = {}
        if self.path.is_file():
            try:
                saved = json.loads(self.path.read_text())
            except ValueError as err:
                raise DexError(
                    f"{self.path} is not a progress file ({err}); remove it to start over"
                ) from None
            if not isinstance(saved, dict) or saved.get("key") != self.key:
                raise DexError(
                    f"{self.path} holds a run with other options; remove it to start over, or run with the "
                    "options it was made with"
                )
            self.pieces = saved.get("pieces", {})

    def __contains__(self, name: str) -> bool:
        return name in self.pieces

    def __len__(self) -> int:
        return len(self.pieces)

    def get(self, name: str):
        return self.pieces[name]

    def put(self, name: str, value) -> None:
        """Keep ``value`` (JSON-able) as piece ``name`` and write the file (whole, then renamed)."""
        self.pieces[name] = json.loads(json.dumps(value))
        self.path.parent.mkdir(parents=True, exist_ok=True)
        partial = self.path.with_name(self.path.name + ".partial")
        partial.write_text(json.dumps({"key": self.key, "pieces": self.pieces}))
        os.replace(partial, self.path)
