"""Command-line flags derived from the options dataclasses (``dex_core.config``): one flag per field,
its help text and default from the field's metadata, parsed back into the dataclass; and what a UI control for a
field offers (``control``), from the same metadata."""

from __future__ import annotations

import argparse
import dataclasses
import functools
import typing


def add_flags(parser: argparse.ArgumentParser, cls, names=None, helps: dict[str, str] | None = None) -> None:
    """Command-line flags for the fields of dataclass ``cls`` (all, or those in ``names``; ``helps``: a command's
    own words for some of them). Each help text ends with its default once: the field's, unless the help states it
    itself or it is None (decided where the option is used, as the help says); a field whose metadata lists its
    ``choices`` offers them."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if (names is not None and f.name not in names) or f.metadata.get("cli") is False:
            continue
        flag, hint = "--" + f.name.replace("_", "-"), hints[f.name]
        if hint is bool or hint == bool | None or f.metadata.get("switch"):  # None: decided where it is used
            action = parser.add_argument(
                flag,
                dest=f.name,
                action=argparse.BooleanOptionalAction,
                default=f.default,
                help=(helps or {}).get(f.name, f.metadata["help"]),
            )
            if f.default is not None and "%(default)" not in action.help:  # Python 3.10's action adds one
                action.help += f" (default: {'on' if f.default else 'off'})"
            continue
        args = typing.get_args(hint)
        if (
            typing.get_origin(hint) is tuple
            or any(typing.get_origin(a) is tuple for a in args)
            or "kind" in f.metadata
        ):
            kind = str  # lists such as depths are given comma-separated and parsed by the dataclass
        else:
            kind = next((t for t in (int, float) if hint is t or t in args), str)
        more = {"choices": f.metadata["choices"]} if "choices" in f.metadata else {}
        help = _with_default(f, (helps or {}).get(f.name, f.metadata["help"]))
        parser.add_argument(flag, dest=f.name, type=kind, default=f.default, help=help, **more)


def _with_default(f: dataclasses.Field, text: str) -> str:
    """A field's help text with its default appended, once (see ``add_flags``)."""
    if f.default is None or "(default" in text:
        return text
    shown = ",".join(map(str, f.default)) if isinstance(f.default, tuple) else f.default
    return f"{text} (default: {shown})"


def from_args(cls, args: argparse.Namespace, **extra):
    """The dataclass ``cls`` from parsed flags (fields without a flag keep their defaults); ``extra`` fields win
    over flags of the same name (a torchrun launch fixes K to its number of ranks)."""
    given = {f.name: getattr(args, f.name) for f in dataclasses.fields(cls) if hasattr(args, f.name)}
    return cls(**{**given, **extra})


def control(cls, name: str) -> dict:
    """What a UI control for field ``name`` of ``cls`` shows: its default (the API's where the app shows the option
    as the API does, ``api``), help, and the range it offers (``ui_min``/``ui_max``, else the values the option
    takes)."""
    f = cls.__dataclass_fields__[name]
    meta, api = f.metadata, f.metadata.get("api", {})
    low = meta.get("ui_min", api.get("minimum", meta.get("minimum", meta.get("exclusive_minimum"))))
    return {
        "value": api.get("default", f.default),
        "info": meta["help"],
        "minimum": low,
        "maximum": meta.get("ui_max", meta.get("maximum")),
    }


@functools.cache
def api_fields(cls) -> dict[str, dict]:
    """The fields of ``cls`` that the OpenAI-compatible API takes, by their name there: the option's name, its
    help, default and range there (``api`` in the metadata: what differs from the option's own)."""
    out = {}
    for f in dataclasses.fields(cls):
        if (api := f.metadata.get("api")) is None:
            continue
        meta = f.metadata
        out[api.get("name", f.name)] = {
            "option": f.name,
            "help": meta["help"],
            "default": api.get("default", f.default),
            "minimum": api.get("minimum", meta.get("minimum")),
            "exclusive_minimum": None if "minimum" in api else meta.get("exclusive_minimum"),
            "maximum": meta.get("maximum"),
        }
    return out
