"""One rank's share of distributed adapter training: the job every rank agrees on (``TrainJob``) and the stage a
rank trains (``StageTrainer``).

Rank k of K holds what DEX's explorer k holds (``model.stage_load.StagePart``: layers (d_{k-1}, d_k] of the
uniform split, the final norm, the LM head or only its shortlist's rows, rank 0 the embeddings) and the adapters
of the depths inside its stage, their AdamW state and schedule. A micro-batch's windows enter at rank 0; each
rank runs its layers over the hidden rows (``training.distill.stage_forward``), keeps the rows at its adapters'
depths and passes its output on; the final rank turns its output into the teacher's log-probabilities, which go
back to every rank; each rank then computes its adapters' losses (``training.distill.adapter_loss``) and their
gradients. The frozen layers do not depend on the adapters, so nothing flows backwards through the stages: only
the gradients' global norm (for clipping) and the loss are summed over the ranks at each optimizer step
(``dex_core.training.pipeline``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from ..config import DexError, stage_bounds
from ..model.proposal import ProposalHead
from ..model.stage_load import StagePart
from ..model.view import model_view
from .distill import Teacher, adapter_loss, final_logits, stage_forward, train_dtype
from .train import TrainConfig, initial_adapters, optimizer


@dataclass(frozen=True)
class TrainJob:
    """What every rank of a distributed training run agrees on: the resolved options (``cfg``: this model's
    depths, the bf16 decision), the stages' last depths (``bounds``, ending at the model's layer count), the
    model's adapter identity, the weights' dtype, the token ranking (None: rank 0 derives it, or none without a
    tokenizer), the files (``out``; ``checkpoint``, a folder), and where rank 0 reads its windows: ``windows``
    ((n, seq_len) token ids, read in order, round and round) or the training text through the tokenizer of
    ``folder``."""

    cfg: TrainConfig
    bounds: tuple[int, ...]
    identity: dict
    dtype: str
    out: str
    checkpoint: str | None = None
    ranking: tuple[int, ...] | None = None
    windows: torch.Tensor | None = None
    folder: str | None = None

    @property
    def K(self) -> int:
        return len(self.bounds)

    def shortlist(self) -> tuple[int, ...] | None:
        """The token ids the loss scores (the light heads' shortlist), or None for the full vocabulary."""
        rows, vocab = self.cfg.shortlist, self.identity["vocab_size"]
        if not rows or rows >= vocab:
            return None
        if self.ranking is None:
            raise DexError("a shortlist loss needs the tokenizer (its ranking comes from the training text)")
        return tuple(self.ranking[:rows])

    def part(self, rank: int) -> StagePart:
        """What rank ``rank`` loads: a non-final rank only the shortlist's rows of the LM head, when the loss has
        one (before the ranking is known: the whole head, an upper bound of its bytes)."""
        rows = self.shortlist() if self.ranking is not None and rank < self.K - 1 else None
        return StagePart(self.bounds, rank, rows)

    def depths(self, rank: int) -> tuple[int, ...]:
        """The adapter depths inside rank ``rank``'s stage (depth d: the rows after layer d)."""
        start, stop = stage_bounds(self.bounds, rank)
        return tuple(d for d in self.cfg.depths if start < d <= stop)

    def config(self) -> dict:
        """What a checkpoint must have been made with to be resumed by this job."""
        return {"options": asdict(self.cfg), "bounds": list(self.bounds), "dtype": self.dtype}


class StageTrainer:
    """Rank ``rank``'s stage of ``job``: its part of the model (``stage``, from ``model.stage_load.load_stage``),
    its adapters and their optimizer, and how far training got (steps, seconds, the summed losses)."""

    def __init__(self, job: TrainJob, rank: int, stage):
        self.job, self.rank, self.cfg = job, rank, job.cfg
        self.view = model_view(stage.model.eval().requires_grad_(False))
        self.layers = range(*stage_bounds(job.bounds, rank))
        self.final = rank == job.K - 1
        self.adapters = initial_adapters(stage.model, job.cfg, job.depths(rank), job.identity)
        self.params = [p for a in self.adapters.values() for p in a.parameters()]
        self.opt, self.sched = (
            optimizer(self.params, job.cfg) if self.params else (None, None)
        )  # none: no adapters
        ids = job.shortlist()
        self.head = self.view.head if ids is None else ProposalHead(self.view, ids, stage.head_rows)
        self.teacher_head = None if ids is None or not self.final else ProposalHead(self.view, ids)
        self.dtype = train_dtype(self.view.dtype)
        self.step, self.seconds, self.losses = 0, 0.0, []

    @property
    def device(self) -> torch.device:
        return self.view.device

    def hidden_shape(self) -> tuple[int, int, int]:
        return self.cfg.batch, self.cfg.seq_len, self.view.model.config.hidden_size

    def teacher_shape(self) -> tuple[int, int, int]:
        ids = self.job.shortlist()
        return self.cfg.batch, self.cfg.seq_len, self.job.identity["vocab_size"] if ids is None else len(ids)

    @torch.no_grad()
    def forward(self, inputs: torch.Tensor) -> tuple[torch.Tensor, dict]:
        """This stage's layers over a micro-batch: token ids (B, T) at rank 0, else the previous stage's rows;
        returns the output rows, in the weights' dtype as the next rank receives them whatever autocast made of
        them, and the rows at this stage's adapter depths."""
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.cfg.bf16):
            hidden = self.view.embed(inputs) if self.rank == 0 else inputs
            out, kept = stage_forward(self.view, self.layers, hidden, keep=self.adapters)
        return out.to(self.view.dtype), kept

    @torch.no_grad()
    def teacher(self, out: torch.Tensor) -> torch.Tensor:
        """The final rank: the teacher's log-probabilities (B, T, V or N) in the training dtype."""
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.cfg.bf16):
            logits = final_logits(self.view, out, self.teacher_head)
        return torch.log_softmax(logits.to(self.dtype), dim=-1)

    def backward(self, kept: dict, logp: torch.Tensor) -> torch.Tensor:
        """This stage's adapters' share of a micro-batch's loss (their terms over all adapters' count and
        ``accum``), its gradients accumulated; returns the share (a tensor on the device: read once a step)."""
        if not self.adapters:
            return torch.zeros((), dtype=self.dtype, device=self.device)
        teacher, top1 = Teacher.of(logp, self.cfg.top1), self.cfg.top1
        loss = 0.0
        for depth, adapter in self.adapters.items():
            loss = loss + adapter_loss(self.head, adapter, kept[depth], teacher, top1, self.cfg.bf16)
        loss = loss / len(self.cfg.depths) / self.cfg.accum
        loss.backward()
        return loss.detach()

    def grad_norm_squared(self) -> float:
        grads = [p.grad for p in self.params if p.grad is not None]
        return float(torch.nn.utils.get_total_norm(grads) ** 2) if grads else 0.0

    def optimizer_step(self, total_norm: float, loss: float, seconds: float) -> None:
        """Clip with the norm over every rank's gradients, step, and count the step (its summed ``loss``)."""
        if self.params:
            norm = torch.tensor(total_norm, device=self.device)
            torch.nn.utils.clip_grads_with_norm_(self.params, 1.0, norm)
            self.opt.step()
            self.sched.step()
            self.opt.zero_grad(set_to_none=True)
        self.step, self.seconds = self.step + 1, self.seconds + seconds
        self.losses.append(loss)

    def tokens(self) -> int:
        return self.step * self.cfg.batch * self.cfg.seq_len * self.cfg.accum

    def state(self) -> dict:
        return {
            "config": self.job.config(),
            "rank": self.rank,
            "step": self.step,
            "seconds": self.seconds,
            "losses": self.losses,
            "adapters": {d: a.state_dict() for d, a in self.adapters.items()},
            "optimizer": self.opt.state_dict() if self.opt else {},
            "scheduler": self.sched.state_dict() if self.sched else {},
        }

    def load(self, path: Path, step: int) -> None:
        """Continue from this rank's checkpoint file ``path`` of step ``step``."""
        if not path.is_file():
            raise DexError(
                f"rank {self.rank} has no checkpoint file {path.name} in {path.parent} (the manifest says step "
                f"{step}); give each rank the folder its checkpoint was written to, or remove the manifest"
            )
        state = torch.load(path, weights_only=True, map_location=self.device)
        if state["config"] != self.job.config() or state["step"] != step or state["rank"] != self.rank:
            raise DexError(f"rank {self.rank}: checkpoint file {path} does not belong to this run; remove it")
        for d, a in self.adapters.items():
            a.load_state_dict(state["adapters"][d])
        if self.opt:
            self.opt.load_state_dict(state["optimizer"])
            self.sched.load_state_dict(state["scheduler"])
        self.step, self.seconds, self.losses = state["step"], state["seconds"], state["losses"]
