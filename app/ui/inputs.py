"""What the page's inputs send, as one record (``Inputs``: every option control's value and the prompt, turned into a
validated ``DexConfig`` by ``config``); an endpoint takes the fields it names (``LIVE``, ``RACE``: its API parameters,
in order, ``app.ui.handlers.bind``), the others keep their defaults — each the option's, from its metadata
(``dex_core.flags.control``).

Values arrive as sent (the events pass them unprocessed): sliders and number boxes send floats, API clients may
send anything, so every value is checked here and a bad one is a ``DexError`` that says what was wrong."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, fields

from dex_core import DecoderOptions, DexConfig, DexError, GenerationOptions
from dex_core.config import flag
from dex_core.flags import control

from ..host.settings import TRACE_TOP

PRUNE_CHOICES = (
    "auto",
    "none",
    "1",
    "2",
    "4",
    "8",
)  # the Live tab's lattice pruning menu (DecoderOptions.prune)
INTEGER_TEXT = re.compile(r"\s*[+-]?[0-9]{1,40}\s*")  # integer text that an API client may send


def _real(value, name: str, kind: str = "a finite number") -> float:
    """A UI number: sliders and number boxes send floats, API clients may send text; finite, or DexError."""
    number = value
    if isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            number = None
    try:
        finite = not isinstance(number, bool) and isinstance(number, (int, float)) and math.isfinite(number)
    except OverflowError:  # an int too large for a float
        finite = False
    if not finite:
        raise DexError(f"{name} must be {kind}; got {value!r:.80}")
    return float(number)


def _whole(value, name: str, cls=None) -> int:
    """A UI number that must be a whole number, within its control's range when ``cls`` declares one."""
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, str) and INTEGER_TEXT.fullmatch(value):
        number = int(value)  # exactly: not rounded through a float (a seed beyond 2**53 stays itself)
    else:
        number = _real(value, name, "a whole number")
        if number != int(number):
            raise DexError(f"{name} must be a whole number; got {value!r:.80}")
        number = int(number)
    offered = control(cls, name) if cls else {}
    low, high = offered.get("minimum"), offered.get("maximum")
    if (low is not None and number < low) or (high is not None and number > high):
        raise DexError(f"{name} must be between {low} and {high} in this app; got {value!r:.40}")
    return number


def _shown(cls, name: str):
    """What the control of option ``name`` starts at (its default, as the app's control shows it)."""
    return control(cls, name)["value"]


@dataclass(frozen=True)
class Inputs:
    """The page's inputs, as sent; a tab without a control for an option sends its default.

    Off-values of the controls: greedy unless ``sample``; ``top_k`` 0 and ``top_p`` 1 mean off; an
    empty ``depths`` box means a uniform split of ``explorers``; the adapters box picks 'auto' or 'none';
    ``prune`` is one of ``PRUNE_CHOICES``; ``draft`` turns draft chains on ('auto') or off ('none').
    Explorers and max_new_tokens must lie in the range their sliders offer (``ui_min``/``ui_max``).
    """

    prompt: object = ""
    chat: object = DexConfig.chat
    explorers: object = _shown(DecoderOptions, "explorers")
    depths: object = ""
    adapters: object = True
    decs: object = DecoderOptions.decs
    sample: object = False
    temperature: object = _shown(GenerationOptions, "temperature")
    top_k: object = _shown(GenerationOptions, "top_k")
    top_p: object = _shown(GenerationOptions, "top_p")
    seed: object = _shown(GenerationOptions, "seed")
    max_new_tokens: object = _shown(GenerationOptions, "max_new_tokens")
    prune: object = DecoderOptions.prune
    draft: object = True

    def config(self) -> DexConfig:
        """These values as a validated DexConfig (DexError on bad input)."""
        if self.prune not in PRUNE_CHOICES:
            raise DexError(
                f"lattice pruning must be one of {', '.join(PRUNE_CHOICES)}; got {str(self.prune)!r:.40}"
            )
        sample = flag(self.sample, "sample")
        top_k = _whole(self.top_k, "top_k") if sample else 0
        top_p = _real(self.top_p, "top_p") if sample else 1.0
        depths = self.depths
        return DexConfig(
            chat=self.chat,
            explorers=_whole(self.explorers, "explorers", DecoderOptions),
            depths=depths.strip() or None if isinstance(depths, str) else depths,
            adapters="auto" if flag(self.adapters, "adapters") else "none",
            decs=self.decs,
            temperature=_real(self.temperature, "temperature") if sample else 0.0,
            top_k=top_k or None,
            top_p=None if top_p == 1.0 else top_p,
            seed=_whole(self.seed, "seed"),
            max_new_tokens=_whole(self.max_new_tokens, "max_new_tokens", GenerationOptions),
            trace_top=TRACE_TOP,
            prune=self.prune,
            draft="auto" if flag(self.draft, "draft chains") else "none",
        )


LIVE = tuple(
    f.name for f in fields(Inputs)
)  # /generate's parameters: every input, in this order (docs/APP.md)
RACE = ("prompt", "chat", "explorers", "adapters", "max_new_tokens", "draft")  # /race's (docs/APP.md)
