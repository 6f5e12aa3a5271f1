"""Every option of DEX with its default, validated once; the library, CLI, app and explorers derive from it.

- ``GenerationOptions``: what one request asks for (length, sampling, seed, EOS).
- ``DecoderOptions``: how a ``DexDecoder`` explores (depths or K, adapters, DECS, backend, devices).
- ``DexConfig``: both, plus what a command or the app needs to get a model (spec, dtype, chat template).
- ``ConsoleOptions``: how the ``dex`` command talks (``--verbose``).

A field's metadata holds its help text (CLI flags, UI labels, the HTTP API's schema), for numbers the range a
value may take (``minimum``/``maximum``, checked here) and the range the app's controls offer
(``ui_min``/``ui_max``), and, where the OpenAI-compatible API takes the option, how that surface shows it
(``api``: its name there, and its default and lowest value where they differ: OpenAI samples by default, and 0
turns top-k off), which the app's sampling controls show too. ``dex_core.flags`` reads it for the CLI's flags,
the app's controls and the API's request schema; a text that states a default is made from the constant that
holds it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from .values import (
    DexError,
    adapter_file,
    finite,
    flag,
    integer,
    items_of,
    parse_depths,
    parse_device,
    parse_ints,
    parse_list,
    rows_option,
)


def option(default, help: str, **extra):
    """A dataclass field with the help text its command-line flag and UI control show."""
    if isinstance(default, (list, dict, set)):
        raise TypeError("use a tuple default")
    return field(default=default, metadata={"help": help, **extra})


DTYPES = ("float32", "float64", "bfloat16", "float16")
DEFAULT_PROPOSAL_VOCAB = (
    8192  # the light proposal heads' rows for proposal_vocab="auto", given a token ranking
)
# ``prune="auto"``, rows priced by what they buy (``analysis.profile.row_budget``). CPU: the budget of least rounds per
# token x round seconds, the round timed in a decode's order and the rounds counted on the tune split, on this
# project's 2-core machine at K = 4 (benchmarks/row_budget.py, docs/BENCHMARKS.md "A row budget that keeps what
# pays"): 8, where a round costs 0.74 of its 2-row time and takes 0.79 of the rounds a token (MKL's 2- and 3-row
# steps are its dearest). Accelerators (no rounds measured there): the most rows with every step within 10% of the
# 2-row step, on the GPU check's real-size tables from an H200 in bfloat16 (Llama-2-70B, CodeLlama-34B and Qwen3-32B
# layers: 64 rows, the most it times, within 7% of one; docs/BENCHMARKS.md "The GPU check")
# -- provisional: those timings held the host's table and mask build, a flat curve; the check now times the stage step
# alone, and a GPU's run of it re-derives this (docs/GPU.md, "Where AUTO_ROWS["accelerator"] = 64 came from").
AUTO_ROWS = {"cpu": 8, "accelerator": 64}
# requests sharing rounds (``runtime.crew``): a stage's rows a round, every request's together, split evenly among
# the requests in flight (each at least 1, at most its own budget). CPU: 16, where the decode-order curve stops being
# flat (a K = 4 round: 98 ms at 8 rows, 139 ms at 16; docs/results/row-budget.json); under load, docs/BENCHMARKS.md,
# "Many strangers in one round". Accelerators: the row budget's flat curve (a projection until a GPU measures it).
SHARED_ROWS = {"cpu": 16, "accelerator": 64}
# ``compile``: the stage steps' compilations in one process (every explorer and bucket of rows, mask table and cache
# capacity: ``dex_core.model.compiled``); past it a step of a new bucket runs eagerly, with one log line
COMPILE_BUDGET = 256
AUTO_ROWS_TEXT = f"{AUTO_ROWS['cpu']} on CPU, {AUTO_ROWS['accelerator']} on accelerators"
MAX_SEED = 2**64 - 1  # sampling noise is keyed by 64 bits (``sampling.noise_key``): a larger seed would wrap
DEVICE_HELP = "where the model runs: auto (cuda when torch sees a GPU, else cpu), cpu, cuda or cuda:N"
BACKENDS = ("sequential", "distributed", "torchrun")
ANALYSED_KS = tuple(range(2, 9))  # the values of K that readiness analyses report by default
DEPTH_CHOICES = (
    "given",
    "best set stored with the adapters",
    "uniform split",
)  # how a decoder got its depths
ADAPTER_CHOICES = ("auto", "default", "none")  # the named adapter choices; any other text is a file
ADAPTER_HELP = (
    "inducing adapters: 'auto' (the set shipped for the default model when the model is that "
    "model, else none), 'default' (the shipped set), 'none', or a .safetensors file from "
    "dex train-adapters"
)


@dataclass
class GenerationOptions:
    max_new_tokens: int = option(
        128,
        "number of tokens to generate (stops earlier at EOS)",
        minimum=1,
        ui_min=1,
        ui_max=512,
        api={"name": "max_tokens"},  # its default and bound: the server's (OpenAI: 16 for completions)
    )
    temperature: float = option(
        0.0,
        "0 for greedy; > 0 samples (Gumbel-max, exact to AR)",
        minimum=0.0,
        ui_min=0.05,
        ui_max=2.0,
        api={"default": 1.0},
    )
    top_k: int | None = option(
        None,
        "sample only among the k most likely tokens",
        minimum=1,
        api={"default": 0, "minimum": 0},  # 0: off
    )
    top_p: float | None = option(
        None,
        "sample only within the top-p probability nucleus",
        exclusive_minimum=0.0,
        maximum=1.0,
        ui_min=0.05,
        api={"default": 1.0},  # 1: off
    )
    seed: int = option(
        0,
        "sampling seed, 0 to 2**64 - 1; noise is keyed by (seed, position)",
        minimum=0,
        maximum=MAX_SEED,
        api={},
    )
    eos_token_id: int | tuple[int, ...] | None = option(
        None, "stop after this token id (default: the model's generation config)"
    )

    def __post_init__(self):
        self.max_new_tokens = integer(self.max_new_tokens, "max_new_tokens", 1)
        self.temperature = finite(self.temperature, "temperature")
        if self.temperature < 0:
            raise DexError(f"temperature must be >= 0 (0 is greedy); got {self.temperature!r}")
        self.top_k = None if self.top_k is None else integer(self.top_k, "top_k", 1)
        self.top_p = None if self.top_p is None else finite(self.top_p, "top_p")
        if self.top_p is not None and not 0.0 < self.top_p <= 1.0:
            raise DexError(f"top_p must be in (0, 1]; got {self.top_p!r}")
        self.seed = integer(self.seed, "seed")
        if not 0 <= self.seed <= MAX_SEED:  # 2**64 would give seed 0's samples, -1 those of 2**64 - 1
            raise DexError(
                f"seed must be an integer from 0 to 2**64 - 1 ({MAX_SEED}); a seed outside that range would "
                f"repeat another seed's samples; got {self.seed}"
            )
        if isinstance(self.eos_token_id, str):
            self.eos_token_id = parse_ints(self.eos_token_id, "eos_token_id", 0)
        elif self.eos_token_id is not None:
            ids = self.eos_token_id if isinstance(self.eos_token_id, (list, tuple)) else (self.eos_token_id,)
            self.eos_token_id = tuple(integer(t, "eos_token_id", 0) for t in ids)

    @classmethod
    def build(cls, base: GenerationOptions | None = None, **overrides) -> GenerationOptions:
        """``base`` (or the defaults) with ``overrides`` (field names). ``max_new_tokens=None`` keeps the
        base's length; any other override is taken as given (``top_k=None`` turns top-k off)."""
        if base is not None and not isinstance(base, GenerationOptions):
            raise DexError(f"options must be a GenerationOptions (or a DexConfig); got {type(base).__name__}")
        if overrides.get("max_new_tokens", 0) is None:
            del overrides["max_new_tokens"]
        return pick(cls, base or cls(), **overrides)


