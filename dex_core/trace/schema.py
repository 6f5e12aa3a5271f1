"""How a trace record is declared: each field of the dataclasses in ``dex_core.trace.events`` carries its JSON Schema
(``spec``: a function of the size limits, built from the helpers here), and ``schema_of`` derives a record's JSON
Schema from those fields — types (an integer is never a float or a bool), required keys (a field without a default;
a field with one is a key older traces lack), no unknown keys, integer and probability ranges, string lengths, array
sizes — under size limits (``TraceLimits``; ``TRACE_LIMITS`` holds the defaults, and the app's upload size limit is
``TRACE_LIMITS.max_file_bytes``)."""

from __future__ import annotations

import dataclasses
from dataclasses import MISSING, dataclass
from typing import Literal, get_args

from ..config import DexError

TRACE_FORMAT = "dex-trace"
TRACE_VERSION = 1
MAX_INT = 2**31 - 1  # ids, slots, tokens, positions, layers
MAX_NUMBER = 1e15  # seconds, rates and other measurements
Stopped = Literal["eos", "length", "cancelled"]  # why a finished run stopped (``GenerationStats.stop``)
STOPS = get_args(Stopped)


@dataclass(frozen=True)
class TraceLimits:
    max_file_bytes: int = 64 * 2**20  # bytes of the JSON file (also the app's upload limit)
    max_rounds: int = 5000  # round events of a DEX trace
    max_tokens: int = 5000  # committed tokens (AR token events, the end event's tokens)
    max_nodes: int = 250_000  # node records in the whole trace
    max_nodes_per_round: int = 4096  # nodes one round creates, and ids alive after it
    max_explorers: int = 64  # K
    max_top_k: int = 64  # [token, probability] pairs per node
    max_text_chars: int = 1000  # a token's text
    max_prompt_tokens: int = 131_072
    max_meta_chars: int = 65_536  # a string in the file's metadata (the prompt text, the model)

    def __post_init__(self):
        for f in dataclasses.fields(self):
            if type(value := getattr(self, f.name)) is not int or value < 1:
                raise DexError(f"TraceLimits.{f.name} must be a positive integer; got {value!r}")


TRACE_LIMITS = TraceLimits()


def spec(schema, default=MISSING, *, factory=MISSING, sparse: bool = False):
    """A record's field: ``schema(limits)`` is its JSON Schema; a ``default`` (or ``factory``) makes it a key that
    older traces lack; ``sparse``: the key is written only when its value is not the default."""
    meta = {"schema": schema, "sparse": sparse}
    if factory is not MISSING:
        return dataclasses.field(default_factory=factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def optional(f: dataclasses.Field) -> bool:
    """Whether a declared field may be absent from a record (older traces lack it)."""
    return f.default is not MISSING or f.default_factory is not MISSING


def schema_of(cls, lim: TraceLimits, null: bool = False, **extra: dict) -> dict:
    """The JSON Schema of the record that dataclass ``cls`` declares (``extra``: keys its record has beyond its
    fields, each required)."""
    fields = dataclasses.fields(cls)
    props = {f.name: f.metadata["schema"](lim) for f in fields} | extra
    return record(props, tuple(f.name for f in fields if optional(f)), null)


def integer(lo: int = 0, hi: int = MAX_INT, null: bool = False):
    return lambda lim: {"type": ["integer", "null"] if null else "integer", "minimum": lo, "maximum": hi}


def number(lo: float = 0.0, hi: float = MAX_NUMBER, null: bool = False):
    return lambda lim: {"type": ["number", "null"] if null else "number", "minimum": lo, "maximum": hi}


def boolean(lim: TraceLimits) -> dict:
    return {"type": "boolean"}


def one_of(values):
    return lambda lim: {"enum": list(values)}


def k_range(lo: int = 1, less: int = 0):
    """An integer from ``lo`` to the number of explorers the limits allow, less ``less``."""
    return lambda lim: integer(lo, lim.max_explorers - less)(lim)


def array(items, size, min_items: int = 0):
    """A list of ``items`` (a schema function) of at most ``size(limits)`` entries."""
    return lambda lim: {"type": "array", "items": items(lim), "maxItems": size(lim), "minItems": min_items}


def ids(lim: TraceLimits) -> dict:
    """Node ids of one round."""
    return array(integer(), lambda lim: lim.max_nodes_per_round)(lim)


def text(lim: TraceLimits) -> dict:
    """A token's text, or null without a tokenizer (no lone surrogates)."""
    return {"type": ["string", "null"], "maxLength": lim.max_text_chars, "pattern": r"^[^\ud800-\udfff]*$"}


def seconds_by_name(lim: TraceLimits) -> dict:
    """A round's ``timings``: each explorer's expansion, then named spans (seconds)."""
    expand = array(number(), lambda lim: lim.max_explorers)(lim)
    return {
        "type": "object",
        "maxProperties": 64,
        "properties": {"expand": expand},
        "additionalProperties": number()(lim),
    }


def record(props: dict, optional: tuple[str, ...] = (), null: bool = False) -> dict:
    return {
        "type": ["object", "null"] if null else "object",
        "properties": props,
        "additionalProperties": False,
        "required": [k for k in props if k not in optional],
    }


def nested(props: dict, optional: tuple[str, ...] = (), null: bool = False):
    """A sub-record of plain values (``props``: name -> schema function)."""
    return lambda lim: record({k: s(lim) for k, s in props.items()}, optional, null)


def scalar(lim: TraceLimits) -> dict:
    """A value of the file's metadata, or of a stats key that this DEX does not know (recorded by another)."""
    return {
        "type": ["number", "string", "boolean", "null"],
        "maxLength": lim.max_meta_chars,
        "minimum": -MAX_NUMBER,
        "maximum": MAX_NUMBER,
    }
