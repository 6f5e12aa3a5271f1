"""Every input either works exactly or is a DexError: the library API, the app's option parsing, the CLI.

Hypothesis draws two kinds of cases on purpose: options and prompts that are all valid, for which DEX
must emit exactly the AR reference's tokens (never an error), and the same with one field replaced by a
value that is always wrong (negative, out of range, NaN, inf, floats for ints, text, None, bools), for
which DEX and the AR reference must both raise a DexError that names the field.
"""

import dataclasses
import functools
import inspect
import math
import re

import pytest
from helpers import run_cli
from hypothesis import event, given, settings
from hypothesis import strategies as st

from app.ui.inputs import PRUNE_CHOICES, Inputs
from dex_core import DecoderOptions, DexConfig, DexDecoder, DexError, GenerationOptions, ar_generate
from dex_core.flags import control
from dex_core.runtime.request import encode_prompt
from dex_core.testing import tiny_model, tiny_tokenizer

LAYERS, VOCAB = 6, 96


@functools.cache
def model():
    return tiny_model("llama", layers=LAYERS, vocab=VOCAB)


@functools.cache
def tokenizer():  # one object: its token ranking (light proposal heads) is derived once
    return tiny_tokenizer(VOCAB)


DEPTHS = st.lists(st.integers(1, LAYERS - 1), unique=True, max_size=4).map(
    lambda d: tuple(sorted(d)) + (LAYERS,)
)
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
    "seed": st.integers(0, 2**64 - 1),
    "eos_token_id": st.one_of(
        st.none(), st.integers(0, VOCAB - 1), st.lists(st.integers(0, VOCAB - 1), max_size=3)
    ),
    "prompt": st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=6),
}
DECODER_FIELDS = ("explorers", "depths", "decs", "trace_top", "proposal_vocab", "prune")
NOT_A_NUMBER = [
    None,
    True,
    math.nan,
    math.inf,
    "3",
    b"2",
    (),
    [2],
]  # not explorers or trace_top: ints only, no text
BAD = {  # per field, values that are always wrong (each one a DexError on its own)
    "explorers": st.one_of(
        st.integers(max_value=0), st.integers(LAYERS + 1, 2**70), st.sampled_from([2.5, 2.0] + NOT_A_NUMBER)
    ),
    "depths": st.one_of(
        st.sampled_from(
            [
                "abc",
                "2.5,6",
                "",
                (),
                (0, LAYERS),
                (2, 2, LAYERS),
                (4, 2, LAYERS),
                6,
                (6.0,),
                ["2", "6"],
                [2.5, 6],
            ]
        ),
        DEPTHS.map(lambda d: d[:-1] + (LAYERS + 1,)),
        st.lists(st.integers(1, LAYERS - 1), min_size=1, max_size=4, unique=True).map(sorted).map(tuple),
    ),
    "decs": st.sampled_from(["no", "yes", 2, -1, None, 0.5]),
    "trace_top": st.one_of(
        st.integers(max_value=-1), st.integers(VOCAB + 1, 2**70), st.sampled_from([2.5, 2.0] + NOT_A_NUMBER)
    ),
    "proposal_vocab": st.one_of(
        st.integers(max_value=0), st.sampled_from(["some", "", 2.5, 2.0, None, True, math.nan, b"2", (), [2]])
    ),  # "3" is N written as text
    "prune": st.one_of(st.integers(max_value=0), st.sampled_from(["x", "", 2.5, 2.0, True, math.nan, b"2"])),
    "max_new_tokens": st.one_of(
        st.integers(max_value=0),
        st.integers(10**6, 2**70),
        st.sampled_from([2.0, 2.5, math.nan, math.inf, True, "3", b"2"]),
    ),
    "temperature": st.one_of(
        st.floats(max_value=-1e-6), st.sampled_from([math.nan, math.inf, -math.inf, "1", None, True, 10**400])
    ),
    "top_k": st.one_of(
        st.integers(max_value=0), st.sampled_from([1.5, 2.0, True, math.nan, math.inf, "3", b"2", (), [2]])
    ),
    "top_p": st.one_of(
        st.floats(max_value=0.0),
        st.floats(min_value=1.0, exclude_min=True),
        st.sampled_from([math.nan, "0.5", True, b"1"]),
    ),
    "seed": st.one_of(
        st.integers(max_value=-1),
        st.integers(min_value=2**64),
        st.sampled_from([1.5, 2.0, "abc", "7", None, True, math.nan, math.inf]),
    ),
    "eos_token_id": st.one_of(
        st.integers(max_value=-1),
        st.lists(st.integers(max_value=-1), min_size=1, max_size=3),
        st.sampled_from(["x", "1,x", 1.5, 2.0, True, [1, 2.5]]),
    ),
    "prompt": st.one_of(
        st.just([]),
        st.lists(
            st.one_of(
                st.integers(max_value=-1),
                st.integers(min_value=VOCAB),
                st.floats(0, 5),
                st.booleans(),
                st.text(max_size=1),
            ),
            min_size=1,
            max_size=4,
        ),
        st.sampled_from([None, 5, "hello", b"hello", [[1, 2]]]),
    ),
}


