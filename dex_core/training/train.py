"""Training inducing adapters by self-distillation from the frozen model (paper App. C.2).

For packed token windows of ShareGPT's training split (first user/assistant exchange, chat template) —
either with ShareGPT's own answers (``data="sharegpt"``) or with the model's own greedy answers to the
same prompts (``data="onpolicy"``, the text DEX will actually decode) — the frozen model's final logits
z_L are the teacher; each adapter's depth gives student logits
z_l = LM head(norm(adapter_l(h_l))). Loss: mean over depths of full-vocabulary KL(softmax(z_L / tau) ||
softmax(z_l / tau)) tau^2, tau = 1, plus ``top1`` x the student's cross-entropy on the teacher's top
token (0 by default; DEX matches top candidates, so this term weights what a match needs). With
``shortlist`` N, both distributions are over the light proposal heads' N tokens only (the teacher
renormalised on them): N / V of the heads' cost, for large vocabularies (Gemma 3's 262k). AdamW on the
adapters only, warmup then linear decay, gradient accumulation, bf16 autocast for the matrix work
(softmax and KL stay in float32, float64 for a float64 model), checkpoint and resume (a resumed run reads the
windows an uninterrupted one would). Here everything runs in one process on the model's device (the CLI's
``--device``; the bf16 default is decided there, for that device); on explorer processes, each holding its stage
and training the adapters inside it: ``dex_core.training.ranks``. What a step computes is shared with them
(``dex_core.training.distill``); so are the adapters' initial values (each depth drawn from its own seed).
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
from tqdm.auto import tqdm

from ..config import DexError, adapter_file, flag, option
from ..data.ranking import token_ranking
from ..model.adapter_choice import adapter_set
from ..model.adapters import identity_of, new_adapters, save_adapters
from ..model.depth_grids import adapter_depths, parse_adapter_depths
from ..model.proposal import ProposalHead
from ..model.view import model_view
from .data import DATA_SOURCES, training_windows
from .distill import Teacher, adapter_loss, final_logits, stage_forward, train_dtype


def native_bf16() -> bool:
    """Whether this CPU computes bf16 natively (Linux: the avx512_bf16 or amx_bf16 flag)."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def bf16_default(device: torch.device) -> bool:
    """Whether bf16 autocast pays on ``device``: a CUDA GPU that supports bf16, or a CPU with native bf16."""
    if device.type == "cuda":
        with torch.cuda.device(device):
            return torch.cuda.is_bf16_supported()
    return device.type == "cpu" and native_bf16()


