"""Terminal output shared by ``dex generate`` and the torchrun entry point: streamed text and the run report."""

from __future__ import annotations

import sys

from .results import matched_histogram


class TextStream:
    """Prints the text of a growing token list as it grows, in O(1) decoding work per token.

    Each push decodes only a short window: the tokens printed last (for context: a tokenizer may drop
    the leading space of a window's first token) and those not printed yet. The new text is the
    window's decode minus its printed part's; it is held back while it ends in an incomplete UTF-8
    character (a character split over several tokens), so the printed text is the full decode.
    """

    def __init__(self, tokenizer, out=None):
        self.tokenizer, self.out = tokenizer, out or sys.stdout
        self.window: list[int] = []  # the tokens printed last, then those not printed yet
        self.printed = 0  # how many of ``window`` are printed

    def _decode(self, tokens: list[int]) -> str:
        return self.tokenizer.decode(tokens, skip_special_tokens=True)

    def push(self, token: int) -> None:
        self.window.append(token)
        shown, text = self._decode(self.window[: self.printed]), self._decode(self.window)
        if len(text) <= len(shown) or text.endswith("\ufffd"):
            return
        self.out.write(text[len(shown) :])
        self.out.flush()
        self.window = self.window[self.printed :]
        self.printed = len(self.window)

    def finish(self) -> None:
        """Print what is still held back (a run that ended inside a character shows its replacement mark)."""
        shown, text = self._decode(self.window[: self.printed]), self._decode(self.window)
        if len(text) > len(shown):
            self.out.write(text[len(shown) :])
            self.out.flush()
        self.window, self.printed = [], 0


def print_report(stats: dict, start: dict, elapsed: float, schedule: str) -> None:
    """Rounds/token, depth-side speedup, matched-stage histogram and tokens/s of one run (``start``: the
    trace's start event: depths and how they were chosen, DECS, adapters, proposal heads)."""
    depths = start["depths"]
    hist = matched_histogram(stats["matched_stages"], len(depths))
    print("\n")
    print(
        f"depths {list(depths)} (K={len(depths)}; {start.get('depth_choice', 'given')}), "
        f"decs={'on' if start['decs'] else 'off'}, adapters at {start.get('adapter_depths') or 'none'}, "
        f"non-final proposal heads of {start.get('proposal_vocab')} rows"
    )
    print(f"{stats['tokens']} tokens in {stats['rounds']} rounds, stop: {stats['stop']}")
    print(
        f"rounds/token {stats['rounds_per_token']:.3f}   depth-side speedup K/(rounds/token) "
        f"{stats['depth_speedup']:.3f}x"
    )
    print("matched stage: " + "  ".join(f"{k}@{d}: {c}" for k, (d, c) in enumerate(zip(depths, hist))))
    if schedule == "sequential":
        print(
            f"sequential schedule: {stats['tokens'] / elapsed:.1f} tokens/s measured on one device; "
            f"projected K-device time {stats['projected_seconds']:.2f} s vs measured {elapsed:.2f} s"
        )
    else:
        print(
            f"distributed schedule: {stats['tokens'] / elapsed:.1f} tokens/s measured end to end "
            f"({elapsed:.2f} s; communication {stats['communication_seconds']:.2f} s on rank 0)"
        )
