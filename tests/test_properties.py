"""Every input either works exactly or is a DexError: the library API, the app's option parsing, the CLI.

Hypothesis draws options and prompts, valid and not (negative, NaN, inf, floats for ints, text, None,
bools); DEX must raise DexError exactly when the AR reference does, and otherwise emit its tokens.
"""

import dataclasses
import functools
import math
import re

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from dex_core import DecoderOptions, DexConfig, DexDecoder, DexError, GenerationOptions, ar_generate
from app.runtime import control
from dex_core.models import tiny_model, tiny_tokenizer
from dex_core.request import encode_prompt
from test_cli import run_cli

LAYERS, VOCAB = 6, 96


@functools.cache
def model():
    return tiny_model("llama", layers=LAYERS, vocab=VOCAB)


@functools.cache
def tokenizer():  # one object: its token ranking (light proposal heads) is derived once
    return tiny_tokenizer(VOCAB)


JUNK = st.one_of(st.none(), st.booleans(), st.floats(allow_nan=True, allow_infinity=True),
                 st.sampled_from(["", "abc", "2", "2.5", "2,6", "nan", "1e400", "\ud800", b"2", (), [2.5, 6], ["2", "6"]]),
                 st.integers(-(2 ** 70), 2 ** 70))
DEPTHS = st.lists(st.integers(1, LAYERS - 1), unique=True, max_size=4).map(lambda d: tuple(sorted(d)) + (LAYERS,))
VALID = {  # decoder options, then generation options, then the prompt
    "explorers": st.integers(1, LAYERS),
    "depths": st.one_of(st.none(), DEPTHS, DEPTHS.map(lambda d: ",".join(map(str, d)))),
    "decs": st.booleans(),
    "trace_top": st.integers(0, VOCAB),
    "proposal_vocab": st.one_of(st.sampled_from(["auto", "full"]), st.integers(1, VOCAB + 5)),
    "prune": st.one_of(st.sampled_from([None, "none", "auto"]), st.integers(1, 4)),
    "max_new_tokens": st.integers(1, 6),
    "temperature": st.one_of(st.just(0.0), st.floats(0.05, 3.0)),
    "top_k": st.one_of(st.none(), st.integers(1, VOCAB + 5)),
    "top_p": st.one_of(st.none(), st.floats(0.05, 1.0)),
    "seed": st.integers(-(2 ** 70), 2 ** 70),
    "eos_token_id": st.one_of(st.none(), st.integers(0, VOCAB - 1), st.lists(st.integers(0, VOCAB - 1), max_size=3)),
    "prompt": st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=6),
}
DECODER_FIELDS = ("explorers", "depths", "decs", "trace_top", "proposal_vocab", "prune")
BAD = {  # per field, values that are wrong (JUNK may also hold a right one by chance: either outcome is checked)
    "max_new_tokens": st.sampled_from([0, -1, 2.0, math.nan, math.inf, True, "3", None, 10 ** 9]),
    "prompt": st.one_of(JUNK, st.lists(st.one_of(st.integers(-2, VOCAB + 2), st.floats(0, 5), st.booleans(),
                                                 st.text(max_size=1)), max_size=4)),
}


@st.composite
def cases(draw):
    """(decoder options, generation options, prompt): all valid, or one of them replaced by a bad value."""
    values = {name: draw(strategy) for name, strategy in VALID.items()
              if name in ("max_new_tokens", "prompt") or draw(st.booleans())}  # others may be left at their defaults
    fault = draw(st.one_of(st.none(), st.sampled_from(sorted(VALID))))
    if fault is not None:
        values[fault] = draw(BAD.get(fault, JUNK))
    prompt = values.pop("prompt")
    decoder = {k: values.pop(k) for k in DECODER_FIELDS if k in values}
    return decoder, values, prompt


