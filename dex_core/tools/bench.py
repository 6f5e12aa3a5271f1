"""``dex bench``: DEX against autoregressive decoding, depth-selection and token-axis baselines, side by side.

Methods (every output compared token by token with HF ``generate``, greedy):

- ``ar-hf``: HF ``generate``; ``ar-stages``: AR through our own stage runner (DEX with K = 1), which
  isolates implementation overhead;
- ``dex``: the sequential schedule for each K (the exploration set DexDecoder picks: the adapter file's
  best set for K, else uniform; light proposal heads per ``--proposal-vocab``; adapters / DECS as
  chosen), with rounds per token, the depth-side speedup next to ``dex ead``'s prediction, measured
  one-device tokens/s and the projected K-device tokens/s (communication from the machine's profile,
  ``dex_core.tools.profile``); ``dex-distributed``: the distributed schedule's measured wall clock;
- ``self-spec``: LayerSkip-style self-speculation on our stage runner with the same adapters, exit
  depth E and draft length n grid-searched on the tune split (paper App. D), by the critical path;
- ``hf-early-exit``: HF's ``assistant_early_exit`` (plain logit lens), tuned the same way;
- ``hf-prompt-lookup``: HF's prompt lookup (``--prompt-lookup-num-tokens`` drafts copied from the text so far,
  verified in one forward), with its forwards (steps) and rows per token counted.

Metrics: ``identical`` (prompts whose tokens equal HF greedy's) and ``certified`` (tokens that one
teacher-forced forward of the unmodified model confirms as its choice or a near-tie, ``dex_core.tools.verify``;
``certified_worst_gap`` the largest gap to the top); tokens/s after one warm-up per method (new tokens /
total time; ``measured`` or ``projected`` says which); the hardware-neutral critical path in layer forwards per token — AR: L;
DEX: (matched stage + 1) rounds times the longest stage, summed over tokens (one batched forward
counts once, explorers working in the same round count once); self-speculation: n * E + L per
draft-verify step over the tokens committed; prompt lookup: L per forward; and the cost per token of
``dex_core.model.cost`` (heads and adapters included, both views; prompt lookup: AR's per forward, or per row). The EAD oracle (mean stable EAD) is a reference line.
"""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass

import torch

from .bench_report import headline, result_row
from ..model.cost import ModelCost
from ..config import (ADAPTER_CHOICES, DEVICE_HELP, DecoderOptions, DexConfig, DexError, adapter_file, GenerationOptions, option, parse_depths, parse_device, parse_ints, parse_list, resolve_depths, rows_option)
from ..data.sets import PROMPT_SETS, check_sets, prompt_set
from ..runtime.clock import Clock
from ..runtime.reference import hf_greedy
from .verify import Certificate, certify_tokens
from ..runtime.request import encode_item

METHODS = ("ar-hf", "ar-stages", "dex", "dex-distributed", "self-spec", "hf-early-exit", "hf-prompt-lookup")
DRAFTS = (1, 2, 3, 4, 6, 8)
QUICK = {"sets": ("synthetic",), "prompts": 3, "tune_prompts": 2, "max_new_tokens": 16, "explorers": (2, 3),
         "profile": False}


