"""``dex bench``: DEX against autoregressive decoding, depth-selection and token-axis baselines, side by side.

Methods (every output compared token by token with HF ``generate``, greedy):

- ``ar-hf``: HF ``generate``; ``ar-stages``: AR through our own stage runner (DEX with K = 1), which
  isolates implementation overhead;
- ``dex``: the sequential schedule for each K (the exploration set DexDecoder picks: the adapter file's
  best set for K, else uniform; light proposal heads per ``--proposal-vocab``; adapters / DECS as
  chosen), with rounds per token, the depth-side speedup next to ``dex ead``'s prediction, measured
  one-device tokens/s and the projected K-device tokens/s (communication from the machine's profile,
  ``dex_core.analysis.profile``); ``dex-distributed``: the distributed schedule's measured wall clock;
- ``ar-pipeline``: AR through the same K stages on the distributed schedule's devices (``stream(pipeline=True)``:
  one token walks every stage, K rounds per token) — the like-for-like AR where the model only fits across K
  devices; ``ar-stages`` is the same stage code in one process with K = 1, ``ar-hf`` the whole model in one;
- ``self-spec``: LayerSkip-style self-speculation on our stage runner with the same adapters, exit
  depth E and draft length n grid-searched on the tune split (paper App. D), by the critical path;
- ``hf-early-exit``: HF's ``assistant_early_exit`` (plain logit lens), tuned the same way;
- ``adadecode`` and ``del``: adaptive depth selection over ``--exits`` candidate exits
  (``dex_core.evaluation.baselines.selectors``): AdaDecode-style confidence exits (threshold and draft length tuned on
  the tune split by real runs, as the paper does) and DEL-style exit and draft length from running acceptance
  rates (no tuning, as the paper runs DEL);
  every segment forward and head counted, with the paper's Eq. (4) charge W_sel per token;
- ``hf-prompt-lookup``: HF's prompt lookup (``--prompt-lookup-num-tokens`` drafts copied from the text so far,
  verified in one forward), with its forwards (steps) and rows per token counted;
- ``ar-tp``: AR on transformers' own tensor parallelism (``tp_plan="auto"``, one process per rank, ``--tp-size``):
  on a CPU a correctness check (certified per token), on GPUs the paper's multi-device baseline (Fig. 5).

Metrics: ``identical`` (prompts whose tokens equal HF greedy's) and ``certified`` (tokens that one
teacher-forced forward of the unmodified model confirms as its choice or a near-tie, ``dex_core.evaluation.verify``;
``certified_worst_gap`` the largest gap to the top); tokens/s after one warm-up per method (new tokens /
total time; ``measured`` or ``projected`` says which); the hardware-neutral critical path in layer forwards per
token — AR: L; DEX: (matched stage + 1) rounds times the longest stage, summed over tokens (one batched forward
counts once, explorers working in the same round count once); self-speculation: n * E + L per
draft-verify step over the tokens committed; prompt lookup: L per forward; and the cost per token of
``dex_core.model.cost`` (heads and adapters included, both views; prompt lookup: AR's per forward, or per row).
The EAD oracle (mean stable EAD) is a reference line.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch

from ...analysis.profile import measure_profile
from ...config import (
    ADAPTER_CHOICES,
    AUTO_ROWS_TEXT,
    DEFAULT_PROPOSAL_VOCAB,
    DEVICE_HELP,
    DecoderOptions,
    DexConfig,
    DexError,
    GenerationOptions,
    adapter_file,
    integer,
    option,
    parse_depths,
    parse_device,
    parse_ints,
    parse_list,
    resolve_depths,
    rows_option,
)
from ...data.sets import PROMPT_SETS, check_sets, prompt_set
from ...decoder import DexDecoder
from ...log import stderr
from ...model.adapter_choice import choose_depths, resolve_adapters
from ...model.adapters import new_adapters
from ...model.load import load_model, resolve_device
from ...runtime.request import encode_item
from ..baselines.tensor_parallel import tp_size
from .finished import Finished
from .methods import dex_decoders, runners, tensor_parallel, tune
from .report import headline
from .sets import add_set, finished_set

METHODS = (
    "ar-hf",
    "ar-stages",
    "ar-pipeline",
    "dex",
    "dex-distributed",
    "self-spec",
    "hf-early-exit",
    "adadecode",
    "del",
    "hf-prompt-lookup",
    "ar-tp",
)
DRAFTS = (1, 2, 3, 4, 6, 8)
QUICK = {
    "sets": ("synthetic",),
    "prompts": 3,
    "tune_prompts": 2,
    "max_new_tokens": 16,
    "explorers": (2, 3),
    "profile": False,
}


@dataclass
class BenchConfig:
    model: str = option("default", "model spec, as for dex generate")
    device: str = option(
        DexConfig.device,
        DEVICE_HELP + "; every method runs there (dex-distributed: one "
        "device per explorer, cpu ones when this is cpu)",
    )
    sets: tuple[str, ...] = option(
        ("humaneval", "chat"),
        "prompt sets: humaneval, chat (ShareGPT held-out), "
        "builtin, grounded (MT-bench and HumanEval prompts "
        "whose answer repeats the input)",
    )
    prompts: int = option(20, "prompts per set, from the set's eval split (--split)")
    split: str = option("eval", "the split the methods are measured on: eval, or tune (what tuning reads)")
    tune_prompts: int = option(5, "prompts per set from the tune split, for the self-speculation grid search")
    max_new_tokens: int = option(GenerationOptions.max_new_tokens, "new tokens per prompt (greedy)")
    explorers: tuple[int, ...] = option((2, 3, 4), "values of K for DEX (uniform splits)")
    depth_sets: str | None = option(
        None, "further DEX exploration sets, ';'-separated, e.g. '3,8,13,18,23,28,30'"
    )
    adapters: str = option(
        "auto", "inducing adapters for DEX and self-speculation: auto, default, none or a file"
    )
    variants: str = option(
        "shipped", "DEX variants: 'shipped' (adapters and DECS on) or 'all' (adapters on/off x DECS on/off)"
    )
    methods: tuple[str, ...] = option(
        ("ar-hf", "ar-stages", "dex", "self-spec", "hf-early-exit", "hf-prompt-lookup"),
        "methods to run: " + ", ".join(METHODS),
    )
    exits: int = option(5, "adadecode and del: candidate exits, spaced evenly below the final depth")
    prompt_lookup_num_tokens: int = option(
        10, "hf-prompt-lookup: at most this many looked-up draft tokens per step"
    )
    drafts: tuple[int, ...] = option(
        DRAFTS, "self-speculation draft lengths n in the grid (exits: every layer)"
    )
    threads: int | None = option(None, "dex-distributed and ar-tp on CPU: torch threads per process")
    tp_size: int | None = option(
        None,
        "ar-tp: tensor-parallel ranks (transformers' tp_plan='auto'); a size that divides the attention and "
        "KV head counts (default: the smallest such size >= 2)",
    )
    profile: bool = option(
        True,
        "time layers, heads and the distributed exchange on this machine (cached) and add "
        "communication to the projected K-device tokens/s",
    )
    proposal_vocab: str = option(
        "auto",
        f"rows of DEX's non-final light proposal heads: N, full or auto ({DEFAULT_PROPOSAL_VOCAB} with a token "
        "ranking)",
    )
    prune: tuple[str, ...] = option(
        ("auto",),
        "DEX lattice row budgets to compare, e.g. none,2 ('none' = unbounded; B = "
        "at most B rows per stage a round, the branches most likely reused first; auto = the library's "
        f"default: {AUTO_ROWS_TEXT})",
    )
    draft: str = option(
        "none;auto",
        "DEX draft-chain settings to compare, ';'-separated: none (off), auto or "
        "bounds like 'length=8,min_ngram=2'",
    )
    quick: bool = option(
        False,
        "a tiny random float64 model with random adapters (auto/default) and 3 short "
        "synthetic prompts (seconds; for tests)",
    )

    def __post_init__(self):
        self.sets, self.methods = parse_list(self.sets, "sets"), parse_list(self.methods, "methods")
        self.device = parse_device(self.device)
        if self.adapters not in ADAPTER_CHOICES:
            adapter_file(self.adapters)  # a missing file fails before the model loads
        self.explorers, self.drafts = (
            parse_ints(self.explorers, "explorers"),
            parse_ints(self.drafts, "drafts"),
        )
        self.proposal_vocab = rows_option(self.proposal_vocab)
        self.tp_size = None if self.tp_size is None else integer(self.tp_size, "tp_size", 2)
        self.prune = tuple(DecoderOptions(prune=b).prune for b in parse_list(self.prune, "prune"))
        if not self.prune:
            raise DexError("prune needs at least one bound: 'none' or a positive integer")
        self.draft = tuple(dict.fromkeys(d.strip() for d in str(self.draft).split(";") if d.strip())) or (
            "none",
        )
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
            raise DexError(
                f"methods must include ar-hf (the reference) and come from {', '.join(METHODS)}; "
                f"got {list(self.methods)}"
            )
        if self.split not in ("eval", "tune"):
            raise DexError(f"split must be 'eval' or 'tune'; got {self.split!r}")
        if self.variants not in ("shipped", "all"):
            raise DexError(f"variants must be 'shipped' or 'all'; got {self.variants!r}")
        if (
            min(
                self.prompts,
                self.tune_prompts,
                self.max_new_tokens,
                self.prompt_lookup_num_tokens,
                self.exits,
            )
            < 1
        ):
            raise DexError(
                "prompts, tune_prompts, max_new_tokens, prompt_lookup_num_tokens and exits must be positive"
            )


def _quick_setup(device: torch.device):
    # deferred: transformers takes seconds to import (docs/ARCHITECTURE.md, Imports)
    from ...testing import tiny_model, tiny_tokenizer

    model, tokenizer = tiny_model("llama", layers=6, seed=5).to(device), tiny_tokenizer()
    adapters = new_adapters(model, range(1, 6), bottleneck=32)
    for a in adapters.values():
        a.alpha.data.fill_(0.5)
        a.double().eval().requires_grad_(False)
    gen = torch.Generator().manual_seed(0)
    prompts = {
        split: [
            {
                "id": f"synthetic-{split}-{i}",
                "prompt": " ".join(
                    f"w{v}" for v in torch.randint(0, 80, (5 + 7 * i,), generator=gen, device="cpu").tolist()
                ),
                "chat": False,
            }
            for i in range(3)
        ]
        for split in ("eval", "tune")
    }
    return model, tokenizer, adapters, prompts


@dataclass
class Bench:
    """One ``dex bench`` run's shared parts: its options, the model and its adapters, the device, the log."""

    cfg: BenchConfig
    model: object
    tokenizer: object
    adapters: dict
    device: torch.device
    log: Callable[[str], None]
    synthetic: dict | None = None  # --quick: the synthetic prompts, by split

    @classmethod
    def load(cls, cfg: BenchConfig, log) -> Bench:
        device = resolve_device(cfg.device)  # one device for every method (dex-distributed: one per explorer)
        if cfg.quick:
            model, tokenizer, adapters, synthetic = _quick_setup(device)
            adapters = resolve_adapters(
                adapters if cfg.adapters in ("auto", "default") else cfg.adapters, model
            )
            return cls(cfg, model, tokenizer, adapters, device, log, synthetic)
        check_sets(cfg.sets)  # a missing data package is one line, before the model loads
        model, tokenizer = load_model(cfg.model, device=device)
        return cls(cfg, model, tokenizer, resolve_adapters(cfg.adapters, model), device, log)

    @property
    def L(self) -> int:
        return self.model.config.num_hidden_layers

    def prompts(self, name: str, count: int, split: str) -> list[list[int]]:
        items = self.synthetic[split][:count] if name == "synthetic" else prompt_set(name, count, split)
        return [encode_item(self.tokenizer, it) for it in items]


