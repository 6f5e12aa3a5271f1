"""The schema of saved traces: JSON Schemas (``trace_schemas``) of the records documented in
``dex_core.trace.events`` — types (an integer is never a float or a bool), required keys, no unknown keys, integer
and probability ranges, string lengths, array sizes — under size limits (``TraceLimits``; ``TRACE_LIMITS`` holds the
defaults, and the app's upload size limit is ``TRACE_LIMITS.max_file_bytes``). ``dex_core.trace.validate`` checks a
trace file against them."""

from __future__ import annotations

import functools
from dataclasses import dataclass, fields
from typing import Literal, get_args

from ..algorithm.lattice import NodeKind, Via
from ..config import DEPTH_CHOICES, DTYPES, MAX_SEED, DexError
from ..families import SUPPORTED_TYPES

TRACE_FORMAT = "dex-trace"
TRACE_VERSION = 1
MAX_INT = 2**31 - 1  # ids, slots, tokens, positions, layers
MAX_NUMBER = 1e15  # seconds, rates and other measurements
EVENT_KINDS = ("start", "round", "token", "end")
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
        for f in fields(self):
            if type(value := getattr(self, f.name)) is not int or value < 1:
                raise DexError(f"TraceLimits.{f.name} must be a positive integer; got {value!r}")


TRACE_LIMITS = TraceLimits()


def _int(lo: int = 0, hi: int = MAX_INT, null: bool = False) -> dict:
    return {"type": ["integer", "null"] if null else "integer", "minimum": lo, "maximum": hi}


def _num(lo: float = 0.0, hi: float = MAX_NUMBER, null: bool = False) -> dict:
    return {"type": ["number", "null"] if null else "number", "minimum": lo, "maximum": hi}


def _list(items: dict, n: int, min_items: int = 0) -> dict:
    return {"type": "array", "items": items, "maxItems": n, "minItems": min_items}


def _text(n: int) -> dict:
    return {
        "type": ["string", "null"],
        "maxLength": n,
        "pattern": r"^[^\ud800-\udfff]*$",
    }  # no lone surrogates


def _record(props: dict, optional: tuple[str, ...] = (), null: bool = False) -> dict:
    return {
        "type": ["object", "null"] if null else "object",
        "properties": props,
        "additionalProperties": False,
        "required": [k for k in props if k not in optional],
    }


def _scalar(lim: TraceLimits) -> dict:
    return {
        "type": ["number", "string", "boolean", "null"],
        "maxLength": lim.max_meta_chars,
        "minimum": -MAX_NUMBER,
        "maximum": MAX_NUMBER,
    }


def _start(lim: TraceLimits) -> dict:
    K = lim.max_explorers
    sampling = _record(
        {
            "temperature": _num(),
            "top_k": _int(0, null=True),
            "top_p": _num(0.0, 1.0, null=True),
            "seed": _int(0, MAX_SEED),  # as GenerationOptions takes it
        }
    )
    return _record(
        {
            "event": {"enum": ["start"]},
            "version": _int(1, TRACE_VERSION),
            "method": {"enum": ["dex", "ar"]},
            "explorers": _int(1, K),
            "depths": _list(_int(1), K, 1),
            "num_layers": _int(1),
            "prompt": _list(_int(), lim.max_prompt_tokens, 1),
            "max_new_tokens": _int(1),
            "decs": {"type": "boolean"},
            "adapter_depths": _list(_int(1), K),
            "sampling": sampling,
            "proposal_vocab": _int(1),
            "depth_choice": {"enum": list(DEPTH_CHOICES)},
            "prune": _int(1),
            "draft": {"type": "object", "maxProperties": 16, "additionalProperties": _int()},
            "cost": _record({"head": _num(), "adapter": _num(), "proposal": _num(null=True)}),
            "dtype": {"enum": list(DTYPES)},
            "device": {"type": "string", "pattern": r"^[a-z]{1,16}(:[0-9]{1,4})?$"},
            "pipeline": {"type": "boolean"},
            "model": _record(
                {
                    "model_type": {"enum": list(SUPPORTED_TYPES)},
                    "num_layers": _int(1),
                    "hidden_size": _int(1),
                    "vocab_size": _int(1),
                    "fingerprint": _num(),
                },
                optional=("fingerprint",),
            ),
        },
        optional=(
            "pipeline",
            "model",
            "adapter_depths",
            "proposal_vocab",
            "depth_choice",
            "prune",
            "draft",
            "cost",
            "dtype",
            "device",
        ),
    )