def _tokens_or_error(run):
    try:
        return run().tokens
    except DexError:
        return None


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases())
def test_the_library_gives_ar_tokens_or_a_dex_error_for_any_options(case):
    decoder_options, generation, prompt = case
    try:
        decoder = DexDecoder(model(), tokenizer=tokenizer(), **decoder_options)
    except DexError:
        event("decoder options refused")
        return
    ar = _tokens_or_error(lambda: ar_generate(model(), prompt, **generation))
    if ar is None:
        event("generation refused by DEX and AR")
        with pytest.raises(DexError):
            decoder.generate(prompt, **generation)
    else:
        event("same tokens as AR")
        assert decoder.generate(prompt, **generation).tokens == ar


CONTROL_VALUES = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True, allow_infinity=True),
                           st.text(max_size=6), st.sampled_from(["3", "0.5", " 4 ", "2,4,6", "nan", "inf", "1e400"]))
CONTROLS = ("chat", "explorers", "depths", "adapters", "decs", "sample", "temperature", "top_k", "top_p", "seed",
            "max_new_tokens")


@settings(max_examples=300, deadline=None)
@given(controls=st.fixed_dictionaries({}, optional={name: CONTROL_VALUES for name in CONTROLS}))
def test_the_apps_option_parsing_gives_a_valid_config_or_a_dex_error(controls):
    from app.runtime import ui_config

    try:
        config = ui_config(**controls)
    except DexError:
        return
    assert isinstance(config, DexConfig)
    assert DexConfig(**dataclasses.asdict(config)) == config  # already valid: validating again changes nothing
    for cls, name in ((DecoderOptions, "explorers"), (GenerationOptions, "max_new_tokens")):
        offered = control(cls, name)  # what the app's slider offers is all that the server accepts
        assert offered["minimum"] <= getattr(config, name) <= offered["maximum"]


@pytest.mark.parametrize("options,message", [
    ({"seed": 1.5}, "seed must be an integer; got 1.5"),
    ({"seed": "abc"}, "seed must be an integer; got 'abc'"),
    ({"seed": None}, "seed must be an integer; got None"),
    ({"eos_token_id": "x"}, "eos_token_id must be comma-separated integers"),
    ({"eos_token_id": 1.5}, "eos_token_id must be an integer >= 0; got 1.5"),
    ({"max_new_tokens": 2.0}, "max_new_tokens must be an integer >= 1; got 2.0"),
    ({"max_new_tokens": math.nan}, "max_new_tokens must be an integer >= 1; got nan"),
    ({"max_new_tokens": True}, "max_new_tokens must be an integer >= 1; got True"),
    ({"temperature": math.nan}, "temperature must be a finite number; got nan"),
    ({"temperature": math.inf}, "temperature must be a finite number; got inf"),
    ({"temperature": "1"}, "temperature must be a finite number; got '1'"),
    ({"temperature": 10 ** 400}, "temperature must be a finite number"),
    ({"top_k": 0}, "top_k must be an integer >= 1; got 0"),
    ({"top_k": 1.5}, "top_k must be an integer >= 1; got 1.5"),
    ({"top_p": 0}, "top_p must be in (0, 1]; got 0"),
    ({"top_p": math.nan}, "top_p must be a finite number; got nan"),
    ({"top_p": 1.5}, "top_p must be in (0, 1]; got 1.5"),
    ({"temprature": 1}, "unknown option(s) temprature; valid: eos_token_id, max_new_tokens, seed, temperature"),
])
def test_bad_generation_options_are_dex_errors_saying_what_is_wrong(options, message):
    decoder = DexDecoder(model(), explorers=3)
    with pytest.raises(DexError, match=re.escape(message)):
        decoder.generate([1, 2, 3], **options)
    with pytest.raises(DexError, match=re.escape(message)):
        ar_generate(model(), [1, 2, 3], **options)


