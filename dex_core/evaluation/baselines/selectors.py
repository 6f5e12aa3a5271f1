"""Adaptive depth selection, the baselines DEX argues against (paper §2.2, Fig. 3), exact on our stage runner.

A selector drafts each token from *one* non-final depth it chooses, and the final depth verifies. The model is
cut at candidate exits S = (s_1 < ... < s_m) into segments [0, s_1), [s_1, s_2), ..., [s_m, L), one ``Explorer``
each. A token that exits early leaves its deeper segments for later: they run batched with the next token's
pass through the same segment (AdaDecode's layer parallelism), so every segment's cache holds the chain's tokens
in order. When a token reaches the final depth, every pending draft does too, in the same batches: the final
tokens verify the drafts, the longest agreeing prefix plus the next final token is committed (greedy and
Gumbel-coupled sampling alike, as in ``baselines.self_spec_generate``), so the output is exactly AR's.

Two policies choose where a token exits:

- ``Confidence`` (AdaDecode-style): at each candidate exit the head's top probability; the first exit where it
  reaches ``threshold`` drafts the token, at most ``draft`` drafts in a row; threshold and draft length are
  tuned on the tune split (``dex bench``).
- ``Running`` (DEL-style): before each step, the exit E in S and the draft length n that maximise the expected
  tokens per unit of cost, from running acceptance rates: after every step the head at each candidate exit
  is scored on the committed tokens (the last ``window`` of them), which is counted as work, heads included.

Counted per run (``Counts``): each batched segment forward (its layers, once on the critical path, and its rows),
each head evaluation (full head, plus the exit's adapter), and per committed token the paper's Eq. (4) charge
W_sel: a kept draft costs its exit depth s_t, a token that replaced a failed draft L plus the exit depths of
the drafts it discarded, a token that went to the final depth undrafted L.
"""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass, field

import torch

from ...algorithm.sampling import Sampler
from ...config import DexError, GenerationOptions
from ...device import to_device
from ...model.cost import ModelCost
from ...model.explorer import Explorer
from ...model.view import model_view
from ...runtime.clock import Clock
from ...runtime.request import make_request, warn
from .speculation import speculation_result

THRESHOLDS = (0.2, 0.4, 0.6, 0.8)  # AdaDecode's grid in the paper (App. D)
CONFIDENCE_DRAFTS = (2, 4, 6, 8)
TUNE_TOKENS = 32  # new tokens per tune prompt in AdaDecode's grid (16 real runs each)


def uniform_exits(num_layers: int, count: int = 5) -> tuple[int, ...]:
    """``count`` candidate exits spaced evenly below the final depth (the paper's AdaDecode: 8, 16, ..., 40 of 48)."""
    count = max(1, min(count, num_layers - 1))
    return tuple(sorted({max(1, round((i + 1) * num_layers / (count + 1))) for i in range(count)}))


@dataclass
class Counts:
    """What a selector's run computed: segment forwards as (layers, rows), head evaluations as (rows, adapter
    used), and the Eq. (4) charge of each committed token."""

    forwards: list[tuple[int, int]] = field(default_factory=list)
    heads: list[tuple[int, bool]] = field(default_factory=list)
    w_sel: list[float] = field(default_factory=list)

    def layer_forwards(self) -> int:
        """Critical-path layer forwards: a batched segment forward counts its layers once."""
        return sum(layers for layers, _ in self.forwards)

    def cost(self, cost: ModelCost, view: str) -> float:
        """The run's total cost in layer-equivalents (``dex_core.model.cost``'s two views)."""
        rows = view == "rows"
        layers = sum(n * (r if rows else 1) for n, r in self.forwards)
        heads = sum((cost.head + (cost.adapter if a else 0.0)) * (r if rows else 1) for r, a in self.heads)
        return layers + heads


@dataclass
class Confidence:
    """AdaDecode-style: exit at the first candidate exit whose head's top probability reaches ``threshold``."""

    threshold: float
    draft: int
    name = "adadecode"

    def plan(self, exits) -> None:
        pass

    def looks(self, exit_index: int, drafted: int) -> bool:
        return drafted < self.draft

    def exits_here(self, logits: torch.Tensor) -> bool:
        return float(torch.softmax(logits.float(), dim=-1).max()) >= self.threshold

    def learn(self, hits: dict) -> None:
        pass