@dataclass(frozen=True)
class DraftBounds:
    """Bounds of draft chains (prompt lookup on the token axis inside the lattice, ``dex_core.algorithm.draft``)."""

    ngram: int = 3  # longest n-gram of a branch's text looked up in its context
    min_ngram: int = (
        2  # shortest match that starts a chain (1-grams match nearly everywhere: rows for nothing)
    )
    length: int = 8  # looked-up tokens per chain
    chains: int = 1  # new chains per round
    rows: int = (
        24  # chain slots alive at once (each a row per stage per round); gate 1: cut a chain slot once
    )
    gate: int = 0  # its predecessor's candidates all differ from its input (0: never)

    @classmethod
    def parse(cls, value) -> DraftBounds | None:
        """'auto' (the defaults), 'none' (off, None), a DraftBounds (or its dict), or 'length=6,chains=2'."""
        value = (
            ",".join(f"{k}={v}" for k, v in value.items()) if isinstance(value, Mapping) else value
        )  # asdict's
        if isinstance(value, cls) or value in (None, "none", "auto"):
            return cls() if value == "auto" else None if value == "none" else value
        try:
            pairs = dict(item.split("=") for item in items_of(value, "draft"))
            out = cls(
                **{
                    k.strip(): integer(int(v), f"draft {k.strip()}", k.strip() != "gate")
                    for k, v in pairs.items()
                }
            )
        except (TypeError, ValueError, AttributeError) as err:
            raise DexError(
                f"draft must be auto, none or bounds like 'length=6,chains=2' "
                f"({', '.join(f.name for f in dataclasses.fields(cls))}: integers >= 1); got {value!r:.80}"
            ) from (None if isinstance(err, DexError) else err)
        if out.min_ngram > out.ngram or out.gate > 1:
            raise DexError(f"draft needs min_ngram <= ngram and gate 0 or 1; got {value!r:.80}")
        return out


