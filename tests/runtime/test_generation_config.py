"""DEX, ar_generate and hf_greedy agree on what a request means when the model's generation config asks for more:
none applies its processors or its sampling defaults, DEX and ar_generate name each such setting in a
GenerationConfigWarning, and hf_greedy is the plain greedy answer (EOS still from the config)."""

import warnings

import pytest
import torch

from dex_core import DexDecoder, GenerationOptions, ar_generate, hf_greedy
from dex_core.cli import main
from dex_core.runtime.request import PROCESSORS, GenerationConfigWarning, ignored_settings
from dex_core.testing import tiny_model, tiny_tokenizer

PROMPT = [5, 17, 3, 88, 40, 2, 61, 9]
NEW = 24
SETTINGS = {
    "repetition_penalty": 1.3,
    "no_repeat_ngram_size": 2,
    "do_sample": True,
    "temperature": 0.7,
    "top_p": 0.8,
}
PENALTY = (
    "the model's generation_config sets repetition_penalty=1.3, which DEX does not apply (it changes the "
    "tokens model.generate() emits); DEX decodes without it, as ar_generate does; set "
    "generation_config.repetition_penalty = 1.0 to silence this"
)
NGRAM = (
    "the model's generation_config sets no_repeat_ngram_size=2, which DEX does not apply (it changes the "
    "tokens model.generate() emits); DEX decodes without it, as ar_generate does; set "
    "generation_config.no_repeat_ngram_size = 0 to silence this"
)
SAMPLING = (
    "the model's generation_config asks for sampling (do_sample=True, temperature=0.7, top_p=0.8), which DEX "
    "does not take as a default: a request samples only when its temperature is > 0; DEX decodes greedily, "
    "as ar_generate does; pass temperature=0.7, top_k=50, top_p=0.8 to sample as model.generate() does, or "
    "set generation_config.do_sample = False to silence this"
)


def configured(**settings):
    model = tiny_model("llama")
    for name, value in {**SETTINGS, **settings}.items():
        setattr(model.generation_config, name, value)
    return model


@pytest.fixture(scope="module")
def model():
    return configured()


def caught(run) -> tuple[object, list[str]]:
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        out = run()
    return out, [str(w.message) for w in seen if w.category is GenerationConfigWarning]


def test_dex_ar_and_hf_greedy_agree_token_for_token_where_generate_would_apply_processors(model):
    ids = torch.tensor([PROMPT])
    with_config = model.generate(
        ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=NEW
    )
    config = model.generation_config
    reference = hf_greedy(model, PROMPT, NEW)
    assert (
        model.generation_config is config and config.repetition_penalty == 1.3
    )  # the model's config is put back
    assert (
        with_config[0, len(PROMPT) :].tolist() != reference
    )  # the settings change this answer: parity is tested
    assert reference[:8] == [
        57,
        29,
        42,
        14,
        29,
        33,
        55,
        3,
    ]  # a repeated bigram (29 33) that the n-gram ban forbids
    assert caught(lambda: ar_generate(model, PROMPT, NEW))[0].tokens == reference
    for K, prune in ((2, "none"), (6, "auto")):
        decoder = DexDecoder(model, explorers=K, prune=prune)
        assert caught(lambda: decoder.generate(PROMPT, NEW))[0].tokens == reference, K


def test_dex_and_ar_generate_name_each_setting_they_do_not_apply_once_per_request(model):
    decoder = DexDecoder(model, explorers=2)
    for run in (lambda: decoder.generate(PROMPT, 4), lambda: ar_generate(model, PROMPT, 4)):
        assert caught(run)[1] == [PENALTY, NGRAM, SAMPLING]
    assert (
        caught(lambda: hf_greedy(model, PROMPT, 4))[1] == []
    )  # the reference applies none of them: nothing to say