@dataclass
class TrainConfig:
    depths: tuple[int, ...] | str = option(
        (8, 15, 23),
        "non-final depths to train adapters for: a list (8,15,23), 'all' (every non-final depth) or "
        "'uniform[:A-B]' (the non-final depths of the uniform splits for K = A..B, 2-8 by default)",
    )
    tokens: int = option(200_000, "training tokens (steps = tokens / (batch x seq-len x accum))")
    seq_len: int = option(192, "tokens per packed training window")
    batch: int = option(
        1,
        "windows per micro-batch (small batches: more optimizer steps per token, which is "
        "what the adapters need; docs/BENCHMARKS.md)",
    )
    accum: int = option(1, "micro-batches per optimizer step (gradient accumulation)")
    lr: float = option(3e-3, "AdamW peak learning rate")
    warmup: float = option(0.06, "share of steps with linear warmup (then linear decay to 0)")
    weight_decay: float = option(0.0, "AdamW weight decay")
    bottleneck: int | None = option(None, "adapter bottleneck m (default 2 x hidden size)")
    top1: float = option(
        0.0,
        "weight of an extra cross-entropy term on the teacher's top token (DEX matches "
        "top candidates; 0 = KL only, as in the paper)",
    )
    data: str = option(
        "sharegpt",
        "training text: sharegpt (human answers) or onpolicy (the model's own "
        "greedy answers to the same prompts)",
    )
    init: str | None = option(
        None,
        "start from this adapter file instead of fresh adapters (each depth from the file's nearest depth)",
    )
    bf16: bool | None = option(
        None,
        "bf16 autocast for the matrix work (softmax and KL stay float32); default: on "
        "a CUDA GPU with bf16 support or a CPU that computes bf16 natively (AVX512-BF16 "
        "or AMX), as emulated bf16 is many times slower",
    )
    shortlist: int = option(
        0,
        "score only the N most frequent training tokens in the loss (the light heads' shortlist; KL to "
        "the teacher renormalised on them, N/V of the head's cost); 0: the full vocabulary",
    )
    seed: int = option(0, "data order and initialisation seed")
    checkpoint_every: int = option(25, "steps between checkpoints (with --checkpoint)")

    def __post_init__(self):
        self.depths = parse_adapter_depths(self.depths)
        self.bf16 = None if self.bf16 is None else flag(self.bf16, "bf16")
        if self.tokens <= 0 or self.seq_len < 8 or self.batch < 1 or self.accum < 1 or not self.lr > 0:
            raise DexError("tokens, seq_len (>= 8), batch, accum and lr must be positive")
        if self.shortlist < 0:
            raise DexError(
                f"shortlist must be 0 (full vocabulary) or a number of tokens; got {self.shortlist}"
            )
        if self.data not in DATA_SOURCES:
            raise DexError(f"data must be one of {', '.join(DATA_SOURCES)}; got {self.data!r}")

    @property
    def steps(self) -> int:
        return max(1, math.ceil(self.tokens / (self.batch * self.seq_len * self.accum)))


def resolved(cfg: TrainConfig, layers: int, device) -> TrainConfig:
    """``cfg`` for a model of ``layers`` layers trained on ``device``: a named depth grid as this model's depths
    (checked), the bf16 default decided for that device."""
    depths = adapter_depths(cfg.depths, layers)
    if any(not 1 <= d < layers for d in depths):
        raise DexError(f"adapter depths must be non-final layers 1..{layers - 1}; got {list(depths)}")
    bf16 = bf16_default(torch.device(device)) if cfg.bf16 is None else cfg.bf16
    return replace(cfg, depths=depths, bf16=bf16)


def distill_loss(
    model,
    adapters: dict,
    x: torch.Tensor,
    bf16: bool,
    top1: float = 0.0,
    shortlist: ProposalHead | None = None,
) -> torch.Tensor:
    """Mean over adapters of KL(teacher || student) per token, tau = 1, plus ``top1`` x the cross-entropy of
    the student on the teacher's top token. Over the full vocabulary, or with ``shortlist`` (a light head)
    over its tokens only, the teacher renormalised on them. Autocast is for the device of ``x`` (the model's)."""
    view = model_view(model)
    with torch.no_grad(), torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=bf16):
        out, kept = stage_forward(view, range(view.num_layers), view.embed(x), keep=adapters)
        logits = final_logits(view, out, shortlist)
    teacher = Teacher.from_logits(logits, train_dtype(view.dtype), top1)
    head = view.head if shortlist is None else shortlist  # final norm, rows, scaling, soft-cap
    loss = 0.0
    for depth, adapter in adapters.items():
        loss = loss + adapter_loss(head, adapter, kept[depth], teacher, top1, bf16)
    return loss / len(adapters)


def depth_seed(seed: int, depth: int) -> int:
    """The seed of the adapter at ``depth``'s initial draw: a rank holding some depths draws what one process does."""
    return seed * 100_003 + depth