@pytest.mark.parametrize("options,message", [
    ({"trace_top": -1}, "trace_top must be an integer >= 0; got -1"),
    ({"trace_top": VOCAB + 1}, f"trace_top must be at most the model's vocabulary of {VOCAB} tokens; got {VOCAB + 1}"),
    ({"explorers": 0}, "explorers must be an integer >= 1; got 0"),
    ({"explorers": 2.5}, "explorers must be an integer >= 1; got 2.5"),
    ({"explorers": True}, "explorers must be an integer >= 1; got True"),
    ({"depths": [2.5, 6]}, "depths must be comma-separated integers like 2,3,4 (or a list of ints); got [2.5, 6]"),
    ({"depths": "2.5,6"}, "depths must be comma-separated integers"),
    ({"depths": ["2", "6"]}, "depths must be comma-separated integers"),
    ({"depths": [2, "x"]}, "depths must be comma-separated integers"),
    ({"decs": "no"}, "decs must be True or False; got 'no'"),
    ({"explorer": 3}, "unknown option(s) explorer; valid: adapters, backend, decs, depths, devices, explorers"),
])
def test_bad_decoder_options_are_dex_errors_saying_what_is_wrong(options, message):
    with pytest.raises(DexError, match=re.escape(message)):
        DexDecoder(model(), **options)


def test_options_given_as_something_else_than_their_dataclass_are_dex_errors():
    with pytest.raises(DexError, match="options must be a DecoderOptions"):
        DexDecoder(model(), {"explorers": 3})
    with pytest.raises(DexError, match="options must be a GenerationOptions"):
        DexDecoder(model(), explorers=3).generate([1, 2], options={"seed": 1})


def test_int_like_values_become_plain_ints_and_text_lists_are_parsed():
    import numpy as np

    options = GenerationOptions(max_new_tokens=np.int64(2), seed=np.int32(-3), eos_token_id=[np.int64(5)])
    assert (options.max_new_tokens, options.seed, options.eos_token_id) == (2, -3, (5,))
    assert type(options.max_new_tokens) is int and type(options.eos_token_id[0]) is int
    assert DecoderOptions(depths="2, 4,6").depths == (2, 4, 6) and DecoderOptions(depths=[np.int64(6)]).depths == (6,)


@pytest.mark.parametrize("prompt,message", [
    ("\ud800", "lone surrogate '\\ud800' at character 0"),
    ("hello \udfff world", "lone surrogate '\\udfff' at character 6"),
    (5, "the prompt must be text (a str); got int"),
    (None, "the prompt must be text (a str); got NoneType"),
    (b"hello", "the prompt must be text (a str); got bytes"),
    ("  ", "the prompt is empty"),
])
def test_text_prompts_that_a_tokenizer_cannot_encode_are_dex_errors(prompt, message):
    for chat in (True, False):
        with pytest.raises(DexError, match=re.escape(message)):
            encode_prompt(tiny_tokenizer(), prompt, chat)


@pytest.mark.parametrize("prompt", [[2.5], ["3"], [math.inf], [math.nan], [True], [[1, 2]], "hello", b"hello"])
def test_prompt_token_ids_must_be_integers_not_coerced(prompt):
    with pytest.raises(DexError, match="the prompt must be"):
        DexDecoder(model(), explorers=3).generate(prompt, 2)


@pytest.mark.parametrize("argv,message", [
    (["\ud800"], "lone surrogate"),
    (["hello", "--depths", "2.5,6"], "depths must be comma-separated integers"),
    (["hello", "--temperature", "nan"], "temperature must be a finite number"),
    (["hello", "--top-p", "nan"], "top_p must be a finite number"),
    (["hello", "--top-k", "0"], "top_k must be an integer >= 1"),
    (["hello", "--explorers", "0"], "explorers must be an integer >= 1"),
    (["hello", "--adapters", "/no/such/adapters.safetensors"], "no adapter file at"),
])
def test_bad_generate_inputs_exit_2_with_one_error_line_and_no_traceback(tiny_dir, capsys, argv, message):
    code, out, err = run_cli(capsys, "generate", *argv, "--model", str(tiny_dir), "--no-chat", "--max-new-tokens", "2")
    assert code == 2 and out == ""
    assert err.strip().splitlines()[-1].startswith("dex: error:") and err.count("dex: error:") == 1
    assert message in err and "Traceback" not in err