@dataclass
class BenchConfig:
    model: str = option("default", "model spec, as for dex generate")
    device: str = option(DexConfig.device, DEVICE_HELP + "; every method runs there (dex-distributed: one "
                                           "device per explorer, cpu ones when this is cpu)")
    sets: tuple[str, ...] = option(("humaneval", "chat"), "prompt sets: humaneval, chat (ShareGPT held-out), "
                                                          "builtin, grounded (MT-bench and HumanEval prompts "
                                                          "whose answer repeats the input)")
    prompts: int = option(20, "prompts per set, from the set's eval split")
    tune_prompts: int = option(5, "prompts per set from the tune split, for the self-speculation grid search")
    max_new_tokens: int = option(GenerationOptions.max_new_tokens, "new tokens per prompt (greedy)")
    explorers: tuple[int, ...] = option((2, 3, 4), "values of K for DEX (uniform splits)")
    depth_sets: str | None = option(None, "further DEX exploration sets, ';'-separated, e.g. '3,8,13,18,23,28,30'")
    adapters: str = option("auto", "inducing adapters for DEX and self-speculation: auto, default, none or a file")
    variants: str = option("shipped", "DEX variants: 'shipped' (adapters and DECS on) or 'all' (adapters "
                                      "on/off x DECS on/off)")
    methods: tuple[str, ...] = option(("ar-hf", "ar-stages", "dex", "self-spec", "hf-early-exit", "hf-prompt-lookup"),
                                      "methods to run: " + ", ".join(METHODS))
    prompt_lookup_num_tokens: int = option(10, "hf-prompt-lookup: at most this many looked-up draft tokens per step")
    drafts: tuple[int, ...] = option(DRAFTS, "self-speculation draft lengths n in the grid (exits: every layer)")
    threads: int | None = option(None, "dex-distributed on CPU: torch threads per explorer")
    profile: bool = option(True, "time layers, heads and the distributed exchange on this machine (cached) and add "
                                 "communication to the projected K-device tokens/s")
    proposal_vocab: str = option("auto", "rows of DEX's non-final light proposal heads: N, full or auto "
                                         "(8192 with a token ranking)")
    prune: tuple[str, ...] = option(("auto",), "DEX lattice pruning bounds to compare, e.g. none,1 ('none' = off; B = "
                                               "at most B new branches per round; auto = the library's default: 1 "
                                               "on CPU, off on accelerators)")
    draft: str = option("none;auto", "DEX draft-chain settings to compare, ';'-separated: none (off), auto or "
                                     "bounds like 'length=8,min_ngram=2'")
    quick: bool = option(False, "a tiny random float64 model with random adapters (auto/default) and 3 short "
                                "synthetic prompts (seconds; for tests)")

    def __post_init__(self):
        self.sets, self.methods = parse_list(self.sets, "sets"), parse_list(self.methods, "methods")
        self.device = parse_device(self.device)
        if self.adapters not in ADAPTER_CHOICES:
            adapter_file(self.adapters)  # a missing file fails before the model loads
        self.explorers, self.drafts = parse_ints(self.explorers, "explorers"), parse_ints(self.drafts, "drafts")
        self.proposal_vocab = rows_option(self.proposal_vocab)
        self.prune = tuple(DecoderOptions(prune=b).prune for b in parse_list(self.prune, "prune"))
        if not self.prune:
            raise DexError("prune needs at least one bound: 'none' or a positive integer")
        self.draft = tuple(dict.fromkeys(d.strip() for d in str(self.draft).split(";") if d.strip())) or ("none",)
        for d in self.draft:
            DecoderOptions(draft=d)  # a bad bound is a DexError now, before the model loads
        if self.quick:
            for key, value in QUICK.items():
                setattr(self, key, value)
        bad = [s for s in self.sets if s not in PROMPT_SETS + ("synthetic",)]
        if bad or not self.sets:
            raise DexError(f"unknown prompt set(s) {bad}; choose from {', '.join(PROMPT_SETS)}")
        bad = [m for m in self.methods if m not in METHODS]
        if bad or "ar-hf" not in self.methods:
            raise DexError(f"methods must include ar-hf (the reference) and come from {', '.join(METHODS)}; "
                           f"got {list(self.methods)}")
        if self.variants not in ("shipped", "all"):
            raise DexError(f"variants must be 'shipped' or 'all'; got {self.variants!r}")
        if min(self.prompts, self.tune_prompts, self.max_new_tokens, self.prompt_lookup_num_tokens) < 1:
            raise DexError("prompts, tune_prompts, max_new_tokens and prompt_lookup_num_tokens must be positive")