def split(values: dict):
    """{option: value} -> (decoder options, generation options, prompt)."""
    values = dict(values)
    prompt = values.pop("prompt")
    return {k: values.pop(k) for k in DECODER_FIELDS if k in values}, values, prompt


@st.composite
def valid_cases(draw):
    """(decoder options, generation options, prompt), every one valid; unset options keep their defaults."""
    return split(
        {
            name: draw(strategy)
            for name, strategy in VALID.items()
            if name in ("max_new_tokens", "prompt") or draw(st.booleans())
        }
    )


@st.composite
def invalid_cases(draw, field: str):
    """(decoder options, generation options, prompt): valid options but ``field``, always wrong."""
    values = {
        name: draw(strategy)
        for name, strategy in VALID.items()
        if name in ("max_new_tokens", "prompt") or draw(st.booleans())
    }
    values[field] = draw(BAD[field])
    if field == "explorers":
        values.pop("depths", None)  # explicit depths decide K; explorers then only has to be an integer >= 1
    return split(values)


@given(case=valid_cases())
def test_valid_options_give_exactly_the_ar_references_tokens(case):
    decoder_options, generation, prompt = case
    decoder = DexDecoder(model(), tokenizer=tokenizer(), **decoder_options)  # never a DexError
    ar = ar_generate(model(), prompt, **generation).tokens
    event("sampled" if generation.get("temperature") else "greedy")
    assert decoder.generate(prompt, **generation).tokens == ar


# each field refused in every run, not only where it is drawn
@pytest.mark.parametrize("field", sorted(BAD))
@given(data=st.data())
def test_one_invalid_option_is_a_dex_error_naming_it_from_dex_and_the_ar_reference_alike(field, data):
    decoder_options, generation, prompt = data.draw(invalid_cases(field))
    named = re.escape(field)  # the message names the option (or the prompt) it refuses
    if field in DECODER_FIELDS:
        with pytest.raises(DexError, match=named):
            DexDecoder(model(), tokenizer=tokenizer(), **decoder_options)
        return
    decoder = DexDecoder(
        model(), tokenizer=tokenizer(), **decoder_options
    )  # the decoder options are all valid
    with pytest.raises(DexError, match=named) as dex:
        decoder.generate(prompt, **generation)
    with pytest.raises(DexError, match=named) as ar:
        ar_generate(model(), prompt, **generation)
    assert str(dex.value) == str(ar.value)


def sent_as(numbers):
    """A number as the app's controls or an API client may send it: as is, as a float, or as text."""
    return numbers.flatmap(lambda n: st.sampled_from([n, float(n), str(n), f" {n} "]))


