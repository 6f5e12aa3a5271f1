"""The Analysis tab's handler: the model's greedy answer to a prompt, analysed by the library in one call
(``dex_core.analysis.answer``: EAD of each token, the speedups and costs it predicts for K = 2..8, the logit lens's
depth view), drawn with ``visualize``. Like every model request its inputs are checked here and its model time is
bounded by the host: an answer cut at the bound is analysed as far as it got, and the table says so first. The
analysis itself is ``analysed`` (no drawing), which the page draws (``analyse``) and the MCP tool reads
(``app.ui.tools``)."""

from __future__ import annotations

from dataclasses import dataclass, replace

import gradio as gr

import visualize as viz
from dex_core import DexError, ar_stream
from dex_core.analysis.answer import PHASES, AnswerAnalysis, analyse_answer
from dex_core.runtime.request import check_text
from dex_core.trace.events import TokenEvent

from ..host.state import Runtime
from .handlers import Deadline, short_error
from .inputs import Inputs

METRICS = ("probability", "rank")  # the Analysis's depth view colours
DRAWING = "drawing the figures"
# what follows the answer, as the page's progress counts it: i of 4 steps done as step i + 1 runs, never 4 of 4
STEPS = (*PHASES, DRAWING)


def _silent(*args, **kwargs) -> None:
    """The progress of a caller without one (the MCP tool)."""


def _told(progress, tokens: int):
    """The library's phase callback (``analyse_answer``'s ``phase``), told to the page as a step of ``STEPS``."""

    def phase(name: str) -> None:
        progress((STEPS.index(name), len(STEPS)), desc=f"analysing {tokens} tokens: {name}", unit="steps")

    return phase


def _greedy_answer(model, ids, config, deadline: Deadline, progress) -> tuple[list[int], str | None]:
    """The greedy answer's tokens, and why it ended early (the host's bound), or None; ``progress`` (Gradio's)
    counts its tokens, never all of them (100%) while the analysis is still to come."""
    tokens = []
    for event in ar_stream(model, ids, options=config.generation()):
        if isinstance(event, TokenEvent):
            tokens.append(event.token)
            if len(tokens) < config.max_new_tokens:  # after the last one, the analysis's first step is told
                progress((len(tokens), config.max_new_tokens), desc="the greedy answer", unit="tokens")
            if deadline.reason():
                return tokens, deadline.reason()
    return tokens, None


@dataclass(frozen=True)
class Analysed:
    """An answer analysed: the library's analysis, the answer's tokens, why it ended early (the host's bound; None if
    it did not), the tokens asked for and the tokenizer that reads them."""

    found: AnswerAnalysis
    tokens: list[int]
    cut: str | None
    max_new_tokens: int
    tokenizer: object


def analysed(runtime: Runtime, inputs: Inputs, progress=None) -> Analysed:
    """``_analysed`` with the model to itself (``Runtime.sharing``): its answer and forwards beside no Live run."""
    with runtime.sharing.alone():
        return _analysed(runtime, inputs, progress)


def _analysed(runtime: Runtime, inputs: Inputs, progress=None) -> Analysed:
    """The greedy answer to ``inputs`` (its prompt, chat, adapters and max_new_tokens) and its analysis; DexError on
    bad input. ``progress`` (Gradio's, or None) is told each phase: the model's loading, the answer's tokens, then each
    step of ``STEPS`` as it starts (the last, drawing, is ``analyse``'s)."""
    # not ``progress or``: Gradio's Progress is falsy (its len is 0) until it tracks an iterable, so ``or`` hid every
    # phase of the page's progress
    progress = _silent if progress is None else progress
    config = inputs.config()
    prompt = check_text(inputs.prompt)
    runtime.need_whole_model("the Analysis")
    ids = runtime.encode(prompt, config.chat)
    progress(0, desc="loading the model (once per server)")
    model, tokenizer = runtime.model("the Analysis")
    notice = runtime.slow_notice(None, config.max_new_tokens)
    if notice:
        gr.Warning(notice)
    tokens, cut = _greedy_answer(model, ids, config, Deadline(runtime.settings.request_seconds), progress)
    options = replace(config.decoder(), explorers=runtime.settings.explorers)
    found = analyse_answer(model, ids, tokens, options, tokenizer, phase=_told(progress, len(tokens)))
    return Analysed(
        found=found, tokens=tokens, cut=cut, max_new_tokens=config.max_new_tokens, tokenizer=tokenizer
    )


def analyse(
    runtime: Runtime, prompt, chat, adapters, max_new_tokens, metric="probability", progress=gr.Progress()
):
    """EAD of each token of the greedy answer, the speedups and costs it predicts for K = 2..8, and the
    depth view: the committed token's probability (or rank) at every layer, explored depths marked. An
    answer cut at the host's bound is analysed as far as it got, and the table says so first. The page shows
    each phase as it runs (``progress``): the model's loading, the answer's tokens, the analysis's steps and the
    drawing, so it never reads 100% before the figures arrive."""
    try:
        if metric not in METRICS:
            raise DexError(f"metric must be one of {', '.join(METRICS)}; got {str(metric)!r:.40}")
        inputs = Inputs(prompt=prompt, chat=chat, adapters=adapters, max_new_tokens=max_new_tokens)
        done = analysed(runtime, inputs, progress)
    except DexError as err:
        raise short_error(err) from None
    found, tokens, cut, tokenizer = done.found, done.tokens, done.cut, done.tokenizer
    _told(progress, len(tokens))(DRAWING)
    view = found.depth_view
    seen = {t for row in view["top"] for layer in row for t, _ in layer} | set(view["tokens"])
    texts = {t: tokenizer.decode([t]) for t in seen}
    metric = "rank" if metric == "rank" else "prob"
    depth = viz.depth_figure(view, texts, found.settings.depths[:-1], metric)
    table = viz.readiness_table_html(found.readiness, found.adapter_depths)
    if cut:
        table = (
            viz.status_html(
                "stopped",
                f"the answer stopped {cut} after {len(tokens)} of "
                f"{done.max_new_tokens} tokens: this analyses those",
            )
            + table
        )
    return viz.ead_figure(found.readiness), viz.speedup_figure(found.readiness), table, depth
