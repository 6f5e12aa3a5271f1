"""Token choice for DEX and for the AR reference: greedy, Gumbel-max sampling, DECS, top-k/top-p.

Sampling is Gumbel-max: token = argmax(filter(logits / T) + g), where the noise row g is drawn from
a generator keyed by (seed, absolute position). Every depth and every branch at one position uses the
same row, so the final-depth candidate of the anchor is exactly the token the AR reference draws with
the same seed, and its distribution is the (filtered) model softmax:

    P(argmax_v (log p_v + g_v) = u) = p_u            for g_v i.i.d. Gumbel(0, 1)

A light proposal head (``dex_core.model.proposal``) scores only a shortlist: its row of noise is the same
row restricted to the shortlist's columns, and the chosen column maps back to its token id.

Top-k / top-p filter the final-depth logits only. DECS (paper App. C.1) sets the tokens proposed by
shallower stages of the same slot chain to -inf before a non-final candidate is chosen; the final
reference is never masked.

Every choice is made in float32 at least, whatever the model's dtype (logits are upcast before
temperature, filters and noise), in DEX and in the AR reference alike. A reduced-precision model still rounds its
logits to its dtype, and batched lattice rows round differently from one AR row, so in bfloat16 or
float16 two tokens within a few units in the last place of each other can swap: ``tie_gap`` is that
bound, and ``Decision`` reports each final-depth choice's top-1 minus top-2 margin and that gap.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..device import to_device
from ..shapes import bucket, padded

DECS_WIDTH = 8  # the DECS table's least width: a row masks K - 1 candidates at most, so K <= 9 take one width

_MASK64 = (1 << 64) - 1


def noise_key(seed: int, position: int) -> int:
    """A 64-bit generator seed for (seed, position) (splitmix64 finalizer over both). For seeds in 0..2**64 - 1
    (``GenerationOptions`` refuses others) the key is one-to-one in the seed at each position; beyond, seeds wrap."""
    z = (seed * 0x9E3779B97F4A7C15 + (position + 1) * 0xD1B54A32D192ED03) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


TIE_ULPS = 4  # a near-tie: within this many units in the last place of the logit's magnitude


def tie_gap(dtype: torch.dtype, magnitude, temperature: float = 0.0):
    """The largest score gap counted as a numerical near-tie for logits a model computed in ``dtype``:
    ``TIE_ULPS`` units in the last place at ``magnitude`` (the row's largest logit; a float or a tensor),
    divided by the temperature when sampling. bfloat16 at 16-32: 4 x 0.125 = 0.5; float64: ~1e-14."""
    info = torch.finfo(dtype)
    m = (
        torch.as_tensor(magnitude, dtype=torch.float64, device=getattr(magnitude, "device", "cpu"))
        .abs()
        .clamp(min=info.tiny)
    )
    gap = TIE_ULPS * info.eps * torch.exp2(torch.floor(torch.log2(m)))
    gap = gap / temperature if temperature > 0 else gap
    return float(gap) if gap.dim() == 0 else gap


def gumbel_row(seed: int, position: int, vocab: int, device="cpu") -> torch.Tensor:
    """Standard Gumbel noise (vocab,), float32, drawn on ``device`` by a generator keyed by (seed,
    position): the same row for every depth, branch and run on that kind of device."""
    gen = torch.Generator(device=device).manual_seed(noise_key(seed, position))
    u = torch.rand(vocab, generator=gen, dtype=torch.float32, device=device)
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


@dataclass
class Decision:
    """Token choices for a batch of n nodes, on the logits' device."""

    tokens: torch.Tensor  # (n,) token ids
    margins: torch.Tensor | None = None  # (n,) top-1 minus top-2 score (final depth only)
    gaps: torch.Tensor | None = None  # (n,) the tie gap of the model's dtype at each row's top logit


class Sampler:
    """Chooses candidates for a batch of nodes; greedy when ``temperature == 0``."""

    def __init__(
        self,
        vocab: int,
        temperature: float = 0.0,
        top_k: int | None = None,
        top_p: float | None = None,
        seed: int = 0,
    ):
        self.vocab = vocab
        self.temperature = temperature
        self.top_k = top_k
        self.top_p = top_p
        self.seed = seed
        self._rows: dict[int, torch.Tensor] = {}

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def filtered(self) -> bool:
        """Whether the final depth's scores differ from the others' (top-k/top-p while sampling)."""
        return not self.greedy and (self.top_k is not None or (self.top_p is not None and self.top_p < 1.0))

    def noise(self, positions: list[int], like: torch.Tensor) -> torch.Tensor:
        """Gumbel rows for ``positions``, (n, vocab) float32 on ``like``'s device, cached per position."""
        for p in positions:
            if p not in self._rows:
                self._rows[p] = gumbel_row(self.seed, p, self.vocab, like.device)
        return torch.stack([self._rows[p] for p in positions])

    def forget_before(self, position: int) -> None:
        """Drop cached rows of positions already committed."""
        for p in [p for p in self._rows if p < position]:
            del self._rows[p]

    def scores(self, logits: torch.Tensor, final: bool) -> torch.Tensor:
        """Logits -> the scores (float32, or float64 for a float64 model) whose argmax (plus noise when
        sampling) is the token."""
        logits = logits if logits.dtype in (torch.float32, torch.float64) else logits.float()
        if self.greedy:
            return logits
        scores = logits / self.temperature
        return filter_logits(scores, self.top_k, self.top_p) if final else scores

    def choose(
        self,
        logits: torch.Tensor,
        positions: list[int],
        final: bool,
        masked: list[list[int]] | None = None,
        head=None,
    ) -> torch.Tensor:
        """Token ids (n,) for logits at ``positions``: ``decide(...).tokens``."""
        return self.decide(logits, positions, final, masked, head).tokens

    def decide(
        self,
        logits: torch.Tensor,
        positions: list[int],
        final: bool,
        masked: list[list[int]] | None = None,
        head=None,
    ) -> Decision:
        """Tokens for logits at ``positions`` (None when greedy: no noise rows) and, at the final depth, their
        margins; ``masked[i]`` are DECS-masked ids (None or empty: none; a list of rows, even of empty rows: one
        scatter of them all). Logits are (n, vocab), or (n, N) over ``head.ids`` for a light head
        (``head.index``: id -> column, or -1). Nothing here waits for the device."""
        scores = self.scores(logits, final)
        if masked:  # a table for every row (empty ones too: the same ops every round)
            scores = self._masked(scores, masked, head)
        if not self.greedy:
            noise = self.noise(positions, scores)
            scores = scores + (noise if head is None else noise[:, head.ids])
        picked = scores.max(dim=-1).indices  # the first of equal maxima, as argmax (half its time on a CPU)
        if head is not None:
            return Decision(head.ids[picked])
        if not final:
            return Decision(picked)
        top = scores.topk(min(2, scores.shape[-1]), dim=-1).values  # (n, 2)
        margins = top[:, 0] - top[:, -1]
        return Decision(picked, margins, tie_gap(logits.dtype, logits.float().amax(dim=-1), self.temperature))

    @staticmethod
    def _masked(scores: torch.Tensor, masked: list[list[int]], head) -> torch.Tensor:
        """``scores`` with each row's DECS-masked ids at -inf (a light head's columns; ids outside its shortlist
        dropped): one scatter over a table of a fixed width (a bucket), its padding aimed at a spare column."""
        columns = scores.shape[1]
        if head is not None:
            masked = [[head.columns[t] for t in m if t in head.columns] for m in masked]
        width = bucket(max(map(len, masked)), DECS_WIDTH)
        flat = [t for m in masked for t in padded(m, width, columns)]
        index = to_device(flat, scores.device).view(len(masked), width)
        spare = torch.nn.functional.pad(scores, (0, 1))  # the spare column, last
        return spare.scatter_(1, index, float("-inf"))[:, :columns]
