"""``model.generate(custom_generate=hf_generate_dir(), trust_remote_code=True, ...)``: transformers' own entry
point runs DEX and returns what ``generate`` returns, on a tiny model and on the real default model; stopping
criteria, the EOS, a streamer and ``return_dict_in_generate`` are honoured, and what DEX cannot honour is refused
by name."""

import pytest
import torch
from transformers import StoppingCriteria, StoppingCriteriaList

from dex_core import DexError, hf_generate_dir, hf_greedy

PROMPT = [[1, 5, 9, 13, 20]]


def dex(model, ids, **kw):
    return model.generate(ids, custom_generate=hf_generate_dir(), trust_remote_code=True, **kw)


def test_it_equals_generate_greedy_on_a_tiny_model_with_its_outputs_and_streamer(llama):
    ids = torch.tensor(PROMPT)
    plain = llama.generate(ids, do_sample=False, max_new_tokens=24)
    assert torch.equal(dex(llama, ids, explorers=3, do_sample=False, max_new_tokens=24), plain)
    seen = []

    class Keep:  # transformers' streamer protocol: the prompt, then each new token, then end()
        def put(self, value):
            seen.append(value.tolist())

        def end(self):
            seen.append("end")

    out = dex(llama, ids, explorers=4, max_new_tokens=24, return_dict_in_generate=True, streamer=Keep())
    assert type(out).__name__ == "GenerateDecoderOnlyOutput" and torch.equal(out.sequences, plain)
    assert seen == [PROMPT, *[[t] for t in plain[0, 5:].tolist()], "end"]


def test_the_eos_and_stopping_criteria_end_it_where_generate_ends(llama):
    ids = torch.tensor(PROMPT)
    plain = llama.generate(ids, do_sample=False, max_new_tokens=24)[0, 5:].tolist()
    eos = plain[6]  # a token the answer reaches: generate stops there, the token kept
    at_eos = llama.generate(ids, do_sample=False, max_new_tokens=24, eos_token_id=eos, pad_token_id=0)
    assert at_eos.shape[1] < 5 + 24
    assert torch.equal(dex(llama, ids, explorers=3, max_new_tokens=24, eos_token_id=eos), at_eos)

    class Seven(StoppingCriteria):
        def __call__(self, input_ids, scores, **kw):
            return torch.full((input_ids.shape[0],), input_ids.shape[1] >= 5 + 7, dtype=torch.bool)

    stop = StoppingCriteriaList([Seven()])
    stopped = llama.generate(ids, do_sample=False, max_new_tokens=24, stopping_criteria=stop)
    assert stopped.shape[1] == 5 + 7
    assert torch.equal(dex(llama, ids, explorers=3, max_new_tokens=24, stopping_criteria=stop), stopped)


@pytest.mark.parametrize(
    "change, named",
    [
        ({"num_beams": 2}, "num_beams"),
        ({"repetition_penalty": 1.3}, "repetition_penalty"),
        ({"output_scores": True}, "output_scores"),
        ({"num_return_sequences": 2, "do_sample": True}, "num_return_sequences"),
        ({"frobnicate": 1}, "frobnicate"),
    ],
)
def test_what_dex_cannot_honour_is_refused_by_name(llama, change, named):
    with pytest.raises(DexError, match=f"does not take {named}"):
        dex(llama, torch.tensor(PROMPT), explorers=3, max_new_tokens=4, **change)


def test_a_batch_is_refused_with_its_shape(llama):
    with pytest.raises(DexError, match=r"one prompt at a time.*\(2, 5\)"):
        dex(llama, torch.tensor(PROMPT * 2), explorers=3, max_new_tokens=4)


@pytest.mark.real_model
def test_it_equals_generate_greedy_on_the_default_model(default_model):
    model, tokenizer = default_model
    ids = tokenizer("def fibonacci(n):", return_tensors="pt")["input_ids"]
    out = dex(model, ids, explorers=4, do_sample=False, max_new_tokens=32)
    assert out[0, ids.shape[1] :].tolist() == hf_greedy(model, ids[0].tolist(), 32)
    assert torch.equal(out, model.generate(ids, do_sample=False, max_new_tokens=32))