def initial_adapters(model, cfg: TrainConfig, depths, identity=None) -> dict:
    """Fresh adapters at ``depths`` (each drawn from ``depth_seed``), in the training dtype of the model, or started
    from ``cfg.init``'s nearest depth. ``identity``: the model's (``adapters.identity_of``), where ``model`` is a
    stage that lacks the embeddings it is read from."""
    dtype = train_dtype(model.model.norm.weight.dtype)
    adapters = {}
    for d in depths:
        torch.manual_seed(depth_seed(cfg.seed, d))
        adapters |= new_adapters(model, [d], cfg.bottleneck, dtype)
    if cfg.init:
        start = adapter_set(str(adapter_file(cfg.init)), identity_of(identity or model))
        start = start.build(start.depths, model.model.norm.weight.device, dtype)
        for d, a in adapters.items():
            nearest = min(start, key=lambda s: (abs(s - d), s))
            if start[nearest].up.out_features != a.up.out_features:
                raise DexError(
                    f"--init {cfg.init}: its adapter at depth {nearest} (the nearest to {d}) has bottleneck "
                    f"{start[nearest].up.out_features}, not --bottleneck {a.up.out_features}"
                )
            a.load_state_dict(start[nearest].state_dict())
    return adapters


def optimizer(params: list, cfg: TrainConfig):
    """AdamW over ``params`` and its schedule: linear warm-up over ``cfg.warmup`` of the steps, then linear decay."""
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    warm = max(1, int(cfg.warmup * cfg.steps))
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: (s + 1) / warm if s < warm else max(0.0, (cfg.steps - s) / max(1, cfg.steps - warm))
    )
    return opt, sched


class _Trainer:
    """The optimizer over the adapters, and how far it got; checkpoints."""

    def __init__(
        self, model, adapters: dict, cfg: TrainConfig, device, shortlist: ProposalHead | None = None
    ):
        self.model, self.adapters, self.cfg, self.device = model, adapters, cfg, device
        self.shortlist = shortlist
        self.params = [p for a in adapters.values() for p in a.parameters()]
        self.opt, self.sched = optimizer(self.params, cfg)
        self.step, self.seconds, self.losses = 0, 0.0, []

    def resume(self, checkpoint, optimizer: bool = True) -> None:
        """Continue from ``checkpoint`` (the adapters only, without ``optimizer``: what a Ctrl-C keeps)."""
        state = torch.load(checkpoint, weights_only=True, map_location=self.device)
        if state["config"] != asdict(self.cfg):
            raise DexError(
                f"checkpoint {checkpoint} was made with other training options; remove it or match them"
            )
        for d, a in self.adapters.items():
            a.load_state_dict(state["adapters"][d])
        if optimizer:
            self.opt.load_state_dict(state["optimizer"])
            self.sched.load_state_dict(state["scheduler"])
        self.step, self.seconds, self.losses = state["step"], state["seconds"], state["losses"]

    def train_step(self, windows) -> float:
        """One optimizer step over ``accum`` batches of windows; its loss."""
        cfg, tic, total = self.cfg, time.perf_counter(), 0.0
        for _ in range(cfg.accum):
            x = torch.stack([next(windows) for _ in range(cfg.batch)]).to(self.device)
            loss = distill_loss(self.model, self.adapters, x, cfg.bf16, cfg.top1, self.shortlist) / cfg.accum
            loss.backward()
            total += loss.detach().item()
        torch.nn.utils.clip_grad_norm_(self.params, 1.0)
        self.opt.step()
        self.sched.step()
        self.opt.zero_grad(set_to_none=True)
        self.step, self.seconds = self.step + 1, self.seconds + time.perf_counter() - tic
        self.losses.append(total)
        return total

    def save(self, checkpoint) -> None:
        partial = Path(f"{checkpoint}.partial")  # written whole, then renamed: never half a checkpoint
        torch.save(
            {
                "config": asdict(self.cfg),
                "step": self.step,
                "seconds": self.seconds,
                "losses": self.losses,
                "adapters": {d: a.state_dict() for d, a in self.adapters.items()},
                "optimizer": self.opt.state_dict(),
                "scheduler": self.sched.state_dict(),
            },
            partial,
        )
        partial.replace(checkpoint)

    def tokens(self) -> int:
        return self.step * self.cfg.batch * self.cfg.seq_len * self.cfg.accum


