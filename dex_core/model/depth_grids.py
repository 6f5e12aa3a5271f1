"""Named grids of adapter depths: which non-final depths a dense adapter file trains, given as text before the model
(and so its layer count) is known — ``all`` (every non-final depth) or ``uniform`` / ``uniform:A-B`` (the non-final
depths of the uniform exploration splits for K = A..B) — or as a plain list of depths."""

from __future__ import annotations

from ..config import ANALYSED_KS, DexError, parse_depths, resolve_depths

DEPTH_GRIDS = ("all", "uniform")  # named sets of adapter depths (``adapter_depths``)


def parse_adapter_depths(spec) -> tuple[int, ...] | str:
    """Adapter depths as given: integers ('4,8,12' or a sequence), or a named grid — 'all' (every non-final
    depth) or 'uniform' / 'uniform:A-B' (the non-final depths of the uniform splits for K = A..B; 2-8 when not
    given) — kept as text until the model's layer count is known (``adapter_depths``)."""
    if isinstance(spec, str) and spec.strip().split(":")[0].strip().lower() in DEPTH_GRIDS:
        name, _, span = spec.strip().lower().partition(":")
        if name == "all" and span:
            raise DexError(f"'all' takes no range; got {spec!r:.80}")
        if name == "uniform":
            _uniform_span(span or f"{ANALYSED_KS[0]}-{ANALYSED_KS[-1]}")
        return f"{name}:{span}" if span else name
    return parse_depths(spec)


def _uniform_span(span: str) -> range:
    low, sep, high = span.partition("-")
    try:
        first, last = int(low), int(high if sep else low)
    except ValueError:
        first = last = 0
    if not 2 <= first <= last:
        raise DexError(
            f"a uniform grid takes a range of K like uniform:2-8 (K >= 2); got uniform:{span!r:.40}"
        )
    return range(first, last + 1)


def adapter_depths(spec, num_layers: int) -> tuple[int, ...]:
    """The non-final depths a named grid or a list of adapter depths (``parse_adapter_depths``) means for a model
    of ``num_layers`` layers, e.g. L = 30: 'uniform' -> 4, 5, 6, 8, 9, 10, 12, 13, 15, 18, ..., 27 (18 depths),
    'all' -> 1..29."""
    spec = parse_adapter_depths(spec)
    if isinstance(spec, tuple):
        return spec
    name, _, span = spec.partition(":")
    if name == "all":
        return tuple(range(1, num_layers))
    ks = [k for k in _uniform_span(span or f"{ANALYSED_KS[0]}-{ANALYSED_KS[-1]}") if k <= num_layers]
    return tuple(sorted({d for k in ks for d in resolve_depths(num_layers, explorers=k)[:-1]}))
