"""Prompt lookup for draft chains: an n-gram index of the context (prompt + committed tokens).

A branch's text (the committed context, then the inputs of the branch's uncommitted slots) that ends with
an n-gram seen earlier in the context is drafted to continue the way it continued there. No draft model:
the index maps every n-gram (1 <= n <= ``ngram``) to the end of its first occurrence that has a following
token, so the context's own suffix never matches itself. ``find`` prefers the longest match. The first
occurrence, as HF's prompt lookup takes it: in input-grounded text it is the source the answer copies; a
later one is often the answer's own earlier wording (grounded set, 3 prompts x 64 tokens, K=2: 0.609 rounds
per token with the latest, 0.551 with the first; ``benchmarks/draft_chains.py``).
Bounds and their defaults: ``dex_core.config.DraftBounds``.
"""

from __future__ import annotations


class PromptLookup:
    def __init__(self, tokens: list[int], ngram: int):
        self.n = ngram
        self.tokens: list[int] = []
        self.ends: dict[tuple[int, ...], int] = {}  # n-gram -> index of the token that first followed it
        for t in tokens:
            self.extend(t)

    def extend(self, token: int) -> None:
        """Append a committed token: the n-grams ending just before it now have a continuation."""
        end = len(self.tokens)
        for n in range(1, min(self.n, end) + 1):
            self.ends.setdefault(tuple(self.tokens[end - n : end]), end)
        self.tokens.append(int(token))

    def find(self, suffix: list[int], min_ngram: int, length: int) -> tuple[int, list[int]]:
        """The longest n-gram (``min_ngram`` <= n <= ``ngram``) ending ``suffix`` that occurred before, and up
        to ``length`` tokens that followed it: ``(n, draft)``, or ``(0, [])`` without a match."""
        for n in range(min(self.n, len(suffix)), min_ngram - 1, -1):
            end = self.ends.get(tuple(suffix[len(suffix) - n :]))
            if end is not None:
                return n, self.tokens[end : end + length]
        return 0, []

    def draft(self, branch: list[int], room: int, min_ngram: int) -> list[int]:
        """At most ``room`` tokens drafted after the context followed by ``branch`` (a branch's uncommitted inputs)."""
        text = (self.tokens[-self.n :] + branch[-self.n :])[-self.n :]
        return self.find(text, min_ngram, room)[1] if room > 0 else []