def _explorations(cfg: BenchConfig, model) -> list[tuple[int, ...]]:
    """Per K the set DexDecoder picks (the adapter file's best set for K, else uniform), then --depth-sets."""
    L = model.config.num_hidden_layers
    adapters = cfg.adapters if isinstance(cfg.adapters, str) and not cfg.quick else "none"
    sets = [choose_depths(model, DecoderOptions(explorers=K, adapters=adapters))[0] for K in cfg.explorers]
    for text in (cfg.depth_sets or "").split(";"):
        if text.strip():
            sets.append(resolve_depths(L, parse_depths(text)))
    return list(dict.fromkeys(sets))


def run_bench(
    cfg: BenchConfig, log=stderr, bench: Bench | None = None, finished: Finished | None = None
) -> dict:
    """Run every method over every prompt set; return the report (``results`` rows, oracle, tuning, and HF
    greedy's ``answers`` per set). ``bench``: the model and its parts loaded already (``Bench.load(cfg)``);
    ``finished``: the sets an earlier, stopped run finished (read back, not run again) and where each set goes
    as it finishes."""
    bench = bench or Bench.load(cfg, log)
    too_many = [K for K in cfg.explorers if K > bench.L]
    if too_many:
        raise DexError(f"K = {too_many} exceeds the model's {bench.L} layers")
    tp = tp_size(bench.model.config, cfg.tp_size) if "ar-tp" in cfg.methods else None  # before any process
    sets = {name: bench.prompts(name, cfg.prompts, cfg.split) for name in cfg.sets}
    report = {
        "config": asdict(cfg),
        "model": "tiny random llama (float64)" if cfg.quick else cfg.model,
        "device": str(bench.device),
        "num_layers": bench.L,
        "adapter_depths": sorted(bench.adapters),
        "torch_threads": torch.get_num_threads(),
        "results": [],
        "oracle": {},
        "answers": {},
        "tuning": tune(bench),
    }
    decoders, group = dex_decoders(bench, _explorations(cfg, bench.model)), None
    try:
        group = tensor_parallel(bench, tp) if tp else None
        rows = next((d.proposal_vocab for d in decoders.values()), bench.model.config.vocab_size)
        report["profile"] = measure_profile(bench.model, rows, log=log) if cfg.profile else None
        methods = runners(
            bench, decoders, DexDecoder(bench.model, depths=(bench.L,), trace_top=0), report["tuning"], group
        )
        log(f"warm-up: {len(methods)} methods")
        for run in methods.values():
            run(next(iter(sets.values()))[0], min(8, cfg.max_new_tokens))
        for name, prompts in sets.items():
            add_set(report, name, finished_set(bench, report, name, prompts, methods, decoders, finished))
    finally:
        for decoder in [*decoders.values(), group]:
            if decoder is not None:
                decoder.close()
    report["headline"] = headline(report)
    return report