@dataclass
class Running:
    """DEL-style: per step the exit E and draft length n with the most expected tokens per unit of cost
    ((1 - a^(n+1)) / (1 - a) tokens for acceptance rate a at E, against one step's memory-bound cost with
    the statistics' heads), from each exit's acceptance over the last ``window`` committed tokens."""

    cost: ModelCost
    adapters: frozenset = frozenset()
    drafts: tuple[int, ...] = (1, 2, 3, 4, 6, 8)
    window: int = 64
    name = "del"
    choice: tuple[int, int] = (0, 0)  # (exit index, n) of the current step

    def __post_init__(self):
        self.seen: dict[int, deque] = {}

    def rate(self, j: int) -> float:
        hits = self.seen.get(j, ())
        return (sum(hits) + 1) / (len(hits) + 2)  # a uniform prior while little is seen

    def plan(self, exits) -> None:
        stats = len(exits) * self.cost.head  # the heads that score every exit after the step
        best, self.choice = (1.0 / (self.cost.ar() + stats)), (0, 0)
        for j, e in enumerate(exits):
            a = self.rate(j)
            for n in self.drafts:
                tokens = (1 - a ** (n + 1)) / (1 - a)
                spent = self.cost.self_spec_step(e, n, "memory", e in self.adapters) + stats
                if tokens / spent > best:
                    best, self.choice = tokens / spent, (j, n)

    def looks(self, exit_index: int, drafted: int) -> bool:
        return exit_index == self.choice[0] and drafted < self.choice[1]

    def exits_here(self, logits: torch.Tensor) -> bool:
        return True

    def learn(self, hits: dict) -> None:
        for j, row in hits.items():
            self.seen.setdefault(j, deque(maxlen=self.window)).extend(row)


class _Stack:
    """The model cut at ``exits`` into segments, one Explorer each (the exit's adapter on the segment below it)."""

    def __init__(self, view, exits, adapters: dict, sampler: Sampler, counts: Counts):
        bounds = (0, *exits, view.num_layers)
        m = len(bounds) - 1
        self.view, self.exits, self.sampler, self.counts = view, tuple(exits), sampler, counts
        self.segments = [
            Explorer(view, j, m, bounds[j], bounds[j + 1], adapters.get(bounds[j + 1])) for j in range(m)
        ]
        self.layers = [bounds[j + 1] - bounds[j] for j in range(m)]

    def prefill(self, prompt: list[int]) -> None:
        if len(prompt) > 1:
            h = self.view.embed(to_device(prompt[:-1], self.view.device))
            for segment in self.segments:
                h = segment.prefill(h)

    def propose(self, j: int, hidden: torch.Tensor) -> torch.Tensor:
        segment = self.segments[j]
        self.counts.heads.append((hidden.shape[0], segment.adapter is not None))
        return segment.propose(hidden)

    def _run(self, j: int, at: list, upto: int, position: int) -> torch.Tensor:
        """Segment ``j`` over every input up to ``upto`` still waiting before it (deferred drafts first)."""
        members = [k for k in range(upto + 1) if at[k][0] == j]
        out = self.segments[j].expand(
            torch.cat([at[k][1] for k in members]),
            members,
            [position - 1 + k for k in members],
            [tuple(range(k + 1)) for k in members],
        )
        self.counts.forwards.append((self.layers[j], len(members)))
        for r, k in enumerate(members):
            at[k] = (j + 1, out[r : r + 1], at[k][2] + [out[r : r + 1]])
        return out

    def step(self, last: int, position: int, policy) -> tuple[list[int], list[int], list, list[int]]:
        """Inputs from ``last`` (at ``position`` - 1) until one reaches the final depth: (drafts, final tokens
        at ``position``.., each input's hidden states at the exits, the exit depth of each draft)."""
        embed = self.view.embed
        at = [(0, embed(to_device([last], self.view.device)), [])]  # per input: next segment, hidden, exits'
        drafts: list[int] = []
        depths: list[int] = []
        i = 0
        while True:
            j, exited = at[i][0], False
            while j < len(self.segments) and not exited:
                out = self._run(j, at, i, position)
                j += 1
                if j < len(self.segments) and policy.looks(j - 1, len(drafts)):
                    logits = self.propose(j - 1, out[-1:])
                    exited = policy.exits_here(logits[0])
                    if exited:
                        drafts.append(int(self.sampler.choose(logits, [position + i], final=False)[0]))
                        depths.append(self.exits[j - 1])
            if not exited:  # input i reached the final depth, and every earlier input with it
                final = self.propose(len(self.segments) - 1, out)
                verified = self.sampler.choose(final, [position + k for k in range(i + 1)], final=True)
                return drafts, verified.tolist(), [a[2][:-1] for a in at], depths
            at.append((0, embed(to_device([drafts[-1]], self.view.device)), []))
            i += 1

    def keep(self, accepted: int) -> None:
        for segment in self.segments:
            segment.cache.retain(list(range(accepted + 1)), promote=accepted + 1)


def _exit_hits(stack: _Stack, hidden: list, verified: list[int], position: int) -> dict:
    """For each candidate exit, whether its head proposes each committed token (one batched head per exit)."""
    hits = {}
    for j in range(len(stack.exits)):
        rows = torch.cat([h[j] for h in hidden])
        chosen = stack.sampler.choose(
            stack.propose(j, rows), [position + k for k in range(len(hidden))], False
        )
        hits[j] = [int(a) == b for a, b in zip(chosen.tolist(), verified, strict=True)]
    return hits