def _quick_setup(device: torch.device):
    from ..model.adapters import new_adapters
    from ..testing import tiny_model, tiny_tokenizer

    model, tokenizer = tiny_model("llama", layers=6, seed=5).to(device), tiny_tokenizer()
    adapters = new_adapters(model, range(1, 6), bottleneck=32)
    for a in adapters.values():
        a.alpha.data.fill_(0.5)
        a.double().eval().requires_grad_(False)
    gen = torch.Generator().manual_seed(0)
    prompts = {split: [{"id": f"synthetic-{split}-{i}", "prompt": " ".join(
        f"w{v}" for v in torch.randint(0, 80, (5 + 7 * i,), generator=gen, device="cpu").tolist()), "chat": False}
        for i in range(3)] for split in ("eval", "tune")}
    return model, tokenizer, adapters, prompts


def tune_self_spec(model, answers: list[tuple[list[int], list[int]]], adapters: dict, drafts,
                   allow_ar: bool = True) -> dict:
    """Grid search of greedy self-speculation on (prompt, greedy answer) pairs under the cost model
    (memory-bound layer-equivalents, heads and adapters included): exit E over every layer 1..L-1 and n
    over ``drafts``, plus (``allow_ar``) "no speculation" (plain AR, exit None). The acceptance rule is replayed exactly
    on each layer's matches (``baselines.self_spec_layer_forwards``)."""
    from .baselines import self_spec_layer_forwards
    from .ead import layer_matches

    L = model.config.num_hidden_layers
    cost = ModelCost.of(model, adapters)
    omegas = [layer_matches(model, prompt, out, adapters) for prompt, out in answers]
    T = sum(len(om) for om in omegas)
    grid = [{"exit": None, "draft": 0, "layer_forwards_per_token": float(L), "cost_per_token": cost.ar()}][:allow_ar]
    for exit_layer in range(1, L):
        for n in drafts:
            steps = forwards = 0
            for om in omegas:
                s, f = self_spec_layer_forwards(om[:, exit_layer - 1], n, exit_layer, L)
                steps, forwards = steps + s, forwards + f
            step_cost = cost.self_spec_step(exit_layer, n, "memory", exit_layer in adapters)
            grid.append({"exit": exit_layer, "draft": n, "layer_forwards_per_token": forwards / T,
                         "cost_per_token": steps * step_cost / T})
    best = min(grid, key=lambda g: (g["cost_per_token"], g["exit"] or 0, g["draft"]))
    return {"exit": best["exit"], "draft": best["draft"], "tune_cost_per_token": best["cost_per_token"],
            "adapters": sorted(adapters), "grid": grid}


def _explorations(cfg: BenchConfig, model) -> list[tuple[int, ...]]:
    """Per K the set DexDecoder picks (the adapter file's best set for K, else uniform), then --depth-sets."""
    from ..model.adapters import choose_depths

    L = model.config.num_hidden_layers
    adapters = cfg.adapters if isinstance(cfg.adapters, str) and not cfg.quick else "none"
    sets = [choose_depths(model, DecoderOptions(explorers=K, adapters=adapters))[0] for K in cfg.explorers]
    for text in (cfg.depth_sets or "").split(";"):
        if text.strip():
            sets.append(resolve_depths(L, parse_depths(text)))
    return list(dict.fromkeys(sets))