def train_adapters(
    model,
    tokenizer,
    cfg: TrainConfig,
    out: str | Path,
    checkpoint: str | Path | None = None,
    progress: bool = True,
    windows=None,
    ranking=None,
) -> dict:
    """Train, save the adapters to ``out`` (safetensors with metadata) and return the training facts.
    Interrupted (Ctrl-C), it saves the adapters of the last checkpoint (facts: ``stopped_early``); run
    the same command again to resume from the checkpoint.

    ``windows`` (an iterator of (seq_len,) token tensors) replaces the ShareGPT stream, e.g. in tests;
    ``ranking`` (every token id, most frequent first) the one derived from the tokenizer.
    """
    device = model.model.norm.weight.device  # training runs where the model is; the adapters are built there
    cfg = resolved(cfg, model.config.num_hidden_layers, device)
    model.eval().requires_grad_(False)
    if ranking is None and tokenizer is not None:
        ranking = token_ranking(tokenizer, model.config.vocab_size)
    shortlist = _shortlist_head(model, ranking, cfg.shortlist)
    trainer = _Trainer(model, initial_adapters(model, cfg, cfg.depths), cfg, device, shortlist)
    if checkpoint and Path(checkpoint).is_file():
        trainer.resume(checkpoint)
    done, given = trainer.step * cfg.accum * cfg.batch, windows is not None
    windows = windows or training_windows(
        tokenizer, cfg.seq_len, cfg.seed, cfg.data, done, trainer.step, model
    )
    bar = tqdm(total=cfg.steps, initial=trainer.step, desc="adapters", unit="step", disable=not progress)
    stopped = False
    try:
        while trainer.step < cfg.steps:
            loss = trainer.train_step(windows)
            bar.update(1)
            bar.set_postfix(loss=f"{loss:.3f}", tok_s=f"{trainer.tokens() / trainer.seconds:.0f}")
            if checkpoint and (trainer.step % cfg.checkpoint_every == 0 or trainer.step == cfg.steps):
                trainer.save(checkpoint)
    except KeyboardInterrupt:  # keep what the last checkpoint holds (a whole step); the same command resumes
        stopped = True
        if checkpoint and Path(checkpoint).is_file():
            trainer.resume(checkpoint, optimizer=False)
    bar.close()
    facts = facts_of(cfg, trainer, stopped, given)
    save_adapters(out, trainer.adapters, model, facts, ranking)
    return facts


def _shortlist_head(model, ranking, rows: int) -> ProposalHead | None:
    """The light head whose tokens the loss scores (``rows`` of the ranking), or None for the full vocabulary."""
    if not rows or rows >= model.config.vocab_size:
        return None
    if ranking is None:
        raise DexError("a shortlist loss needs the tokenizer (its ranking comes from the training text)")
    return ProposalHead(model_view(model), ranking[:rows])


def facts_of(cfg: TrainConfig, trainer, stopped: bool, given: bool = False) -> dict:
    """What the adapter file records of its training (``given``: on windows the caller gave)."""
    text = {
        "sharegpt": "ShareGPT V3 train split (first exchange, chat template), packed",
        "onpolicy": "the model's own greedy answers to ShareGPT V3 train-split prompts (chat template), packed",
        "given": "token windows given by the caller",
    }
    losses = trainer.losses[-10:]
    return {
        **asdict(cfg),
        "data_text": text["given" if given else cfg.data],
        "steps": trainer.step,
        "tokens": trainer.tokens(),
        "seconds": round(trainer.seconds, 3),
        "final_loss": round(sum(losses) / max(1, len(losses)), 4),
        **({"stopped_early": True, "planned_steps": cfg.steps} if stopped else {}),
    }