UI_DEPTHS = st.lists(st.integers(1, 64), min_size=1, max_size=8, unique=True).map(sorted)
UI_VALID = {  # the Live tab's controls, each value one that the app accepts
    "chat": st.booleans(),
    "adapters": st.booleans(),
    "decs": st.booleans(),
    "sample": st.booleans(),
    "explorers": sent_as(st.integers(1, 8)),
    "depths": st.one_of(
        st.sampled_from(["", "  "]), UI_DEPTHS.map(lambda d: ",".join(map(str, d))), UI_DEPTHS
    ),
    "temperature": st.one_of(st.floats(0.0, 5.0), st.floats(0.0, 5.0).map(str)),
    "top_k": sent_as(st.integers(0, 10**6)),
    "top_p": st.one_of(st.floats(1e-6, 1.0), st.just("1"), st.just(" 0.5 ")),
    "seed": st.one_of(st.integers(0, 2**64 - 1), sent_as(st.integers(0, 2**40))),
    "max_new_tokens": sent_as(st.integers(1, 512)),
    "prune": st.sampled_from(PRUNE_CHOICES),
}
NOT_A_FLAG = st.sampled_from(["no", "true", "", None, 2, -1, 0.5, math.nan])
UI_BAD = {  # per control, values that are always refused (the sampling ones with sample on)
    "chat": NOT_A_FLAG,
    "adapters": NOT_A_FLAG,
    "decs": NOT_A_FLAG,
    "sample": NOT_A_FLAG,
    "explorers": st.one_of(
        st.integers(max_value=0),
        st.integers(min_value=9),
        st.sampled_from([2.5, "x", "", math.nan, math.inf, None, True, "9"]),
    ),
    "depths": st.sampled_from(["2.5,6", "abc", "4,2,6", "2,2,6", "0,6", "-1,6", 5, "2;4"]),
    "temperature": st.one_of(
        st.floats(max_value=-1e-6), st.sampled_from([math.nan, math.inf, "x", "1e400", None, True])
    ),
    "top_k": st.one_of(st.integers(max_value=-1), st.sampled_from([1.5, "x", "", None, math.inf, True])),
    "top_p": st.one_of(
        st.floats(max_value=0.0),
        st.floats(min_value=1.0, exclude_min=True),
        st.sampled_from([math.nan, "x", None, True]),
    ),
    "seed": st.one_of(
        sent_as(st.integers(max_value=-1)),
        st.integers(min_value=2**64),
        st.sampled_from([1.5, "abc", "", None, math.nan, math.inf, True]),
    ),
    "max_new_tokens": st.one_of(
        st.integers(max_value=0), st.integers(min_value=513), st.sampled_from([2.5, "nan", None, True, "513"])
    ),
    "prune": st.sampled_from(["3", 3, None, "x", "", 1]),
}
UI_NAMES = {"prune": "lattice pruning"}  # how an error names the control; every other one by its own name


def number(value):
    return float(value) if isinstance(value, str) else value


def ui_defaults() -> dict:
    return {name: p.default for name, p in inspect.signature(Inputs).parameters.items()}


def parsed_depths(depths):
    text = ",".join(map(str, depths)) if isinstance(depths, list) else depths
    return tuple(int(d) for d in text.split(",")) if text.strip() else None


