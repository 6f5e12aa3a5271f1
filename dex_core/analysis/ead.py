"""Earliest available depth (EAD, paper §2), what it predicts for DEX, and the best exploration set.

For each generated token y_t and each layer l, layer l ranks the vocabulary by LM head(final norm(
adapter_l(h_l))) — the logit lens, through an inducing adapter where one is given. Its top candidate
defines Omega(t, l) = [candidate == y_t], with Omega(t, L) = 1.

    EAD(t)        = min { l : Omega(t, l) }
    EAD_stab(t)   = min { l : Omega(t, n) for all n >= l }
    S_X           = L T / sum_t ceil_X(EAD_stab(t))          (paper Prop. 7; oracle S_EAD: X = [L])

DEX reuses the shallowest explored stage whose candidate equals the committed token, stable or not:
each stage's top token, or with DECS (paper App. C.1) its best token not proposed by stages 0..k-1 of
the slot chain. Replaying that rule on the rankings gives the stage each token is matched at, as a DEX
run records it (tests/analysis/test_ead.py). The first token takes K rounds, token t + 1 then 1 + (stage token
t matched at) more: R(X), rounds per token, over T tokens; the depth-side speedup is K / R(X).

On a pipeline a round lasts as long as the longest stage: R(X) * max_k (d_k - d_{k-1}) layer-times per
token, against L for AR. Counting all the work (``dex_core.model.cost``, memory-bound; ``ModelCost.dex_steady``)
with c_k(1) stage k's layers, proposal head (light at non-final stages with a shortlist, whose misses the
rankings then include) and adapter: max(c_final, M) + (R(X) - 1) M per token, M = max_{k<K-1} c_k(1), as
every non-final explorer may work in every round but the final one holds the commit position's row only,
once per token. ``best_sets`` finds, for each K, the cheapest set of K stages that is not slower
depth-side than the previous K's (``analyse(best=True)``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..config import (
    ADAPTER_CHOICES,
    ANALYSED_KS,
    DEFAULT_PROPOSAL_VOCAB,
    DEVICE_HELP,
    DexConfig,
    DexError,
    GenerationOptions,
    adapter_file,
    option,
    parse_device,
    parse_ints,
    parse_list,
    resolve_depths,
    rows_option,
)
from ..data.ranking import token_ranking
from ..data.sets import PROMPT_SETS, prompt_set
from ..log import stderr
from ..model.adapter_choice import resolve_adapters, stored_sets
from ..model.cost import ModelCost
from ..model.lens import layer_candidates
from ..model.load import load_model
from ..model.proposal import adapter_ranking, proposal_rows
from ..runtime.reference import hf_greedy
from ..runtime.request import encode_item
from .best_sets import ORDER_TOLERANCE, ordered_best


def matches(candidates: torch.Tensor, tokens) -> torch.Tensor:
    """Omega (T, L) bool from rankings (T, L, C) and the committed tokens; the final layer always matches."""
    omega = candidates[:, :, 0] == torch.as_tensor(tokens, device=candidates.device)[:, None]
    omega[:, -1] = True
    return omega


def layer_matches(model, prompt: list[int], tokens: list[int], adapters=None) -> torch.Tensor:
    """Omega as a bool tensor (T, L): does layer l's candidate for position t equal tokens[t]?"""
    return matches(layer_candidates(model, prompt, tokens, adapters, top=1), tokens)


def matched_stages(candidates: torch.Tensor, tokens, depths, decs: bool = True) -> torch.Tensor:
    """The stage (0..K-1) DEX matches each token at for exploration set ``depths``: long tensor (T,)."""
    device = candidates.device
    tokens = torch.as_tensor(tokens, device=device)
    T, K = len(tokens), len(depths)
    if decs and K - 1 > candidates.shape[2]:
        raise DexError(
            f"DECS with K={K} needs {K - 1} ranked candidates per layer; have {candidates.shape[2]}"
        )
    matched = torch.full((T,), K - 1, dtype=torch.long, device=device)
    open_ = torch.ones(T, dtype=torch.bool, device=device)
    proposed = torch.empty(T, 0, dtype=torch.long, device=device)
    for k, d in enumerate(depths[:-1]):
        ranked = candidates[:, d - 1]  # (T, C)
        if decs:  # best candidate not yet proposed in this slot chain
            fresh = ~(ranked[:, :, None] == proposed[:, None, :]).any(-1)
            pick = ranked.gather(1, fresh.float().argmax(1, keepdim=True))[:, 0]
            proposed = torch.cat([proposed, pick[:, None]], dim=1)
        else:
            pick = ranked[:, 0]
        hit = open_ & (pick == tokens)
        matched[hit] = k
        open_ &= ~hit
    return matched