def run_bench(cfg: BenchConfig, log=print) -> dict:
    """Run every method over every prompt set; return the report (``results`` rows, oracle, tuning)."""
    from ..model.adapters import resolve_adapters
    from .baselines import hf_early_exit_generate, hf_prompt_lookup_generate, self_spec_generate
    from .ead import matches
    from ..model.lens import layer_candidates
    from ..decoder import DexDecoder
    from ..model.load import load_model, resolve_device
    from .profile import measure_profile

    device = resolve_device(cfg.device)  # one device for every method (dex-distributed: one per explorer)
    if cfg.quick:
        model, tokenizer, adapters, synthetic = _quick_setup(device)
        adapters = resolve_adapters(adapters if cfg.adapters in ("auto", "default") else cfg.adapters, model)
    else:
        check_sets(cfg.sets)  # a missing data package is one line, before the model loads
        model, tokenizer = load_model(cfg.model, device=device)
        adapters = resolve_adapters(cfg.adapters, model)
        synthetic = None
    L = model.config.num_hidden_layers
    too_many = [K for K in cfg.explorers if K > L]
    if too_many:
        raise DexError(f"K = {too_many} exceeds the model's {L} layers")
    explorations = _explorations(cfg, model)

    def items(name, count, split):
        return synthetic[split][:count] if name == "synthetic" else prompt_set(name, count, split)

    sets = {name: [encode_item(tokenizer, it) for it in items(name, cfg.prompts, "eval")] for name in cfg.sets}
    tune = [encode_item(tokenizer, it) for name in cfg.sets for it in items(name, cfg.tune_prompts, "tune")]
    report = {"config": asdict(cfg), "model": "tiny random llama (float64)" if cfg.quick else cfg.model,
              "device": str(device), "num_layers": L, "adapter_depths": sorted(adapters),
              "torch_threads": torch.get_num_threads(),
              "results": [], "oracle": {}, "tuning": {}}

    tuned = {"self-spec": adapters, "hf-early-exit": {}}  # HF's early exit reads the plain lens
    if any(m in cfg.methods for m in tuned):
        log(f"tuning self-speculation on {len(tune)} tune-split prompts (exit 1..{L - 1} x draft {list(cfg.drafts)})")
        answers = [(p, hf_greedy(model, p, cfg.max_new_tokens)) for p in tune]
    for name, lens in tuned.items():
        if name in cfg.methods:
            t = report["tuning"][name] = tune_self_spec(model, answers, lens, cfg.drafts, name == "self-spec")
            log(f"{name}: exit {t['exit']}, draft {t['draft']} ({t['tune_cost_per_token']:.2f} "
                f"layer-equivalents/token on the tune split, heads included)")
    ss, hf = report["tuning"].get("self-spec"), report["tuning"].get("hf-early-exit")

    variants = [(bool(adapters), True)] if cfg.variants == "shipped" else \
        [(a, d) for a in ([True, False] if adapters else [False]) for d in (True, False)]
    decoders, light = {}, {"proposal_vocab": cfg.proposal_vocab}
    for depths in explorations:
        covered = {d: a for d, a in adapters.items() if d in depths[:-1]}
        runs = [("dex", use, decs, {}) for use, decs in variants]
        if "dex-distributed" in cfg.methods:
            runs.append(("dex-distributed", bool(adapters), True, {"backend": "distributed", "threads": cfg.threads,
                                                                   "devices": None if device.type == "cuda" else
                                                                   ("cpu",) * len(depths)}))
        for (method, use, decs, more), prune, draft in itertools.product(runs, cfg.prune, cfg.draft):
            d = DexDecoder(model, depths=depths, decs=decs, adapters=covered if use else {}, tokenizer=tokenizer,
                           prune=prune, draft=draft, **light, **more)
            key = (method, depths, use, decs, d.prune, draft)  # keyed by the bound it resolved to ('auto' may equal 1)
            if key in decoders:
                d.close()
            else:
                decoders[key] = d
    stage_ar = DexDecoder(model, depths=(L,), trace_top=0)
    rows = next((d.proposal_vocab for d in decoders.values()), model.config.vocab_size)
    profile = measure_profile(model, rows, log=log) if cfg.profile else None
    report["profile"] = profile

    runners = {"ar-hf": lambda p, n: (hf_greedy(model, p, n), {}),
               "ar-stages": lambda p, n: (stage_ar.generate(p, n).tokens, {})}
    for key, decoder in decoders.items():
        runners[key] = lambda p, n, d=decoder: (lambda r: (r.tokens, r.stats))(d.generate(p, n))
    if ss:
        runners["self-spec"] = (lambda p, n: (lambda r: (r["tokens"], r))(self_spec_generate(
            model, p, n, ss["exit"], ss["draft"], adapters.get(ss["exit"])))) if ss["exit"] else \
            (lambda p, n: (lambda t: (t, {"steps": len(t), "layer_forwards": L * len(t)}))(stage_ar.generate(p, n).tokens))
    if hf:
        runners["hf-early-exit"] = lambda p, n: (hf_early_exit_generate(model, p, n, hf["exit"], hf["draft"]), {})
    runners["hf-prompt-lookup"] = lambda p, n: (lambda r: (r["tokens"], r))(hf_prompt_lookup_generate(
        model, p, n, cfg.prompt_lookup_num_tokens))
    runners = {k: v for k, v in runners.items() if (k if isinstance(k, str) else k[0]) in cfg.methods}

    warm = next(iter(sets.values()))[0]
    log(f"warm-up: {len(runners)} methods")
    for run in runners.values():
        run(warm, min(8, cfg.max_new_tokens))

    try:
        for set_name, prompts in sets.items():
            log(f"{set_name}: {len(prompts)} prompts x {cfg.max_new_tokens} new tokens")
            clock, outs = Clock(model.device), {k: [] for k in runners}
            for i, prompt in enumerate(prompts):  # methods interleaved prompt by prompt
                for key, run in runners.items():
                    with clock.span(key):  # on CUDA: device time, read once the device has passed it
                        outs[key].append(run(prompt, cfg.max_new_tokens))
                log(f"  {set_name} {i + 1}/{len(prompts)}: {len(outs['ar-hf'][-1][0])} tokens")
            seconds = clock.read()
            refs = [o[0] for o in outs["ar-hf"]]
            shortlist = next((d.shortlist for d in decoders.values()), None)
            lens = {use: [layer_candidates(model, p, r, adapters if use else {}, shortlist=shortlist)
                          for p, r in zip(prompts, refs)] for use in {False, bool(adapters)}}
            ctx = {"refs": refs, "flat": torch.tensor([t for r in refs for t in r], device="cpu"), "L": L, "ss": ss, "hf": hf,
                   "lookup": cfg.prompt_lookup_num_tokens,
                   "cost": ModelCost.of(model, adapters), "dex_cost": {k: ModelCost.of(model, adapters, d.proposal_vocab) for k, d in decoders.items()},
                   "proposal_vocab": {k: d.proposal_vocab for k, d in decoders.items()},
                   "cands": {use: torch.cat(c) for use, c in lens.items()}, "adapters": adapters, "profile": profile}
            omega = matches(ctx["cands"][bool(adapters)], ctx["flat"])
            stable = float((torch.where(~omega, torch.arange(1, L + 1, device="cpu"), 0).max(dim=1).values + 1)
                           .double().mean())
            report["oracle"][set_name] = {"layer_forwards_per_token": stable, "speedup": L / stable}
            for key in runners:
                row = result_row(key, outs[key], ctx)
                cert = Certificate.combine(certify_tokens(model, p, o[0]) for p, o in zip(prompts, outs[key]))
                row.update(set=set_name, seconds=seconds[key], certified=cert.certified,
                           certified_worst_gap=cert.worst_gap,
                           tokens_per_second=row["tokens"] / seconds[key], tokens_per_second_kind="measured",
                           speedup_vs_ar=seconds["ar-hf"] / seconds[key],
                           layer_speedup=L / row["layer_forwards_per_token"],
                           cost_share_of_ar=row["cost_per_token"] / ctx["cost"].ar())
                report["results"].append(row)
    finally:
        for decoder in decoders.values():
            decoder.close()
    report["headline"] = headline(report)
    return report
