"""Light proposal heads: non-final explorers score a shortlist of the vocabulary, not all of it.

A non-final explorer's candidate only decides which branch survives a commit; the committed token
always comes from the final explorer's full head. So a non-final head may score only the N most
frequent tokens of the training text (the *shortlist*): its weight is those N rows of the LM head,
N / V of the head's cost (the default model: 8192 of 49152 rows, 1.33 instead of 8.0 layer-
equivalents). A token outside the shortlist is never proposed at a non-final depth; when the final
token is one, every shallower candidate misses and DEX falls back, as for any wrong guess.

Sampling draws the same Gumbel row as the full head, restricted to the shortlist's columns; DECS
masks the shortlisted ones of the masked ids. Both leave the committed token alone (it is the final
head's), so greedy, seeded sampling, top-k/top-p and DECS stay exact (tests/runtime/test_properties.py).

The option ``proposal_vocab`` is N, 'full', or 'auto' (the default: N = 8192 when a ranking is at
hand, else full). The *ranking* — every token id, most frequent first — is stored with an adapter file (tensor
``shortlist``, ``adapter_ranking``); for a model without one it is derived from text or from the tokenizer
(``dex_core.data.ranking``), and a run's settings pick the shortlist (``runtime.settings.shortlist_ids``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from safetensors import safe_open

from ..config import DEFAULT_PROPOSAL_VOCAB, DexError
from .adapter_choice import named_file, rewrite_adapters
from .adapters import RANKING, check_tensors, header, read_metadata


def proposal_rows(spec, vocab: int, ranked: bool = True) -> int:
    """The rows a non-final head scores for option value ``spec``: 'full' (all ``vocab``), N, or 'auto'
    (``DEFAULT_PROPOSAL_VOCAB`` when a ranking is at hand, ``ranked``; else full)."""
    if spec == "auto":
        spec = DEFAULT_PROPOSAL_VOCAB if ranked else "full"
    return vocab if spec == "full" else min(int(spec), vocab)


class ProposalHead:
    """Final norm + the LM head's rows for ``ids`` + the family's scaling and soft-capping (``ModelView.finish``):
    hidden (n, h) -> logits (n, N) over those ids. The rows are
    cut from the view's LM head, or given (``rows``: weight and bias rows in ``ids``' order, as an explorer
    process that holds only them reads them: ``dex_core.model.stage_load``)."""

    def __init__(self, view, ids, rows: tuple[torch.Tensor, torch.Tensor | None] | None = None):
        ids = torch.as_tensor(ids, dtype=torch.long, device="cpu")  # checked on the host, then moved once
        if (
            ids.ndim != 1
            or len(ids) == 0
            or len(set(ids.tolist())) != len(ids)
            or not (0 <= int(ids.min()) and int(ids.max()) < view.vocab)
        ):
            raise DexError(f"a shortlist must be distinct token ids below the vocabulary of {view.vocab}")
        self.norm, self.finish = view.model.model.norm, view.finish
        self.ids = ids.to(view.device)
        if rows is None:
            head = view.model.lm_head
            rows = head.weight.detach()[self.ids], None if head.bias is None else head.bias.detach()[self.ids]
        self.weight = rows[0].contiguous()
        self.bias = None if rows[1] is None else rows[1].contiguous()
        self.index = torch.full((view.vocab,), -1, dtype=torch.long, device=view.device)
        self.index[self.ids] = torch.arange(len(ids), device=view.device)
        # token id -> column, on the host: what DECS masks through this head
        self.columns = {t: c for c, t in enumerate(ids.tolist())}

    def __len__(self) -> int:
        return len(self.ids)

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.finish(F.linear(self.norm(hidden), self.weight, self.bias))


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
    if (
        int(ranking.min()) < 0
        or int(ranking.max()) >= len(ranking)
        or len(torch.unique(ranking)) != len(ranking)
    ):
        raise DexError(f"{path.name} holds a token ranking that is not a permutation of the vocabulary")
    return ranking