def _node(lim: TraceLimits) -> dict:
    K = lim.max_explorers
    top = {
        "type": "array",
        "items": [_int(), _num(0.0, 1.0), _text(lim.max_text_chars)],
        "additionalItems": False,
        "minItems": 2,
    }
    return _record(
        {
            "id": _int(),
            "slot": _int(),
            "parent": _int(null=True),
            "kind": {"enum": list(get_args(NodeKind))},
            "stage": _int(0, K - 1),
            "position": _int(),
            "input_token": _int(),
            "token": _int(-1),  # -1: the stage proposed nothing (AR through the stages, start's "pipeline")
            "text": _text(lim.max_text_chars),
            "top": _list(top, lim.max_top_k),
            "masked": _list(_int(), K),
        }
    )


def _commit(lim: TraceLimits) -> dict:
    K = lim.max_explorers
    return _record(
        {
            "index": _int(),
            "position": _int(),
            "token": _int(),
            "text": _text(lim.max_text_chars),
            "matched_stage": _int(0, K - 1),
            "anchor_nodes": _list(_int(), K, 1),
            "anchor_candidates": _list(_int(-1), K, 1),
            "margin": _num(),
            "near_tie": {"type": "boolean"},
            "tie_gap": _num(),
            "drafted": {"type": "boolean"},
            "via": {"enum": list(get_args(Via))},
        },
        optional=("margin", "near_tie", "tie_gap", "drafted", "via"),
        null=True,
    )


def _round(lim: TraceLimits) -> dict:
    K, ids = lim.max_explorers, _list(_int(), lim.max_nodes_per_round)
    collapse = _record(
        {"committed": ids, "kept": ids, "dropped": ids, "new_anchor": _int(null=True)}, null=True
    )
    timings = {
        "type": "object",
        "maxProperties": 64,
        "properties": {"expand": _list(_num(), K)},
        "additionalProperties": _num(),
    }
    return _record(
        {
            "event": {"enum": ["round"]},
            "round": _int(1),
            "state_before": _int(0, K),
            "state_after": _int(0, K),
            "batches": _list(ids, K, 1),
            "nodes": _list(_node(lim), lim.max_nodes_per_round),
            "commit": _commit(lim),
            "collapse": collapse,
            "alive": ids,
            "timings": timings,
            "pruned": ids,
            "commits": _list(_commit(lim), lim.max_tokens),
            "chains": _list(ids, lim.max_nodes_per_round),
            "cut": ids,
        },
        optional=("timings", "pruned", "commits", "chains", "cut"),
    )


def _token(lim: TraceLimits) -> dict:
    return _record(
        {
            "event": {"enum": ["token"]},
            "index": _int(),
            "position": _int(),
            "token": _int(),
            "text": _text(lim.max_text_chars),
            "seconds": _num(),
        }
    )


def _end(lim: TraceLimits) -> dict:
    K, stop = lim.max_explorers, {"enum": list(STOPS)}
    seconds = ("bookkeeping", "communication", "round", "projected", "prefill", "wall")
    stats = {
        "type": "object",
        "maxProperties": 64,
        "properties": {  # GenerationStats.to_dict(), each optional
            "explorers": _int(1, K),
            "depths": _list(_int(1), K),
            "tokens": _int(),
            "rounds": _int(),
            "drafted": _int(),
            "matched_stages": _list(_int(0, K - 1), lim.max_tokens),
            "batch_sizes": _list(_list(_int(), K), lim.max_rounds),
            "compute_seconds": _list(_num(), K),
            "stop": stop,
            **{k: _num() for k in ("rounds_per_token", "depth_speedup", "tokens_per_second")},
            **{f"{k}_seconds": _num() for k in seconds},
        },
        "additionalProperties": {"anyOf": [_scalar(lim), _list(_num(-MAX_NUMBER), lim.max_rounds)]},
    }
    return _record(
        {"event": {"enum": ["end"]}, "tokens": _list(_int(), lim.max_tokens), "stop": stop, "stats": stats}
    )


def _document(lim: TraceLimits) -> dict:
    event = {"type": "object", "required": ["event"], "properties": {"event": {"enum": list(EVENT_KINDS)}}}
    return _record(
        {
            "format": {"enum": [TRACE_FORMAT]},
            "version": _int(1, TRACE_VERSION),
            "meta": {"type": "object", "maxProperties": 64, "additionalProperties": _scalar(lim)},
            "events": _list(event, max(lim.max_rounds, lim.max_tokens) + 2, 1),
        },
        optional=("meta",),
    )


@functools.lru_cache(maxsize=4)
def trace_schemas(limits: TraceLimits = TRACE_LIMITS) -> dict[str, dict]:
    """JSON Schemas (draft 4: integers exclude floats) of a saved trace under ``limits``: "document" and each event
    kind."""
    builders = {"document": _document, "start": _start, "round": _round, "token": _token, "end": _end}
    return {
        name: {"$schema": "http://json-schema.org/draft-04/schema#", **build(limits)}
        for name, build in builders.items()
    }