# 12 optional controls, most sent in up to four forms (int, float, text, padded text): the profile's examples
# meet few of the combinations, and an example costs about 2 ms (no model runs), so this one takes 16 times as many
@settings(max_examples=16 * settings.default.max_examples)
@given(controls=st.fixed_dictionaries({}, optional=UI_VALID))
def test_the_apps_valid_control_values_give_the_config_they_say(controls):
    config = Inputs(**controls).config()  # never a DexError
    sent = {**ui_defaults(), **controls}
    sample = sent["sample"]
    expected = {
        "chat": bool(sent["chat"]),
        "decs": bool(sent["decs"]),
        "adapters": "auto" if sent["adapters"] else "none",
        "explorers": int(number(sent["explorers"])),
        "depths": parsed_depths(sent["depths"]),
        "temperature": float(number(sent["temperature"])) if sample else 0.0,
        "top_k": (int(number(sent["top_k"])) or None) if sample else None,
        "top_p": (None if float(number(sent["top_p"])) == 1.0 else float(number(sent["top_p"])))
        if sample
        else None,
        "seed": int(number(sent["seed"])),
        "max_new_tokens": int(number(sent["max_new_tokens"])),
        "prune": {"auto": "auto", "none": None}[sent["prune"]]
        if sent["prune"] in ("auto", "none")
        else int(sent["prune"]),
    }
    assert {name: getattr(config, name) for name in expected} == expected
    assert (
        DexConfig(**dataclasses.asdict(config)) == config
    )  # already valid: validating again changes nothing
    for cls, name in ((DecoderOptions, "explorers"), (GenerationOptions, "max_new_tokens")):
        offered = control(cls, name)  # what the app's slider offers is all that the server accepts
        assert offered["minimum"] <= getattr(config, name) <= offered["maximum"]


# each control refused in every run, not only where it is drawn
@pytest.mark.parametrize("name", sorted(UI_BAD))
@given(data=st.data(), controls=st.fixed_dictionaries({}, optional=UI_VALID))
def test_one_refused_control_value_is_a_dex_error_naming_that_control(name, data, controls):
    controls[name] = data.draw(UI_BAD[name])
    if name in ("temperature", "top_k", "top_p"):
        controls["sample"] = True  # with sampling off the app ignores these three
    with pytest.raises(DexError, match=re.escape(UI_NAMES.get(name, name))):
        Inputs(**controls).config()


SEEDS = (
    "seed must be an integer from 0 to 2**64 - 1 (18446744073709551615); a seed outside that range would repeat "
    "another seed's samples"
)


@pytest.mark.parametrize(
    "options,message",
    [
        ({"seed": 1.5}, "seed must be an integer; got 1.5"),
        ({"seed": "abc"}, "seed must be an integer; got 'abc'"),
        ({"seed": None}, "seed must be an integer; got None"),
        ({"seed": 2**64}, f"{SEEDS}; got 18446744073709551616"),  # not seed 0's noise again
        ({"seed": -1}, f"{SEEDS}; got -1"),  # not seed 2**64 - 1's
        ({"eos_token_id": "x"}, "eos_token_id must be comma-separated integers"),
        ({"eos_token_id": 1.5}, "eos_token_id must be an integer >= 0; got 1.5"),
        ({"max_new_tokens": 2.0}, "max_new_tokens must be an integer >= 1; got 2.0"),
        ({"max_new_tokens": math.nan}, "max_new_tokens must be an integer >= 1; got nan"),
        ({"max_new_tokens": True}, "max_new_tokens must be an integer >= 1; got True"),
        ({"temperature": math.nan}, "temperature must be a finite number; got nan"),
        ({"temperature": math.inf}, "temperature must be a finite number; got inf"),
        ({"temperature": "1"}, "temperature must be a finite number; got '1'"),
        ({"temperature": 10**400}, "temperature must be a finite number"),
        ({"top_k": 0}, "top_k must be an integer >= 1; got 0"),
        ({"top_k": 1.5}, "top_k must be an integer >= 1; got 1.5"),
        ({"top_p": 0}, "top_p must be in (0, 1]; got 0"),
        ({"top_p": math.nan}, "top_p must be a finite number; got nan"),
        ({"top_p": 1.5}, "top_p must be in (0, 1]; got 1.5"),
        (
            {"temprature": 1},
            "unknown option(s) temprature; valid: eos_token_id, max_new_tokens, seed, temperature",
        ),
    ],
)
def test_bad_generation_options_are_dex_errors_saying_what_is_wrong(options, message):
    decoder = DexDecoder(model(), explorers=3)
    with pytest.raises(DexError, match=re.escape(message)):
        decoder.generate([1, 2, 3], **options)
    with pytest.raises(DexError, match=re.escape(message)):
        ar_generate(model(), [1, 2, 3], **options)


