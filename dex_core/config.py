"""The one options dataclass of DEX; the CLI (and later the app and benchmarks) derive from it."""

from __future__ import annotations

from dataclasses import dataclass, field


class DexError(ValueError):
    """Bad input: the message says what was wrong and what to do. The CLI exits with code 2."""


def option(default, help: str, **extra):
    """A dataclass field with the help text its command-line flag and UI control show."""
    return field(default=default, metadata={"help": help, **extra})


@dataclass
class DexConfig:
    model: str = option("default", "model: 'default' (SmolLM2-135M-Instruct), a local directory, a "
                                 ".gguf file or a Hugging Face hub id")
    depths: tuple[int, ...] | None = option(None, "exploration set, e.g. 8,15,23,30 (must end at the "
                                                "model's layer count); overrides --explorers")
    explorers: int = option(4, "number of depth explorers K for a uniform split of the layers")
    adapters: str | None = option(None, "inducing adapters: 'default' (the set shipped for the default "
                                        "model), a .safetensors file from dex train-adapters, or none")
    decs: bool = option(True, "depth-coupled sampling: non-final stages skip tokens that shallower "
                            "stages of the same slot already proposed")
    max_new_tokens: int = option(128, "number of tokens to generate (stops earlier at EOS)")
    temperature: float = option(0.0, "0 for greedy; > 0 samples (Gumbel-max, exact to AR)")
    top_k: int | None = option(None, "sample only among the k most likely tokens")
    top_p: float | None = option(None, "sample only within the top-p probability nucleus")
    seed: int = option(0, "sampling seed; noise is keyed by (seed, position)")
    chat: bool = option(True, "apply the tokenizer's chat template to the prompt")
    dtype: str = option("float32", "model dtype: float32, float64, bfloat16 or float16")
    trace_top: int = option(5, "top candidates (with probabilities) recorded per lattice node")
    backend: str = option("sequential", "sequential (all explorers in one process) or distributed "
                                      "(one process per explorer on torch.distributed)")
    devices: tuple[str, ...] | None = option(None, "distributed: one device per explorer, e.g. "
                                                 "cuda:0,cuda:1; default cuda:0..K-1 if K GPUs, else cpu")
    threads: int | None = option(None, "distributed on CPU: torch threads per explorer "
                                     "(default: cores // K, at least 1)")
    op_timeout: float = option(60.0, "distributed: seconds any one exchange may wait for a peer")
    start_timeout: float = option(120.0, "distributed: seconds the explorer processes may take to start")

    def __post_init__(self):
        if self.depths is not None:
            self.depths = parse_depths(self.depths)
        if not isinstance(self.explorers, int) or self.explorers < 1:
            raise DexError(f"explorers must be a positive integer; got {self.explorers!r}")
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens <= 0:
            raise DexError(f"max_new_tokens must be a positive integer; got {self.max_new_tokens!r}")
        check_sampling(self.temperature, self.top_k, self.top_p)
        if self.dtype not in DTYPES:
            raise DexError(f"dtype must be one of {', '.join(DTYPES)}; got {self.dtype!r}")
        check_backend(self.backend)
        if isinstance(self.devices, str):
            self.devices = tuple(d.strip() for d in self.devices.split(",") if d.strip())
        if self.threads is not None and (not isinstance(self.threads, int) or self.threads < 1):
            raise DexError(f"threads must be a positive integer; got {self.threads!r}")
        if not self.op_timeout > 0 or not self.start_timeout > 0:
            raise DexError(f"timeouts must be positive; got op_timeout={self.op_timeout!r}, "
                           f"start_timeout={self.start_timeout!r}")
        if not isinstance(self.trace_top, int) or self.trace_top < 0:
            raise DexError(f"trace_top must be a non-negative integer; got {self.trace_top!r}")


DTYPES = ("float32", "float64", "bfloat16", "float16")


BACKENDS = ("sequential", "distributed")


def check_backend(backend) -> None:
    if backend not in BACKENDS:
        raise DexError(f"backend must be one of {', '.join(BACKENDS)}; got {backend!r}")


def check_sampling(temperature, top_k, top_p) -> None:
    """Validate sampling options (shared by the config and the generate calls)."""
    if not isinstance(temperature, (int, float)) or not temperature >= 0.0:
        raise DexError(f"temperature must be >= 0 (0 is greedy); got {temperature!r}")
    if top_k is not None and (not isinstance(top_k, int) or top_k < 1):
        raise DexError(f"top_k must be a positive integer or None; got {top_k!r}")
    if top_p is not None and (not isinstance(top_p, (int, float)) or not 0.0 < top_p <= 1.0):
        raise DexError(f"top_p must be in (0, 1]; got {top_p!r}")


def parse_depths(depths) -> tuple[int, ...]:
    """'8,15,23,30' or a sequence -> a strictly increasing tuple of positive ints."""
    if isinstance(depths, str):
        try:
            depths = [int(d) for d in depths.replace(" ", "").split(",") if d]
        except ValueError:
            raise DexError(f"depths must be comma-separated integers like 8,15,23,30; got {depths!r}") from None
    try:
        out = tuple(int(d) for d in depths)
    except (TypeError, ValueError):
        raise DexError(f"depths must be a sequence of integers; got {depths!r}") from None
    if not out:
        raise DexError("depths is empty; give at least the model's layer count, e.g. 30")
    if any(d < 1 for d in out) or any(b <= a for a, b in zip(out, out[1:])):
        raise DexError(f"depths must be strictly increasing positive layer counts; got {list(out)}")
    return out


def resolve_depths(num_layers: int, depths=None, explorers: int | None = None) -> tuple[int, ...]:
    """The exploration set for a model of ``num_layers`` layers: explicit, or a uniform K split.

    Uniform: d_k = ceil((k + 1) L / K), e.g. L = 30, K = 4 -> (8, 15, 23, 30).
    """
    if depths is not None:
        out = parse_depths(depths)
        if out[-1] != num_layers:
            raise DexError(f"exploration depths must end at the model's {num_layers} layers; got {list(out)}")
        return out
    k = DexConfig.explorers if explorers is None else explorers
    if not isinstance(k, int) or not 1 <= k <= num_layers:
        raise DexError(f"explorers must be between 1 and the model's {num_layers} layers; got {k!r}")
    return tuple(-(-(i + 1) * num_layers // k) for i in range(k))