@dataclass
class DecoderOptions:
    depths: tuple[int, ...] | None = option(
        None, "exploration set, e.g. 8,15,23,30 (must end at the model's layer count); overrides --explorers"
    )
    explorers: int = option(
        4, "number of depth explorers K for a uniform split of the layers", ui_min=1, ui_max=8
    )
    adapters: str | Mapping | None = option("auto", ADAPTER_HELP)
    decs: bool = option(
        True,
        "depth-coupled sampling: non-final stages skip tokens that shallower "
        "stages of the same slot already proposed",
    )
    proposal_vocab: int | str = option(
        "auto",
        "rows of the non-final stages' light proposal heads: the N most "
        f"frequent training tokens, full, or auto ({DEFAULT_PROPOSAL_VOCAB} given a ranking)",
        kind=str,
    )
    prune: int | str | None = option(
        "auto",
        "the lattice's row budget: at most this many rows per stage a round, the rows "
        "worth most first (chance of reuse x rounds saved; exact: a branch left out only "
        f"loses reuse); auto: the device's ({AUTO_ROWS_TEXT}); none: unbounded",
        kind=str,
    )
    draft: str | DraftBounds | None = option(
        "auto",
        "draft chains (prompt lookup inside the lattice; several exact "
        "commits per round): auto, none, or bounds like 'length=8,chains=1'",
        kind=str,
    )
    trace_top: int = option(
        0, "top candidates (with probabilities) recorded per lattice node (the app asks for 5)"
    )
    compile: bool | str = option(
        False,
        "each stage's step through torch.compile (fullgraph, static shapes; CUDA graphs on CUDA): one compilation per "
        "bucket of rows, then no Python between its kernels; minutes of warm-up, for long runs on GPUs (Python: or a "
        "torch.compile backend's name, or 'module:function')",
        switch=True,  # a flag on the command line
    )
    backend: str = option(
        "sequential",
        "sequential (all explorers in one process), distributed "
        "(one process per explorer on torch.distributed) or torchrun "
        "(this program runs once per rank under torchrun, across nodes too; K is the launch's)",
        choices=BACKENDS,
    )
    devices: tuple[str, ...] | None = option(
        None,
        "distributed: one device per explorer, e.g. "
        "cuda:0,cuda:1; default cuda:0..K-1 (GPUs shared in turn if fewer)",
    )
    threads: int | None = option(
        None, "distributed on CPU: torch threads per explorer (default: cores // K, at least 1)"
    )
    op_timeout: float = option(60.0, "distributed: seconds any one exchange may wait for a peer")
    start_timeout: float = option(120.0, "distributed: seconds the explorer processes may take to start")

    def __post_init__(self):
        self.depths = None if self.depths is None else parse_depths(self.depths)
        self.explorers = integer(self.explorers, "explorers", 1)
        if self.adapters is None or (isinstance(self.adapters, str) and not self.adapters.strip()):
            self.adapters = "none"
        elif isinstance(self.adapters, (str, Path)):
            self.adapters = str(self.adapters).strip()
            if self.adapters not in ADAPTER_CHOICES:
                adapter_file(self.adapters)
        elif not isinstance(self.adapters, Mapping):
            raise DexError(
                f"adapters must be 'auto', 'default', 'none', a file or a mapping; got {self.adapters!r}"
            )
        self.decs, self.draft = flag(self.decs, "decs"), DraftBounds.parse(self.draft)
        if not isinstance(self.compile, str) or not self.compile.strip():
            self.compile = flag(self.compile, "compile")
        self.trace_top = integer(self.trace_top, "trace_top", 0)
        self.prune = rows_option("none" if self.prune is None else self.prune, "prune", ("auto", "none"))
        self.prune = None if self.prune == "none" else self.prune
        self.proposal_vocab = rows_option(self.proposal_vocab)
        if self.backend not in BACKENDS:
            raise DexError(f"backend must be one of {', '.join(BACKENDS)}; got {self.backend!r}")
        self.devices = None if self.devices is None else parse_list(self.devices, "devices")
        self.threads = None if self.threads is None else integer(self.threads, "threads", 1)
        if (
            not finite(self.op_timeout, "op_timeout") > 0
            or not finite(self.start_timeout, "start_timeout") > 0
        ):
            raise DexError(
                f"timeouts must be positive; got op_timeout={self.op_timeout!r}, "
                f"start_timeout={self.start_timeout!r}"
            )


