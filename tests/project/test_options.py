"""Options from one source (issue 58): every option's default and range that the CLI, the app's controls and the HTTP
API's published schema offer is the one its field's metadata in ``dex_core.config`` declares."""

import dataclasses

import pytest

from dex_core.cli import build_parser
from dex_core.config import MAX_SEED, DecoderOptions, DexConfig, DexError, GenerationOptions
from dex_core.flags import api_fields
from dex_core.serving.api import make_app
from dex_core.training.train import TrainConfig

MOST = 64  # the API server's bound on max_tokens


def _field(name: str) -> dataclasses.Field:
    return DexConfig.__dataclass_fields__[name]


def _subparser(command: str):
    parser = build_parser()
    (commands,) = [a for a in parser._actions if hasattr(a, "choices") and isinstance(a.choices, dict)]
    return commands.choices[command]


@pytest.mark.parametrize(
    "command, classes", [("generate", (DexConfig,)), ("train-adapters", (TrainConfig, DexConfig))]
)
def test_the_cli_offers_each_options_default_and_choices(command, classes):
    sub = _subparser(command)
    declared = {}
    for cls in reversed(classes):  # the first class that declares a flag owns it
        declared.update(cls.__dataclass_fields__)
    offered = {a.dest: a for a in sub._actions if a.dest in declared}
    assert {"model", "backend", "explorers"} <= set(offered)
    for name, action in offered.items():
        f = declared[name]
        assert action.default == f.default, name
        assert action.choices == f.metadata.get("choices"), name
    assert offered["backend"].choices == ("sequential", "distributed", "torchrun")
    assert "default: sequential" in offered["backend"].help and "default: 4" in offered["explorers"].help


def test_the_apps_controls_offer_each_options_default_and_range():
    from app import main  # the page, built as `gradio app/main.py` builds it (no model loads)

    shown = {b.elem_id: b for b in main.demo.blocks.values() if getattr(b, "elem_id", None)}
    for elem_id, name in {
        "live-temperature": "temperature",
        "live-top-k": "top_k",
        "live-top-p": "top_p",
        "live-seed": "seed",
        "live-new": "max_new_tokens",
        "live-k": "explorers",
    }.items():
        meta, api = _field(name).metadata, _field(name).metadata.get("api", {})
        control = shown[elem_id]
        assert control.value == api.get("default", _field(name).default), elem_id
        low = meta.get("ui_min", api.get("minimum", meta.get("minimum")))
        assert (control.minimum, control.maximum) == (low, meta.get("ui_max", meta.get("maximum"))), elem_id
    assert shown["live-seed"].maximum == MAX_SEED and shown["live-k"].maximum == 8


def test_the_published_bodies_offers_each_options_default_and_range():
    schema = make_app(None, None, "tiny", MOST).openapi()
    for body, chat in (("CompletionRequest", False), ("ChatCompletionRequest", True)):
        props = schema["components"]["schemas"][body]["properties"]
        for name, info in api_fields(GenerationOptions).items():
            prop = props[name]
            (bounds,) = [p for p in prop["anyOf"] if p["type"] != "null"]
            meta = _field(info["option"]).metadata
            if name == "max_tokens":  # the server's bound, and OpenAI's defaults; 0 scores a prompt (echo)
                assert (bounds["minimum"], bounds["maximum"]) == (meta["minimum"] if chat else 0, MOST)
                assert prop["default"] == (MOST if chat else 16)
                continue
            assert prop["default"] == meta["api"].get("default", _field(info["option"]).default), name
            assert bounds.get("minimum") == meta["api"].get("minimum", meta.get("minimum")), name
            assert bounds.get("exclusiveMinimum") == meta.get("exclusive_minimum"), name
            assert bounds.get("maximum") == meta.get("maximum"), name
            assert prop["description"] == meta["help"]
        assert schema["components"]["schemas"][body]["additionalProperties"] is False
    assert set(api_fields(GenerationOptions)) == {"max_tokens", "temperature", "top_k", "top_p", "seed"}


@pytest.mark.parametrize("name", ["max_new_tokens", "temperature", "top_k", "top_p", "seed", "explorers"])
def test_each_declared_range_is_the_range_the_config_accepts(name):
    f = _field(name)
    cls = DecoderOptions if name == "explorers" else GenerationOptions
    meta = f.metadata
    low, above, high = meta.get("minimum"), meta.get("exclusive_minimum"), meta.get("maximum")
    if name == "explorers":
        low = 1
    for edge in [v for v in (low, high) if v is not None] + ([above + 1e-6] if above is not None else []):
        cls(**{name: edge})  # the bounds themselves are accepted
    for outside in [
        v
        for v in (low - 1 if low is not None else None, high + 1 if high is not None else None)
        if v is not None
    ]:
        with pytest.raises(DexError, match=name):
            cls(**{name: outside})
    if above is not None:
        with pytest.raises(DexError, match=name):
            cls(**{name: above})