@pytest.mark.parametrize(
    "options,message",
    [
        ({"trace_top": -1}, "trace_top must be an integer >= 0; got -1"),
        (
            {"trace_top": VOCAB + 1},
            f"trace_top must be at most the model's vocabulary of {VOCAB} tokens; got {VOCAB + 1}",
        ),
        ({"explorers": 0}, "explorers must be an integer >= 1; got 0"),
        ({"explorers": 2.5}, "explorers must be an integer >= 1; got 2.5"),
        ({"explorers": True}, "explorers must be an integer >= 1; got True"),
        (
            {"depths": [2.5, 6]},
            "depths must be comma-separated integers like 2,3,4 (or a list of ints); got [2.5, 6]",
        ),
        ({"depths": "2.5,6"}, "depths must be comma-separated integers"),
        ({"depths": ["2", "6"]}, "depths must be comma-separated integers"),
        ({"depths": [2, "x"]}, "depths must be comma-separated integers"),
        ({"decs": "no"}, "decs must be True or False; got 'no'"),
        (
            {"explorer": 3},
            "unknown option(s) explorer; valid: adapters, backend, compile, decs, depths, devices, draft, explorers",
        ),
    ],
)
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

    options = GenerationOptions(
        max_new_tokens=np.int64(2), seed=np.uint64(2**64 - 1), eos_token_id=[np.int64(5)]
    )
    assert (options.max_new_tokens, options.seed, options.eos_token_id) == (2, 2**64 - 1, (5,))
    assert (
        type(options.max_new_tokens) is int
        and type(options.seed) is int
        and type(options.eos_token_id[0]) is int
    )
    assert DecoderOptions(depths="2, 4,6").depths == (2, 4, 6) and DecoderOptions(
        depths=[np.int64(6)]
    ).depths == (6,)


@pytest.mark.parametrize(
    "prompt,message",
    [
        ("\ud800", "lone surrogate '\\ud800' at character 0"),
        ("hello \udfff world", "lone surrogate '\\udfff' at character 6"),
        (5, "the prompt must be text (a str); got int"),
        (None, "the prompt must be text (a str); got NoneType"),
        (b"hello", "the prompt must be text (a str); got bytes"),
        ("  ", "the prompt is empty"),
    ],
)
def test_text_prompts_that_a_tokenizer_cannot_encode_are_dex_errors(prompt, message):
    for chat in (True, False):
        with pytest.raises(DexError, match=re.escape(message)):
            encode_prompt(tiny_tokenizer(), prompt, chat)


@pytest.mark.parametrize(
    "prompt", [[2.5], ["3"], [math.inf], [math.nan], [True], [[1, 2]], "hello", b"hello"]
)
def test_prompt_token_ids_must_be_integers_not_coerced(prompt):
    with pytest.raises(DexError, match="the prompt must be"):
        DexDecoder(model(), explorers=3).generate(prompt, 2)


@pytest.mark.parametrize(
    "argv,message",
    [
        (["\ud800"], "lone surrogate"),
        (["hello", "--depths", "2.5,6"], "depths must be comma-separated integers"),
        (["hello", "--temperature", "nan"], "temperature must be a finite number"),
        (["hello", "--top-p", "nan"], "top_p must be a finite number"),
        (["hello", "--top-k", "0"], "top_k must be an integer >= 1"),
        (["hello", "--explorers", "0"], "explorers must be an integer >= 1"),
        (["hello", "--adapters", "/no/such/adapters.safetensors"], "no adapter file at"),
    ],
)
def test_bad_generate_inputs_exit_2_with_one_error_line_and_no_traceback(tiny_dir, capsys, argv, message):
    code, out, err = run_cli(
        capsys, "generate", *argv, "--model", str(tiny_dir), "--no-chat", "--max-new-tokens", "2"
    )
    assert code == 2 and out == ""
    assert err.strip().splitlines()[-1].startswith("dex: error:") and err.count("dex: error:") == 1
    assert message in err and "Traceback" not in err
