"""Checks of option values (``dex_core.config``'s fields, flags, UI and API input): each returns the value normalised,
or raises ``DexError`` saying what was wrong and what to do."""

from __future__ import annotations

import math
import operator
import os
import re
from pathlib import Path


class DexError(ValueError):
    """Bad input: the message says what was wrong and what to do. The CLI exits with code 2."""


def integer(value, name: str, minimum: int | None = None) -> int:
    """``value`` as an int (or an int-like scalar such as numpy.int64; not a bool, float or text) >= ``minimum``."""
    try:
        if not isinstance(value, bool) and (minimum is None or operator.index(value) >= minimum):
            return operator.index(value)
    except TypeError:
        pass
    low = "" if minimum is None else f" >= {minimum}"
    raise DexError(f"{name} must be an integer{low}; got {value!r:.80}")


def rows_option(value, name: str = "proposal_vocab", words=("auto", "full")):
    """One of ``words``, or a positive count (also as text, from a flag)."""
    return (
        value
        if value in words
        else integer(int(value) if str(value).isdigit() else value, f"{name} (or {', '.join(words)})", 1)
    )


def finite(value, name: str) -> float:
    try:
        if not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value):
            return float(value)
    except OverflowError:  # an int too large for a float
        pass
    raise DexError(f"{name} must be a finite number; got {value!r:.80}")


def flag(value, name: str) -> bool:
    """A yes/no option: True or False (1 and 0 are accepted); anything else is an error, not a truth test."""
    if isinstance(value, bool) or (isinstance(value, int) and value in (0, 1)):
        return bool(value)
    raise DexError(f"{name} must be True or False; got {value!r:.80}")


def items_of(value, name: str) -> list:
    """'a, ,b' -> ['a', 'b'] (blank entries dropped); a sequence -> a list of its items."""
    if isinstance(value, str):
        return [v for v in value.split(",") if v.strip()]
    try:
        return list(value)
    except TypeError:
        raise DexError(f"{name} must be a comma-separated list; got {value!r:.80}") from None


def parse_list(value, name: str) -> tuple[str, ...]:
    """'a,b' or a sequence -> a tuple of non-empty stripped strings."""
    return tuple(s for s in (str(v).strip() for v in items_of(value, name)) if s)


def parse_ints(value, name: str, minimum: int = 1) -> tuple[int, ...]:
    """'2,3,4' or a sequence of ints -> a non-empty tuple of integers >= ``minimum``. Text is parsed ('2.5' is
    an error); a sequence must hold ints (2.5, '2' and True are errors, not 2)."""
    items = items_of(value, name)
    try:
        out = tuple(int(v) if isinstance(value, str) else integer(v, name) for v in items)
    except (TypeError, ValueError):
        raise DexError(
            f"{name} must be comma-separated integers like 2,3,4 (or a list of ints); got {value!r:.80}"
        ) from None
    if not out or min(out) < minimum:
        raise DexError(f"{name} must be integers >= {minimum}; got {value!r:.80}")
    return out


def parse_device(value) -> str:
    """'auto', 'cpu', 'cuda' or 'cuda:N' (any case), normalised; ``models.resolve_device`` checks it exists."""
    if isinstance(value, str) and re.fullmatch(r"auto|cpu|cuda(:\d+)?", value.strip().lower()):
        return value.strip().lower()
    raise DexError(f"device must be auto, cpu, cuda or cuda:N (e.g. cuda:1); got {value!r:.80}")


def parse_depths(depths) -> tuple[int, ...]:
    """'8,15,23,30' or a sequence of ints -> a strictly increasing tuple of positive ints."""
    if not items_of(depths, "depths"):
        raise DexError("depths is empty; give at least the model's layer count, e.g. 30")
    out = parse_ints(depths, "depths")
    if any(b <= a for a, b in zip(out, out[1:])):
        raise DexError(f"depths must be strictly increasing positive layer counts; got {list(out)}")
    return out


def adapter_file(path) -> Path:
    """The adapter file ``path`` names, checked to be a file before any work starts."""
    path = Path(path)
    if os.path.isdir(path):  # os.path answers False where a name cannot be a file (too long, NUL)
        raise DexError(
            f"{path} is a directory, not an adapter file; give a .safetensors file from "
            "'dex train-adapters', or use 'none'"
        )
    if not os.path.isfile(path):
        raise DexError(f"no adapter file at {path}; train one with 'dex train-adapters', or use 'none'")
    return path
