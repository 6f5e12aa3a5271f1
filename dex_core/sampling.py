"""Token choice for DEX and for the AR reference: greedy, Gumbel-max sampling, DECS, top-k/top-p.

Sampling is Gumbel-max: token = argmax(filter(logits / T) + g), where the noise row g is drawn from
a generator keyed by (seed, absolute position). Every depth and every branch at one position uses the
same row, so the final-depth candidate of the anchor is exactly the token the AR reference draws with
the same seed, and its distribution is the (filtered) model softmax:

    P(argmax_v (log p_v + g_v) = u) = p_u            for g_v i.i.d. Gumbel(0, 1)

A light proposal head (``dex_core.proposal``) scores only a shortlist: its row of noise is the same
row restricted to the shortlist's columns, and the chosen column maps back to its token id.

Top-k / top-p filter the final-depth logits only. DECS (paper App. C.1) sets the tokens proposed by
shallower stages of the same slot chain to -inf before a non-final candidate is chosen; the final
reference is never masked.
"""

from __future__ import annotations

import torch

_MASK64 = (1 << 64) - 1


def noise_key(seed: int, position: int) -> int:
    """A 64-bit generator seed for (seed, position) (splitmix64 finalizer over both)."""
    z = (seed * 0x9E3779B97F4A7C15 + (position + 1) * 0xD1B54A32D192ED03) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def gumbel_row(seed: int, position: int, vocab: int) -> torch.Tensor:
    """Standard Gumbel noise of shape (vocab,), float64, on the CPU; the same on every machine."""
    gen = torch.Generator().manual_seed(noise_key(seed, position))
    u = torch.rand(vocab, generator=gen, dtype=torch.float64)
    return -torch.log(-torch.log(u))


def filter_logits(scores: torch.Tensor, top_k: int | None, top_p: float | None) -> torch.Tensor:
    """Set tokens outside top-k, then outside the top-p nucleus, to -inf. scores: (n, vocab)."""
    if top_k is not None and top_k < scores.shape[-1]:
        kth = torch.topk(scores, top_k, dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        ordered, order = torch.sort(scores, dim=-1, descending=True)
        probs = torch.softmax(ordered, dim=-1)
        drop = probs.cumsum(dim=-1) - probs >= top_p  # mass before this token already reaches p
        drop[..., 0] = False
        scores = scores.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
    return scores


class Sampler:
    """Chooses candidates for a batch of nodes; greedy when ``temperature == 0``."""

    def __init__(self, vocab: int, temperature: float = 0.0, top_k: int | None = None,
                 top_p: float | None = None, seed: int = 0):
        self.vocab = vocab
        self.temperature = temperature
        self.top_k = top_k
        self.top_p = top_p
        self.seed = seed
        self._rows: dict[int, torch.Tensor] = {}

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def noise(self, positions: list[int], like: torch.Tensor) -> torch.Tensor:
        """Gumbel rows for ``positions``, (n, vocab), cached per position."""
        rows = []
        for p in positions:
            if p not in self._rows:
                self._rows[p] = gumbel_row(self.seed, p, self.vocab).to(like.device, like.dtype)
            rows.append(self._rows[p])
        return torch.stack(rows)

    def forget_before(self, position: int) -> None:
        """Drop cached rows of positions already committed."""
        for p in [p for p in self._rows if p < position]:
            del self._rows[p]

    def scores(self, logits: torch.Tensor, final: bool) -> torch.Tensor:
        """Logits -> the scores whose argmax (plus noise when sampling) is the token."""
        if self.greedy:
            return logits
        scores = logits / self.temperature
        return filter_logits(scores, self.top_k, self.top_p) if final else scores

    def choose(self, logits: torch.Tensor, positions: list[int], final: bool,
               masked: list[list[int]] | None = None, head=None) -> torch.Tensor:
        """Token ids (n,) for logits at ``positions``; ``masked[i]`` are DECS-masked ids. Logits are
        (n, vocab), or (n, N) over ``head.ids`` for a light head (``head.index``: id -> column, or -1)."""
        scores = self.scores(logits, final)
        if masked and any(masked):
            rows = torch.tensor([i for i, m in enumerate(masked) for _ in m], dtype=torch.long)
            cols = torch.tensor([t for m in masked for t in m], dtype=torch.long)
            if head is not None:
                cols = head.index[cols.to(head.index.device)].cpu()
                rows, cols = rows[cols >= 0], cols[cols >= 0]
            scores = scores.clone()
            scores[rows.to(scores.device), cols.to(scores.device)] = float("-inf")
        if not self.greedy:
            noise = self.noise(positions, scores)
            scores = scores + (noise if head is None else noise[:, head.ids])
        picked = scores.argmax(dim=-1)
        return picked if head is None else head.ids[picked]
