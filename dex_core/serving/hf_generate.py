"""DEX through ``transformers``' own ``generate``: ``model.generate(input_ids, custom_generate=hf_generate_dir(),
trust_remote_code=True, explorers=4, max_new_tokens=64)``.

``hf_generate_dir()`` is a folder laid out as a Hub repository of a custom generation method
(``custom_generate/generate.py`` and its ``requirements.txt``); ``transformers`` (4.52 and later: the feature is
gated, not the package's floor) imports its ``generate``, which is ``generate`` below. The merged generation
config (the model's, ``generation_config=``, then keywords) means what it means to ``generate``: greedy unless
``do_sample`` (then its temperature, top-k and top-p, DEX's sampler keyed by ``seed``), ``max_new_tokens`` (else
``max_length``), ``eos_token_id``; ``stopping_criteria`` are asked after every committed token and ``streamer``
gets the prompt, then each token as it is committed. It returns what ``generate`` returns: the sequences, or a
``GenerateDecoderOnlyOutput`` with ``return_dict_in_generate=True``. DEX's own options (``DecoderOptions``'
fields: ``explorers``, ``depths``, ``adapters``, ``draft``, ...) come as keywords. A setting DEX cannot honour
(beams, a logits processor, a repetition penalty, scores, an assistant model, a batch) is refused by name.
"""

from __future__ import annotations

import copy
import dataclasses
import warnings
from importlib.metadata import version
from pathlib import Path

import torch

from ..config import DecoderOptions, DexError, GenerationOptions
from ..decoder import DexDecoder
from ..runtime.request import HF_SAMPLING, PROCESSORS, WARPERS, GenerationConfigWarning

REPO = Path(__file__).resolve().parent / "hub_method"  # custom_generate/generate.py: transformers' layout
FIRST = (4, 52)  # the transformers release that runs custom_generate from a folder or a Hub repository
DEX_FIELDS = {f.name for f in dataclasses.fields(DecoderOptions)} - {"backend", "devices"}
OUTPUTS = ("output_scores", "output_logits", "output_attentions", "output_hidden_states")
NOT_TAKEN = (
    "prefix_allowed_tokens_fn",
    "assistant_model",
    "negative_prompt_ids",
    "negative_prompt_attention_mask",
)
ACCEPTED = {"use_cache", "return_dict_in_generate", "pad_token_id", "bos_token_id", "decoder_start_token_id"}


def hf_generate_dir() -> str:
    """The folder to pass as ``custom_generate=`` (with ``trust_remote_code=True``: transformers runs its
    ``custom_generate/generate.py``)."""
    have = tuple(int(part) for part in version("transformers").split(".")[:2])
    if have < FIRST:
        raise DexError(
            f"model.generate(custom_generate=...) needs transformers >= {FIRST[0]}.{FIRST[1]}; this is "
            f"{version('transformers')}: upgrade it, or call DexDecoder directly"
        )
    return str(REPO)


def generate(
    model, inputs=None, generation_config=None, logits_processor=None, stopping_criteria=None, **kwargs
):
    """``generate`` run by DEX; see the module's docstring. ``kwargs``: what ``generate`` was given besides."""
    refuse = [name for name in NOT_TAKEN if kwargs.pop(name, None) is not None]
    refuse += ["logits_processor"] if logits_processor else []
    refuse += ["synced_gpus"] if kwargs.pop("synced_gpus", None) else []
    dex = {name: kwargs.pop(name) for name in DEX_FIELDS & set(kwargs)}
    seed, streamer = kwargs.pop("seed", 0), kwargs.pop("streamer", None)
    kwargs.pop("tokenizer", None)  # generate's, for stop strings; DEX refuses those (below)
    inputs = inputs if inputs is not None else kwargs.pop("input_ids", None)
    ids = _prompt(inputs, kwargs.pop("attention_mask", None))
    config = copy.deepcopy(generation_config or model.generation_config)
    refuse += sorted(set(config.update(**kwargs)) - ACCEPTED)
    refuse += _unsupported(config)
    if refuse:
        raise DexError(
            f"DEX's custom_generate does not take {', '.join(refuse)}: it would change what generate() "
            f"returns; leave {'it' if len(refuse) == 1 else 'them'} out, or call generate() without custom_generate"
        )
    options = _options(config, len(ids), seed)
    with warnings.catch_warnings():  # the config was read above, setting by setting
        warnings.simplefilter("ignore", GenerationConfigWarning)
        device = torch.as_tensor(inputs).device  # the prompt's: what generate returns and its criteria read
        tokens = _run(DexDecoder(model, **dex), ids, options, (stopping_criteria, device), streamer)
    sequences = torch.tensor([ids + tokens], dtype=torch.long, device=device)
    if not config.return_dict_in_generate:
        return sequences
    from transformers.generation.utils import GenerateDecoderOnlyOutput  # deferred: seconds to import

    return GenerateDecoderOnlyOutput(sequences=sequences)