def test_sampling_defaults_are_not_taken_from_the_generation_config(model):
    events, notes = caught(lambda: list(DexDecoder(model, explorers=2).stream(PROMPT, NEW)))
    assert events[0].sampling == {
        "temperature": 0.0,
        "top_k": None,
        "top_p": None,
        "seed": 0,
    }  # greedy, recorded
    assert events[-1].tokens == hf_greedy(model, PROMPT, NEW) and SAMPLING in notes
    asked = {"temperature": 0.7, "top_k": 50, "top_p": 0.8, "seed": 3}  # what the warning says to pass
    result, notes = caught(lambda: DexDecoder(model, explorers=3).generate(PROMPT, NEW, **asked))
    assert notes == [PENALTY, NGRAM]  # the request samples with the config's values: nothing more to say
    assert (
        result.tokens
        == caught(lambda: ar_generate(model, PROMPT, NEW, **asked))[0].tokens
        != events[-1].tokens
    )


def test_a_sampled_request_hears_of_the_filters_it_leaves_off():
    config = configured(top_k=20).generation_config
    notes = ignored_settings(config, GenerationOptions(temperature=0.9, top_k=5))
    assert notes == [
        PENALTY,
        NGRAM,
        "the model's generation_config sets top_p=0.8, which DEX does not take as a "
        "default; DEX samples without it, as ar_generate does; pass top_p=0.8 to sample as "
        "model.generate() does, or set generation_config.top_p = None to silence this",
    ]


@pytest.mark.parametrize(
    "name,value",
    [
        ("bad_words_ids", [[7]]),
        ("suppress_tokens", [3, 4]),
        ("min_new_tokens", 5),
        ("forced_eos_token_id", 2),
        ("num_beams", 4),
        ("sequence_bias", {(7,): -2.0}),
        ("begin_suppress_tokens", [1]),
        ("guidance_scale", 1.5),
    ],
)
def test_every_processor_is_named_and_its_off_value_is_silent(name, value):
    config = tiny_model("llama", layers=2).generation_config
    assert ignored_settings(config, GenerationOptions()) == []
    setattr(config, name, value)
    assert [n.split(", which DEX")[0] for n in ignored_settings(config, GenerationOptions())] == [
        f"the model's generation_config sets {name}={value!r}"
    ]
    setattr(config, name, PROCESSORS[name])
    assert ignored_settings(config, GenerationOptions()) == []
    config.min_p, config.do_sample = 0.05, False
    assert (
        ignored_settings(config, GenerationOptions()) == []
    )  # a sampling filter matters only with do_sample


def test_a_clean_generation_config_raises_no_warning_and_eos_still_stops_all_three():
    model = tiny_model("llama")
    stop = hf_greedy(model, PROMPT, NEW)[5]
    model.generation_config.eos_token_id = stop
    expected = hf_greedy(model, PROMPT, NEW)
    assert expected[-1] == stop and len(expected) <= 6
    with warnings.catch_warnings():
        warnings.simplefilter("error", GenerationConfigWarning)
        assert ar_generate(model, PROMPT, NEW).tokens == expected
        assert DexDecoder(model, explorers=3).generate(PROMPT, NEW).tokens == expected


def test_dex_generate_on_the_command_line_warns_of_the_settings(tmp_path, capsys):
    configured().save_pretrained(tmp_path)
    tiny_tokenizer().save_pretrained(tmp_path)
    code = main(
        [
            "generate",
            "hello world",
            "--model",
            str(tmp_path),
            "--no-chat",
            "--max-new-tokens",
            "3",
            "--dtype",
            "float64",
            "--device",
            "cpu",
            "--explorers",
            "2",
        ]
    )
    out, err = capsys.readouterr()
    assert code == 0 and "3 tokens in" in out
    assert [line for line in err.splitlines() if line.startswith("dex: warning:")] == [
        f"dex: warning: {note}" for note in (PENALTY, NGRAM, SAMPLING)
    ]  # one line each, in the CLI's own form
