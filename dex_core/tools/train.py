"""Training inducing adapters by self-distillation from the frozen model (paper App. C.2).

For packed token windows of ShareGPT's training split (first user/assistant exchange, chat template) —
either with ShareGPT's own answers (``data="sharegpt"``) or with the model's own greedy answers to the
same prompts (``data="onpolicy"``, the text DEX will actually decode) — the frozen model's final logits
z_L are the teacher; each adapter's depth gives student logits
z_l = LM head(norm(adapter_l(h_l))). Loss: mean over depths of full-vocabulary KL(softmax(z_L / tau) ||
softmax(z_l / tau)) tau^2, tau = 1, plus ``top1`` x the student's cross-entropy on the teacher's top
token (0 by default; DEX matches top candidates, so this term weights what a match needs). AdamW on the
adapters only, warmup then linear decay, gradient accumulation, bf16 autocast for the matrix work
(softmax and KL stay in float32), checkpoint and resume. Everything runs on the model's device (the CLI's
``--device``); the bf16 default is decided there, for that device.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from ..model.adapters import load_adapters, new_adapters, save_adapters
from ..config import DexError, flag, option, parse_depths
from ..data.sets import sharegpt_split
from ..data.ranking import token_ranking
from ..runtime.request import chat_ids, eos_ids


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
    depths: tuple[int, ...] = option((8, 15, 23), "non-final depths to train adapters for, e.g. 8,15,23")
    tokens: int = option(200_000, "training tokens (steps = tokens / (batch x seq-len x accum))")
    seq_len: int = option(192, "tokens per packed training window")
    batch: int = option(1, "windows per micro-batch (small batches: more optimizer steps per token, which is "
                        "what the adapters need; docs/BENCHMARKS.md)")
    accum: int = option(1, "micro-batches per optimizer step (gradient accumulation)")
    lr: float = option(3e-3, "AdamW peak learning rate")
    warmup: float = option(0.06, "share of steps with linear warmup (then linear decay to 0)")
    weight_decay: float = option(0.0, "AdamW weight decay")
    bottleneck: int | None = option(None, "adapter bottleneck m (default 2 x hidden size)")
    top1: float = option(0.0, "weight of an extra cross-entropy term on the teacher's top token (DEX matches "
                         "top candidates; 0 = KL only, as in the paper)")
    data: str = option("sharegpt", "training text: sharegpt (human answers) or onpolicy (the model's own "
                       "greedy answers to the same prompts)")
    init: str | None = option(None, "start from this adapter file instead of fresh adapters (each depth from "
                              "the file's nearest depth)")
    bf16: bool | None = option(None, "bf16 autocast for the matrix work (softmax and KL stay float32); default: on "
                                     "a CUDA GPU with bf16 support or a CPU that computes bf16 natively (AVX512-BF16 "
                                     "or AMX), as emulated bf16 is many times slower")
    seed: int = option(0, "data order and initialisation seed")
    checkpoint_every: int = option(25, "steps between checkpoints (with --checkpoint)")

    def __post_init__(self):
        self.depths = parse_depths(self.depths)
        self.bf16 = None if self.bf16 is None else flag(self.bf16, "bf16")
        if self.tokens <= 0 or self.seq_len < 8 or self.batch < 1 or self.accum < 1 or not self.lr > 0:
            raise DexError("tokens, seq_len (>= 8), batch, accum and lr must be positive")
        if self.data not in DATA_SOURCES:
            raise DexError(f"data must be one of {', '.join(DATA_SOURCES)}; got {self.data!r}")

    @property
    def steps(self) -> int:
        return max(1, math.ceil(self.tokens / (self.batch * self.seq_len * self.accum)))


DATA_SOURCES = ("sharegpt", "onpolicy")
ONPOLICY_PROMPT_CHARS = 600  # user text kept per on-policy prompt: the answer is what is trained on
ONPOLICY_BATCH = 64  # prompts answered per batched greedy generate call


def _pack(sequences, seq_len: int):
    buffer: list[int] = []
    for ids in sequences:
        buffer.extend(ids[: 4 * seq_len])
        while len(buffer) >= seq_len:
            yield torch.tensor(buffer[:seq_len], device="cpu")  # host data: the training loop moves each batch
            buffer = buffer[seq_len:]


def _shuffled_rows(seed: int):
    rows = sharegpt_split("train")
    rng = random.Random(seed)
    while True:
        rng.shuffle(rows)
        yield from rows


def token_windows(tokenizer, seq_len: int, seed: int, model=None, data: str = "sharegpt"):
    """Endless (seq_len,) windows of the chat-formatted training split, packed back to back.

    ``data="onpolicy"`` replaces each human answer by the model's own greedy answer (float32, batched
    generate with left padding, up to ``seq_len`` new tokens) to the prompt's first 600 characters.
    """
    rows = _shuffled_rows(seed)
    if data == "sharegpt":
        return _pack((chat_ids(tokenizer, [{"role": "user", "content": r["prompt"]},
                                           {"role": "assistant", "content": r["answer"]}]) for r in rows), seq_len)
    return _pack(_onpolicy_sequences(model, tokenizer, rows, seq_len), seq_len)


@torch.no_grad()
def _onpolicy_sequences(model, tokenizer, rows, max_new_tokens: int):
    eos = next(iter(eos_ids(model)), None)
    pad = next((t for t in (tokenizer.pad_token_id, eos) if t is not None), 0)
    while True:
        prompts = [chat_ids(tokenizer, [{"role": "user", "content": next(rows)["prompt"][:ONPOLICY_PROMPT_CHARS]}],
                            generation_prompt=True) for _ in range(ONPOLICY_BATCH)]
        width = max(map(len, prompts))
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=model.device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=model.device)
        out = model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=max_new_tokens,
                             pad_token_id=pad)
        for prompt, row in zip(prompts, out[:, width:].tolist()):
            answer = row[: row.index(eos) + 1] if eos in row else row
            yield prompt + answer


def distill_loss(model, adapters: dict, x: torch.Tensor, bf16: bool, top1: float = 0.0) -> torch.Tensor:
    """Mean over adapters of KL(teacher || student) per token, full vocabulary, tau = 1, plus ``top1`` x the
    cross-entropy of the student on the teacher's top token. Autocast is for the device of ``x`` (the model's)."""
    with torch.no_grad(), torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=bf16):
        out = model(x, output_hidden_states=True)
    teacher = torch.log_softmax(out.logits.float(), dim=-1)  # (B, T, V)
    p_teacher = teacher.exp()
    best = teacher.argmax(-1, keepdim=True) if top1 else None
    loss = 0.0
    for depth, adapter in adapters.items():
        with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=bf16):
            logits = model.lm_head(model.model.norm(adapter(out.hidden_states[depth].float())))
        student = torch.log_softmax(logits.float(), dim=-1)
        loss = loss + (p_teacher * (teacher - student)).sum(-1).mean()
        if top1:
            loss = loss - top1 * student.gather(-1, best).mean()
    return loss / len(adapters)


def train_adapters(model, tokenizer, cfg: TrainConfig, out: str | Path, checkpoint: str | Path | None = None,
                   progress: bool = True, windows=None) -> dict:
    """Train, save the adapters to ``out`` (safetensors with metadata) and return the training facts.
    Interrupted (Ctrl-C), it saves the adapters of the last checkpoint (facts: ``stopped_early``); run
    the same command again to resume from the checkpoint.

    ``windows`` (an iterator of (seq_len,) token tensors) replaces the ShareGPT stream, e.g. in tests.
    """
    from tqdm.auto import tqdm

    L = model.config.num_hidden_layers
    if any(not 1 <= d < L for d in cfg.depths):
        raise DexError(f"adapter depths must be non-final layers 1..{L - 1}; got {list(cfg.depths)}")
    device = model.model.norm.weight.device  # training runs where the model is; the adapters are built there
    cfg = replace(cfg, bf16=bf16_default(device) if cfg.bf16 is None else cfg.bf16)  # decided for this device
    torch.manual_seed(cfg.seed)
    model.eval().requires_grad_(False)
    adapters = new_adapters(model, cfg.depths, cfg.bottleneck)
    if cfg.init:
        start = load_adapters(cfg.init, model)
        if start and next(iter(start.values())).up.out_features != next(iter(adapters.values())).up.out_features:
            raise DexError(f"--init {cfg.init} has another bottleneck than --bottleneck")
        for d, a in adapters.items():
            nearest = min(start, key=lambda s: (abs(s - d), s))
            a.load_state_dict({k: v.float() for k, v in start[nearest].state_dict().items()})
    params = [p for a in adapters.values() for p in a.parameters()]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    warm = max(1, int(cfg.warmup * cfg.steps))
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: (s + 1) / warm if s < warm else max(0.0, (cfg.steps - s) / max(1, cfg.steps - warm)))
    step, seconds, losses = 0, 0.0, []
    if checkpoint and Path(checkpoint).is_file():
        state = torch.load(checkpoint, weights_only=True, map_location=device)
        if state["config"] != asdict(cfg):
            raise DexError(f"checkpoint {checkpoint} was made with other training options; remove it or match them")
        for d, a in adapters.items():
            a.load_state_dict(state["adapters"][d])
        opt.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["scheduler"])
        step, seconds, losses = state["step"], state["seconds"], state["losses"]
    windows = windows or token_windows(tokenizer, cfg.seq_len, cfg.seed + step, model, cfg.data)
    bar = tqdm(total=cfg.steps, initial=step, desc="adapters", unit="step", disable=not progress)
    stopped = False
    try:
        while step < cfg.steps:
            tic = time.perf_counter()
            total = 0.0
            for _ in range(cfg.accum):
                x = torch.stack([next(windows) for _ in range(cfg.batch)]).to(device)
                loss = distill_loss(model, adapters, x, cfg.bf16, cfg.top1) / cfg.accum
                loss.backward()
                total += loss.detach().item()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            step += 1
            seconds += time.perf_counter() - tic
            losses.append(total)
            bar.update(1)
            bar.set_postfix(loss=f"{total:.3f}", tok_s=f"{step * cfg.batch * cfg.seq_len * cfg.accum / seconds:.0f}")
            if checkpoint and (step % cfg.checkpoint_every == 0 or step == cfg.steps):
                partial = Path(f"{checkpoint}.partial")  # written whole, then renamed: never half a checkpoint
                torch.save({"config": asdict(cfg), "step": step, "seconds": seconds, "losses": losses,
                            "adapters": {d: a.state_dict() for d, a in adapters.items()},
                            "optimizer": opt.state_dict(), "scheduler": sched.state_dict()}, partial)
                partial.replace(checkpoint)
    except KeyboardInterrupt:  # keep what the last checkpoint holds (a whole step); the same command resumes
        stopped = True
        if checkpoint and Path(checkpoint).is_file():
            state = torch.load(checkpoint, weights_only=True, map_location=device)
            for d, a in adapters.items():
                a.load_state_dict(state["adapters"][d])
            step, seconds, losses = state["step"], state["seconds"], state["losses"]
    bar.close()
    text = {"sharegpt": "ShareGPT V3 train split (first exchange, chat template), packed",
            "onpolicy": "the model's own greedy answers to ShareGPT V3 train-split prompts (chat template), packed"}
    facts = {**asdict(cfg), "data_text": text[cfg.data],
             "steps": step, "tokens": step * cfg.batch * cfg.seq_len * cfg.accum, "seconds": round(seconds, 1),
             "final_loss": round(sum(losses[-10:]) / max(1, len(losses[-10:])), 4),
             **({"stopped_early": True, "planned_steps": cfg.steps} if stopped else {})}
    ranking = token_ranking(tokenizer, model.config.vocab_size) if tokenizer is not None else None
    save_adapters(out, adapters, model, facts, ranking)
    return facts
