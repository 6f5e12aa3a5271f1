"""One answer analysed (``analyse_answer``): what each layer already predicts of its tokens, what that predicts for
DEX, and what a run of the same options would explore — the app's Analysis tab asks this, in one call.

Every depth is read through the inducing adapters of the choice (all of the file's depths, not only one set's).
The EAD readiness (``ead.readiness``: EADs, the speedups and costs predicted for K = 2..8, the best sets) is costed
by ``dex_core.model.cost`` with the proposal heads a decoder of these options would use (``RunSettings``), and the
logit lens's depth view (``dex_core.model.lens.depth_view``) gives every layer's probability and rank of each token.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..config import DecoderOptions
from ..log import stderr
from ..model.adapter_choice import resolve_adapters
from ..model.cost import ModelCost
from ..model.lens import depth_view, layer_candidates
from ..model.view import model_view
from ..runtime.settings import RunSettings, resolve_run
from .ead import analyse

# The analysis's phases, in order: the one ``analyse_answer`` tells its ``phase`` callback as it starts each.
PHASES = (
    "each layer's top candidates",
    "the predicted speedups and the best sets",
    "the depth view (logit lens)",
)


@dataclass(frozen=True)
class AnswerAnalysis:
    settings: RunSettings  # what a run of the options explores (the depth view marks its depths)
    readiness: dict  # ead.readiness(best=True, cost=...): JSON-ready
    depth_view: dict  # lens.depth_view: every layer's top candidates, probability and rank of each token
    adapter_depths: tuple[int, ...]  # the depths the choice's adapters read (all of them)


def analyse_answer(
    model,
    prompt: list[int],
    tokens: list[int],
    options: DecoderOptions,
    tokenizer=None,
    log=stderr,
    phase: Callable[[str], None] | None = None,
) -> AnswerAnalysis:
    """The analysis of answer ``tokens`` to ``prompt`` by the loaded ``model`` under decoder ``options`` (their
    adapters, K or depths, proposal heads); ``tokenizer`` as for ``DexDecoder`` (a token ranking for light heads).
    ``phase``, if given, is called with each of ``PHASES`` as that phase starts (the app's progress)."""
    phase = phase or (lambda name: None)
    phase(PHASES[0])
    view = model_view(model)
    settings = resolve_run(model, view, options, view.device.type, tokenizer, log)
    adapters = resolve_adapters(options.adapters, model)
    cost = ModelCost.of(model, adapters, settings.proposal_vocab)
    candidates = layer_candidates(model, prompt, tokens, adapters)
    phase(PHASES[1])  # ead.readiness, with the phases apart
    found = analyse(candidates, tokens, best=True, cost=cost, adapter_depths=sorted(adapters or {}))
    phase(PHASES[2])
    return AnswerAnalysis(
        settings=settings,
        readiness=found,
        depth_view=depth_view(model, prompt, tokens, adapters),
        adapter_depths=tuple(sorted(adapters)),
    )