def longest_stage(depths) -> int:
    return max(b - a for a, b in zip((0,) + tuple(depths[:-1]), depths))


def rounds_per_token(matched: torch.Tensor, K: int, lengths=None) -> float:
    """DEX's rounds per token for matched stages (T,) of generations of ``lengths`` tokens (default: one)."""
    lengths = [len(matched)] if lengths is None else list(lengths)
    if sum(lengths) != len(matched):
        raise DexError(f"generation lengths {lengths} do not add up to {len(matched)} tokens")
    rounds, start = 0, 0
    for n in lengths:
        if n:
            rounds += K + int((matched[start : start + n - 1] + 1).sum())
        start += n
    return rounds / max(1, len(matched))


def set_cost(
    candidates: torch.Tensor, tokens, depths, decs: bool = True, lengths=None, cost=None, adapter_depths=()
) -> dict:
    """Rounds per token, depth-side speedup and pipeline cost (layer-times per token) of one set; with
    ``cost`` (a ``ModelCost``) also the cost per token in layer-equivalents, heads included."""
    depths = tuple(int(d) for d in depths)
    matched = matched_stages(candidates, tokens, depths, decs)
    rounds = rounds_per_token(matched, len(depths), lengths)
    longest = longest_stage(depths)
    out = {
        "depths": list(depths),
        "rounds_per_token": rounds,
        "depth_speedup": len(depths) / rounds,
        "longest_stage": longest,
        "layer_times_per_token": rounds * longest,
        "pipeline_speedup": depths[-1] / (rounds * longest),
        "matched": torch.bincount(matched, minlength=len(depths)).tolist(),
    }
    if cost is not None:
        out["cost_per_token"] = cost.dex_steady(depths, rounds, adapter_depths)
        out["cost_share_of_ar"] = out["cost_per_token"] / cost.ar()
    return out


def scorer(candidates: torch.Tensor, tokens, decs: bool = True, lengths=None, cost=None, adapter_depths=()):
    """``set_cost`` of a set on these rankings (what ``best_sets`` searches with), and the key it minimises."""

    def score(depths) -> dict:
        return set_cost(candidates, tokens, depths, decs, lengths, cost, adapter_depths)

    return score, ("layer_times_per_token" if cost is None else "cost_per_token")


def analyse(
    candidates: torch.Tensor,
    tokens,
    explorers=ANALYSED_KS,
    decs: bool = True,
    best: bool = False,
    lengths=None,
    cost=None,
    adapter_depths=(),
    within=None,
    stored=None,
    tolerance: float = ORDER_TOLERANCE,
) -> dict:
    """EADs, predicted speedups for the uniform split of each K (paper S_X, and DEX's K / rounds per
    token without and with DECS), the oracle S_EAD; with ``best`` the best set of each K (``best_sets``:
    the cheapest, at least the previous K's depth-side speedup minus ``tolerance``); with ``stored``
    (``{K: depths}``, an adapter file's sets) those sets too. ``lengths``: the token counts of the
    generations pooled in ``candidates`` (default: one)."""
    omega = matches(candidates, tokens)
    T, L = omega.shape
    layers = torch.arange(1, L + 1, device=omega.device)
    ead = torch.where(omega, layers, L + 1).min(dim=1).values  # (T,)
    ead_stable = torch.where(~omega, layers, 0).max(dim=1).values + 1  # the first layer after the last miss
    score, key = scorer(candidates, tokens, decs, lengths, cost, adapter_depths)
    ks = [K for K in explorers if K <= L]
    chosen = ordered_best(score, L, ks, key, within, tolerance) if best else {}
    predicted = []
    for K in ks:
        depths = resolve_depths(L, explorers=K)
        bounds = torch.tensor(depths, device=omega.device)
        ceil = bounds[torch.searchsorted(bounds, ead_stable)]
        uniform = score(depths)
        no_decs = set_cost(candidates, tokens, depths, False, lengths) if decs else uniform
        row = {
            "explorers": K,
            "depths": list(depths),
            "speedup": L * T / int(ceil.sum()),
            "rounds_speedup_no_decs": K / no_decs["rounds_per_token"],
            "decs": decs,
            "uniform": uniform,
        }
        if K in chosen:
            row["best"], row["best_gain"] = chosen[K], uniform[key] / chosen[K][key]
        if stored and K in stored:
            row["stored"] = score(tuple(stored[K]))
        predicted.append(row)
    return {
        "num_layers": L,
        "tokens": T,
        "ead": ead.tolist(),
        "ead_stable": ead_stable.tolist(),
        "predicted": predicted,
        "oracle": L * T / int(ead_stable.sum()),
    }


