"""Terminal output shared by ``dex generate`` and the torchrun entry point: streamed text and the run report; tables
that fit a terminal's width (``dex bench``)."""

from __future__ import annotations

import sys

from ..trace.events import StartEvent
from ..trace.stats import GenerationStats, matched_histogram


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


def print_report(stats: GenerationStats, start: StartEvent, elapsed: float, schedule: str) -> None:
    """The run report below the text (``stats``: the end event's; ``start``: the trace's start event): whose answer
    it is, the exploration set, rounds against AR through the same stages, tokens/s on this machine."""
    depths = start.depths
    hist = matched_histogram(stats.matched_stages, len(depths))
    print("\n")
    print(whose_answer(start))
    print(
        f"depths {list(depths)} (K={len(depths)}; {start.depth_choice or 'given'}), "
        f"decs={'on' if start.decs else 'off'}, adapters at {start.adapter_depths or 'none'}, "
        f"non-final proposal heads of {start.proposal_vocab} rows"
    )
    print(f"{stats.tokens} tokens in {stats.rounds} rounds, stop: {stats.stop}")
    print("matched stage: " + "  ".join(f"{k}@{d}: {c}" for k, (d, c) in enumerate(zip(depths, hist))))
    print(rounds_line(stats, len(depths)))
    print("\n".join(speed_lines(stats, len(depths), elapsed, schedule)))


def whose_answer(start: StartEvent) -> str:
    """One line: the text is the model's own answer, what AR decoding gives (per sampling and dtype)."""
    sampled = bool(start.sampling.get("temperature"))
    how = "AR sampling with the same seed" if sampled else "greedy AR decoding"
    dtype = start.dtype
    ties = f", up to {dtype}'s near-ties (dex verify certifies)" if dtype in ("bfloat16", "float16") else ""
    return (
        f"answer: the model's own, token for token what {how} gives{ties}; a weak answer is the model's, "
        "not DEX's"
    )


def rounds_line(stats: GenerationStats, K: int) -> str:
    """Rounds per token against AR through the same K stages (K rounds per token): the depth-side speedup."""
    ratio = stats.depth_speedup
    than = f"{ratio:.2f}× fewer" if ratio >= 1 else f"{1 / ratio:.2f}× more" if ratio else "none"
    return (
        f"rounds: {than} than AR through the same {K} stages ({stats.rounds_per_token:.3f} per token vs "
        f"{K}; the depth-side speedup)"
    )


def speed_lines(stats: GenerationStats, K: int, elapsed: float, schedule: str) -> list[str]:
    """Model tokens/s on this machine (the run's own seconds: ``GenerationStats.tokens_per_second``), end to end
    too where printing the text took time (``elapsed``: the caller's clock around the run), and what the schedule
    means for it; AR's, or where to get it."""
    rate = stats.tokens_per_second
    whole = stats.tokens / elapsed if elapsed > 0 else 0.0
    end_to_end = (
        f"; end-to-end tokens/s, printing included: {whole:.1f}" if whole and whole < 0.99 * rate else ""
    )
    if schedule == "sequential":
        projected = stats.projected_seconds
        on_k = (
            f"; projected tokens/s on {K} devices: {stats.tokens / projected:.1f}, a projection"
            if projected > 0
            else ""
        )
        line = (
            f"model tokens/s on this machine: {rate:.1f} (sequential schedule: one device runs the {K} stages in "
            f"turn){end_to_end}{on_k}"
        )
    else:
        line = (
            f"model tokens/s on this machine: {rate:.1f} (distributed schedule: {K} explorer processes; "
            f"{stats.communication_seconds:.2f} s of {stats.model_seconds:.2f} s waiting on the others){end_to_end}"
        )
    return [line, "AR's tokens/s: not measured in this run (dex bench measures DEX and AR side by side)"]


def aligned(cells: list[list[str]], width: int, fit: int) -> list[str]:
    """Rows of cells (the header first) as aligned columns two spaces apart, those up to column ``fit`` to the
    left and the rest (numbers) to the right; column ``fit`` takes the width the others leave of ``width``,
    longer cells cut with '…'. No line is longer than ``width`` unless the other columns alone are."""
    widths = [max(len(row[i]) for row in cells) for i in range(len(cells[0]))]
    spare = width - 2 * (len(widths) - 1) - sum(widths) + widths[fit]
    widths[fit] = max(len(cells[0][fit]), min(widths[fit], spare))
    return [
        "  ".join(
            (c if len(c) <= w else c[: w - 1] + "…").ljust(w) if i <= fit else c.rjust(w)
            for i, (c, w) in enumerate(zip(row, widths))
        ).rstrip()
        for row in cells
    ]
