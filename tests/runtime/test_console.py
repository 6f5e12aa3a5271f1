"""Streamed text: what ``TextStream`` prints equals the full decode, with bounded decoding work per token."""

import io

from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from dex_core.runtime.console import TextStream

TEXT = "héllo wörld, 你好世界 🙂👍🏽 naïve café\n  indented … ünïcödé 🇫🇷 end"


def byte_tokenizer():
    """Byte-level BPE without merges: one token per UTF-8 byte, so every non-ASCII character spans tokens."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE({c: i for i, c in enumerate(alphabet)}, []))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok)


class Counting:
    """A tokenizer wrapper that records how many tokens each decode call was given."""

    def __init__(self, tokenizer):
        self.tokenizer, self.sizes = tokenizer, []

    def decode(self, tokens, **kwargs):
        self.sizes.append(len(tokens))
        return self.tokenizer.decode(tokens, **kwargs)


def streamed(tokenizer, tokens) -> tuple[str, list[str]]:
    out, prefixes = io.StringIO(), []
    stream = TextStream(tokenizer, out)
    for t in tokens:
        stream.push(t)
        prefixes.append(out.getvalue())
    return out.getvalue(), prefixes


def test_streamed_text_equals_the_full_decode_with_characters_split_over_tokens():
    tokenizer = byte_tokenizer()
    tokens = tokenizer(TEXT)["input_ids"]
    assert len(tokens) > len(TEXT) + 20  # many characters take several tokens
    text, prefixes = streamed(tokenizer, tokens)
    assert text == tokenizer.decode(tokens) == TEXT
    assert all(TEXT.startswith(p) and "\ufffd" not in p for p in prefixes)  # never a broken character
    assert (
        prefixes[tokens.index(tokenizer("你")["input_ids"][0])] == "héllo wörld, "
    )  # held back mid-character


def test_streaming_decodes_a_bounded_window_however_long_the_text():
    tokenizer = Counting(byte_tokenizer())
    tokens = tokenizer.tokenizer(TEXT * 40)["input_ids"]
    text, _ = streamed(tokenizer, tokens)
    assert text == TEXT * 40 and len(tokens) > 3000
    assert max(tokenizer.sizes) == 8  # the last printed character and the next, 4 bytes each at most


def test_word_tokens_stream_with_their_spaces():
    from dex_core.testing import tiny_tokenizer

    tokenizer = tiny_tokenizer()
    tokens = tokenizer("hello world the prime number w5 w17")["input_ids"]
    text, prefixes = streamed(tokenizer, tokens)
    assert text == tokenizer.decode(tokens) == "hello world the prime number w5 w17"
    assert prefixes[:3] == ["hello", "hello world", "hello world the"]


def test_the_default_models_tokenizer_streams_its_full_decode(default_model):
    _, tokenizer = default_model  # conftest: loaded once a session (marks the test real_model and slow)
    tokens = tokenizer(TEXT + " def fibonacci(n):\n    return n")["input_ids"]
    text, prefixes = streamed(tokenizer, tokens + [tokenizer.eos_token_id])
    assert text == tokenizer.decode(tokens, skip_special_tokens=True)
    assert all("\ufffd" not in p for p in prefixes) and text.startswith("héllo wörld")


def test_finish_prints_what_a_run_ending_inside_a_character_held_back():
    tokenizer = byte_tokenizer()
    ids = tokenizer("ok é")["input_ids"][:-1]  # the last byte of é is never generated
    out = io.StringIO()
    stream = TextStream(tokenizer, out)
    for t in ids:
        stream.push(t)
    assert out.getvalue() == "ok "
    stream.finish()
    assert out.getvalue() == tokenizer.decode(ids) and out.getvalue().endswith("\ufffd")