def readiness(
    model,
    prompt: list[int],
    tokens: list[int],
    adapters=None,
    explorers=ANALYSED_KS,
    decs: bool = True,
    best: bool = False,
    cost=None,
) -> dict:
    """``analyse(layer_candidates(...))``: the JSON-ready EAD analysis of one generation (with ``cost``,
    a ``ModelCost``, cost per token and best sets by it)."""
    return analyse(
        layer_candidates(model, prompt, tokens, adapters),
        tokens,
        explorers,
        decs,
        best,
        cost=cost,
        adapter_depths=sorted(adapters or {}),
    )


@dataclass
class EadConfig:
    """``dex ead``: readiness of greedy answers to prompt sets, under one or more adapter choices."""

    model: str = option("default", "model spec, as for dex generate")
    device: str = option(DexConfig.device, DEVICE_HELP)
    adapters: tuple[str, ...] = option(
        ("auto",),
        "adapter choices to compare on the same answers, comma-separated: auto, default, none or files",
    )
    sets: tuple[str, ...] = option(("humaneval", "chat"), "prompt sets: " + ", ".join(PROMPT_SETS))
    prompts: int = option(20, "prompts per set")
    split: str = option(
        "eval", "the sets' split: eval (held out, the acceptance's) or tune (to choose sets on)"
    )
    max_new_tokens: int = option(GenerationOptions.max_new_tokens, "new tokens per prompt (greedy)")
    explorers: tuple[int, ...] = option(ANALYSED_KS, "values of K")
    decs: bool = option(True, "predict with depth-coupled sampling")
    best: bool = option(True, "search the best exploration set per K")
    best_within_adapters: bool = option(False, "search only sets whose non-final depths carry adapters")
    order_tolerance: float = option(
        ORDER_TOLERANCE,
        "each K's best set keeps at least the previous K's depth-side speedup minus this (negative: no floor)",
    )
    proposal_vocab: str = option(
        "auto",
        f"rows of the non-final light proposal heads: N, full or auto ({DEFAULT_PROPOSAL_VOCAB} "
        "with a token ranking: the adapter file's, else from the training text)",
    )

    def __post_init__(self):
        self.device = parse_device(self.device)
        self.adapters = parse_list(self.adapters, "adapters") or ("none",)
        for name in self.adapters:
            if name not in ADAPTER_CHOICES:
                adapter_file(name)  # a missing file fails before the model loads
        self.sets = parse_list(self.sets, "sets")
        bad = [s for s in self.sets if s not in PROMPT_SETS]
        if bad or not self.sets:
            raise DexError(f"unknown prompt set(s) {bad}; choose from {', '.join(PROMPT_SETS)}")
        self.explorers = parse_ints(self.explorers, "explorers")
        self.proposal_vocab = rows_option(self.proposal_vocab)
        if self.split not in ("eval", "tune"):
            raise DexError(f"split must be eval or tune; got {self.split!r}")
        if self.prompts < 1 or self.max_new_tokens < 1:
            raise DexError("prompts and max_new_tokens must be positive")


def run_ead(cfg: EadConfig, log=stderr) -> dict:
    """Greedy answers, generated once, analysed under every adapter choice, per set and pooled; costs
    per token from ``dex_core.model.cost`` with the light proposal heads of ``proposal_vocab`` rows."""
    prompts = {name: prompt_set(name, cfg.prompts, cfg.split) for name in cfg.sets}
    model, tokenizer = load_model(cfg.model, device=cfg.device)
    if max(cfg.explorers) > model.config.num_hidden_layers:
        raise DexError(
            f"K = {max(cfg.explorers)} exceeds the model's {model.config.num_hidden_layers} layers"
        )
    chosen = {name: resolve_adapters(name, model) for name in cfg.adapters}
    answers = {}
    for name, items in prompts.items():
        answers[name] = []
        for i, item in enumerate(items):
            ids = encode_item(tokenizer, item)
            answers[name].append((ids, hf_greedy(model, ids, cfg.max_new_tokens)))
            log(f"{name} {i + 1}/{len(items)}: {len(answers[name][-1][1])} tokens")
    report = {
        "model": cfg.model,
        "split": cfg.split,
        "max_new_tokens": cfg.max_new_tokens,
        "decs": cfg.decs,
        "order_tolerance": cfg.order_tolerance,
        "runs": [],
    }
    for adapter_name, adapters in chosen.items():
        report["runs"].append(_adapter_run(cfg, model, tokenizer, adapter_name, adapters, answers, log))
    return report