@dataclass
class DexConfig(DecoderOptions, GenerationOptions):
    model: str = option(
        "default",
        "model: 'default' (SmolLM2-135M-Instruct), 'gemma3-270m' (Gemma 3 270M), a local directory, a .gguf "
        "file or a Hugging Face hub id",
    )
    chat: bool = option(True, "apply the tokenizer's chat template to the prompt")
    dtype: str = option(
        "auto",
        "model dtype: auto (float32 on CPU; on CUDA the checkpoint's bfloat16/float16, "
        "float32 checkpoints as bfloat16), " + ", ".join(DTYPES),
    )
    device: str = option("auto", DEVICE_HELP)

    def __post_init__(self):
        GenerationOptions.__post_init__(self)
        DecoderOptions.__post_init__(self)
        if not isinstance(self.model, str) or not self.model.strip():
            raise DexError(
                f"model must be a named model, a directory, a .gguf file or a hub id; got {self.model!r}"
            )
        self.chat = flag(self.chat, "chat")
        if self.dtype not in ("auto", *DTYPES):
            raise DexError(f"dtype must be one of auto, {', '.join(DTYPES)}; got {self.dtype!r}")
        self.device = parse_device(self.device)

    def decoder(self) -> DecoderOptions:
        return pick(DecoderOptions, self)

    def generation(self) -> GenerationOptions:
        return pick(GenerationOptions, self)


@dataclass
class ConsoleOptions:
    """How the ``dex`` command talks, whatever it runs (every subcommand has these flags)."""

    verbose: bool = option(
        False,
        "also show what the libraries print: transformers' and huggingface_hub's progress bars, log lines "
        "and warnings, and pip's output when the default model is fetched",
    )

    def __post_init__(self):
        self.verbose = flag(self.verbose, "verbose")


def pick(cls, source, **overrides):
    """An instance of dataclass ``cls`` from the same-named attributes of ``source``, then ``overrides``."""
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(overrides) - names)
    if unknown:
        raise DexError(f"unknown option(s) {', '.join(unknown)}; valid: {', '.join(sorted(names))}")
    return cls(**{**{n: getattr(source, n) for n in names if hasattr(source, n)}, **overrides})


def resolve_depths(num_layers: int, depths=None, explorers: int | None = None) -> tuple[int, ...]:
    """The exploration set for a model of ``num_layers`` layers: explicit, or a uniform K split,
    d_k = ceil((k + 1) L / K), e.g. L = 30, K = 4 -> (8, 15, 23, 30)."""
    if depths is not None:
        out = parse_depths(depths)
        if out[-1] != num_layers:
            raise DexError(f"exploration depths must end at the model's {num_layers} layers; got {list(out)}")
        return out
    k = DecoderOptions.explorers if explorers is None else explorers
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= num_layers:
        raise DexError(f"explorers must be between 1 and the model's {num_layers} layers; got {k!r}")
    return tuple(-(-(i + 1) * num_layers // k) for i in range(k))


def stage_bounds(depths, stage: int) -> tuple[int, int]:
    """Layers [start, stop) of stage ``stage`` of exploration set ``depths``."""
    return (0 if stage == 0 else depths[stage - 1]), depths[stage]