def _prompt(inputs, mask) -> list[int]:
    """One prompt's token ids (a batch of one, every position attended)."""
    if inputs is None:
        raise DexError("generate() needs the prompt's input_ids")
    inputs = torch.as_tensor(inputs)
    if inputs.dim() != 2 or inputs.shape[0] != 1:
        raise DexError(
            f"DEX generates for one prompt at a time: input_ids of shape (1, n); got {tuple(inputs.shape)}"
        )
    if mask is not None and not bool(torch.as_tensor(mask).all()):
        raise DexError("DEX's custom_generate takes an attention_mask of all ones (one unpadded prompt)")
    return inputs[0].tolist()


def _unsupported(config) -> list[str]:
    """The settings of the merged generation config that would change generate()'s tokens and DEX lacks."""
    names = [
        name for name, off in PROCESSORS.items() if getattr(config, name, None) not in (off, None, [], {})
    ]
    if config.do_sample:
        names += [name for name, off in WARPERS.items() if getattr(config, name, None) not in (off, None)]
    names += [name for name in OUTPUTS if getattr(config, name, False)]
    return names + (["num_return_sequences"] if (config.num_return_sequences or 1) > 1 else [])


def _options(config, prompt: int, seed: int) -> GenerationOptions:
    """The request ``generate`` would run: its length, its sampling, its EOS."""
    most = config.max_new_tokens if config.max_new_tokens is not None else config.max_length - prompt
    if most < 1:
        raise DexError(
            f"max_length={config.max_length} leaves no room after the prompt's {prompt} tokens: pass max_new_tokens"
        )

    def setting(name):
        return HF_SAMPLING[name] if getattr(config, name, None) is None else getattr(config, name)

    sample = dict(temperature=setting("temperature"), top_k=setting("top_k") or None, top_p=setting("top_p"))
    if not config.do_sample:
        sample = dict(temperature=0.0, top_k=None, top_p=None)
    eos = config.eos_token_id
    return GenerationOptions(max_new_tokens=most, seed=seed, eos_token_id=eos, **sample)


def _run(decoder: DexDecoder, ids: list[int], options, criteria, streamer) -> list[int]:
    """The committed tokens, asking the stopping criteria (``criteria``: them and the device of the sequences they
    read) after each; ``streamer`` gets them as they come, on the host as ``generate`` gives them."""
    stopping_criteria, device = criteria
    if streamer is not None:
        streamer.put(torch.tensor([ids], device="cpu"))
    tokens, stream = [], decoder.stream(ids, options=options)
    try:
        for event in stream:
            for commit in event.commits:
                tokens.append(commit.token)
                if streamer is not None:
                    streamer.put(torch.tensor([commit.token], device="cpu"))
                sequences = torch.tensor([ids + tokens], device=device) if stopping_criteria else None
                if stopping_criteria and bool(stopping_criteria(sequences, None).all()):
                    return tokens
    finally:
        stream.close()
        if streamer is not None:
            streamer.end()
    return tokens