def _adapter_run(cfg: EadConfig, model, tokenizer, adapter_name: str, adapters, answers: dict, log) -> dict:
    """One adapter choice's analysis of the answers: per prompt set and pooled."""
    vocab = model.lm_head.out_features
    rows = proposal_rows(cfg.proposal_vocab, vocab)
    ranking = adapter_ranking(adapter_name, model) if rows < vocab else None
    shortlist = (
        None
        if rows >= vocab
        else (ranking if ranking is not None else token_ranking(tokenizer, vocab))[:rows]
    )
    cost, depths = ModelCost.of(model, adapters, rows), sorted(adapters)
    within = depths if cfg.best_within_adapters and depths else None
    run = {"adapters": adapter_name, "adapter_depths": depths, "proposal_vocab": rows, "sets": {}}
    stored = stored_sets(adapter_name, model)
    if stored:
        run["stored_sets"] = {K: list(v) for K, v in sorted(stored.items())}
    more = (cost, depths, within)
    extra = {"stored": stored, "tolerance": cfg.order_tolerance}
    pooled = ([], [], [])
    for name, pairs in answers.items():
        log(f"adapters {adapter_name}: every depth's candidates on the {len(pairs)} {name} answers")
        cands = [layer_candidates(model, ids, out, adapters, shortlist=shortlist) for ids, out in pairs]
        toks = [t for _, out in pairs for t in out]
        lengths = [len(out) for _, out in pairs]
        run["sets"][name] = analyse(
            torch.cat(cands), toks, cfg.explorers, cfg.decs, cfg.best, lengths, *more, **extra
        )
        for acc, part in zip(pooled, (cands, toks, lengths)):
            acc.extend(part)
    cands, toks, lengths = pooled
    run["all"] = analyse(torch.cat(cands), toks, cfg.explorers, cfg.decs, cfg.best, lengths, *more, **extra)
    return run


def ead_summary(report: dict) -> list[str]:
    """A few lines per adapter choice and set: oracle, K/rounds per K, best set against uniform."""
    lines = []
    for run in report["runs"]:
        for name, result in {**run["sets"], "all": run["all"]}.items():
            lines.append(
                f"adapters {run['adapters']} / {name}: {result['tokens']} tokens, oracle S_EAD "
                f"{result['oracle']:.3f}x"
            )
            for p in result["predicted"]:
                line = (
                    f"  K={p['explorers']} uniform {p['depths']}: K/rounds {p['uniform']['depth_speedup']:.3f}x "
                    f"(no DECS {p['rounds_speedup_no_decs']:.3f}x), S_X {p['speedup']:.3f}x"
                )
                if "cost_per_token" in p["uniform"]:
                    u = p["uniform"]
                    line += f"; cost {u['cost_per_token']:.2f} LE/token ({u['cost_share_of_ar']:.3f} of AR's)"
                if "best" in p and "cost_per_token" in p["best"]:
                    line += (
                        f"; best {p['best']['depths']}: K/rounds {p['best']['depth_speedup']:.3f}x, "
                        f"{p['best']['cost_per_token']:.2f} LE/token "
                        f"({p['best']['cost_share_of_ar']:.3f} of AR's, {p['best_gain']:.3f}x uniform)"
                    )
                elif "best" in p:
                    line += (
                        f"; best {p['best']['depths']}: pipeline {p['best']['pipeline_speedup']:.3f}x vs "
                        f"uniform {p['uniform']['pipeline_speedup']:.3f}x ({p['best_gain']:.3f}x)"
                    )
                if "stored" in p:
                    line += (
                        f"; the file's {p['stored']['depths']}: K/rounds {p['stored']['depth_speedup']:.3f}x"
                    )
                lines.append(line)
    return lines