@torch.no_grad()
def select_generate(
    model,
    input_ids,
    max_new_tokens: int,
    policy,
    exits=None,
    adapters: dict | None = None,
    *,
    options: GenerationOptions | None = None,
    **overrides,
) -> dict:
    """Decode with depth-selection ``policy`` (``Confidence`` or ``Running``) over candidate ``exits`` (default
    ``uniform_exits``); returns ``{"tokens", "steps", "accepted", "layer_forwards", "counts", "seconds",
    "stats"}``. ``overrides`` are ``GenerationOptions`` fields."""
    view = model_view(model)
    L = view.num_layers
    exits = tuple(exits or uniform_exits(L))
    if not exits or list(exits) != sorted(set(exits)) or not 1 <= exits[0] <= exits[-1] < L:
        raise DexError(f"candidate exits must be distinct depths in 1..{L - 1}; got {list(exits)}")
    request = warn(
        make_request(
            view, input_ids, GenerationOptions.build(options, max_new_tokens=max_new_tokens, **overrides)
        )
    )
    prompt, eos, o = list(request.prompt), request.eos, request.options
    sampler = Sampler(view.vocab, o.temperature, o.top_k, o.top_p, o.seed)
    counts, clock = Counts(), Clock(view.device)
    stack = _Stack(view, exits, adapters or {}, sampler, counts)
    start = clock.stamp()
    stack.prefill(prompt)
    tokens: list[int] = []
    steps = accepted = 0
    last = prompt[-1]
    while len(tokens) < max_new_tokens and not (tokens and tokens[-1] in eos):
        position = len(prompt) + len(tokens)
        policy.plan(exits)
        drafts, verified, hidden, depths = stack.step(last, position, policy)
        keep = 0
        while keep < len(drafts) and drafts[keep] == verified[keep]:
            keep += 1
        if isinstance(policy, Running):
            policy.learn(_exit_hits(stack, hidden[: keep + 1], verified[: keep + 1], position))
        stack.keep(keep)
        before = len(tokens)
        for t in verified[: keep + 1]:
            if len(tokens) < max_new_tokens and not (tokens and tokens[-1] in eos):
                tokens.append(t)
        # Eq. (4): a kept draft costs its exit; the final depth's token L plus the failed draft's and its
        # descendants' exits (none when every draft held); tokens past the length or EOS are not charged
        counts.w_sel.extend([*depths[:keep], L + sum(depths[keep:])][: len(tokens) - before])
        sampler.forget_before(position + keep + 1)
        last, steps = verified[keep], steps + 1
        accepted += len(tokens) - before - 1
    result = speculation_result(
        tokens, eos, [*exits, L], (steps, accepted, counts.layer_forwards()), clock.since(start)
    )
    return {**result, "counts": counts}


def tune_confidence(model, prompts, max_new_tokens: int, exits, adapters: dict, log=None) -> dict:
    """AdaDecode's threshold and draft length, as the paper tunes them: the grid ``THRESHOLDS`` x
    ``CONFIDENCE_DRAFTS`` run on the tune prompts (at most ``TUNE_TOKENS`` new tokens each), the lowest
    memory-bound cost per token (heads included); ``log`` gets a line per grid point."""
    cost, grid, max_new_tokens = ModelCost.of(model, adapters), [], min(max_new_tokens, TUNE_TOKENS)
    for i, (threshold, draft) in enumerate(itertools.product(THRESHOLDS, CONFIDENCE_DRAFTS)):
        if log:
            log(
                f"  adadecode grid point {i + 1}/{len(THRESHOLDS) * len(CONFIDENCE_DRAFTS)}: {threshold}, {draft}"
            )
        outs = [
            select_generate(model, p, max_new_tokens, Confidence(threshold, draft), exits, adapters)
            for p in prompts
        ]
        spent = sum(o["counts"].cost(cost, "memory") for o in outs)
        grid.append(
            {
                "threshold": threshold,
                "draft": draft,
                "cost_per_token": spent / sum(len(o["tokens"]) for o in outs),
            }
        )
    best = min(grid, key=lambda g: (g["cost_per_token"], g["threshold"], g["draft"]))
    return {
        "threshold": best["threshold"],
        "draft": best["draft"],
        "exits": list(exits),
        "tune_cost_per_token": best["cost_per_token"],
        "grid": grid,
    }


def selector_row(outs: list, cost: ModelCost, tokens: int) -> dict:
    """A selector's fields of a ``dex bench`` results row, from its runs' counts (``tokens`` committed in all)."""
    counts = [o[1]["counts"] for o in outs]
    return dict(
        steps_per_token=sum(o[1]["steps"] for o in outs) / tokens,
        layer_forwards_per_token=sum(c.layer_forwards() for c in counts) / tokens,
        cost_per_token=sum(c.cost(cost, "memory") for c in counts) / tokens,
        cost_per_token_rows=sum(c.cost(cost, "rows") for c in counts) / tokens,
        w_sel_per_token=sum(sum(c.w_sel) for c in counts) / tokens,
    )
