"""The option controls the app's tabs share: K, draft chains, adapters, max new tokens and sampling. Under a
torchrun launch the explorers and their settings are the launch's, and the controls say so (``launched``)."""

from __future__ import annotations

import gradio as gr

from dex_core import DecoderOptions, GenerationOptions
from dex_core.flags import control

from ..host.state import Runtime
from .handlers import HUSH


def sampling_editable(sample):
    """Temperature, top-k, top-p and the seed count only when sampling: not editable in greedy mode."""
    return (gr.update(interactive=sample is True),) * 4


def _sampling(name: str) -> dict:
    """A sampling control's value and range (``control``: as the API shows the option), not editable until Sample
    is on."""
    c = control(GenerationOptions, name)
    return {"value": c["value"], "minimum": c["minimum"], "maximum": c["maximum"], "interactive": False}


def sampling_controls():
    with gr.Row():  # the sampling settings are editable only while Sample is on
        sample = gr.Checkbox(label="Sample (else greedy)", value=False, elem_id="live-sample")
        temperature = gr.Slider(
            step=0.05, label="Temperature", elem_id="live-temperature", **_sampling("temperature")
        )
        top_k = gr.Number(precision=0, label="Top-k (0 = off)", elem_id="live-top-k", **_sampling("top_k"))
        top_p = gr.Slider(step=0.05, label="Top-p (1 = off)", elem_id="live-top-p", **_sampling("top_p"))
        seed = gr.Number(precision=0, label="Seed", elem_id="live-seed", **_sampling("seed"))
    sample.change(sampling_editable, sample, [temperature, top_k, top_p, seed], queue=False, **HUSH)
    return sample, temperature, top_k, top_p, seed


def launched(runtime: Runtime) -> dict:
    """Under a torchrun launch the explorers and their settings are the launch's: the controls say so."""
    K = runtime.launch_explorers
    return {} if K is None else {"interactive": False, "info": f"fixed by the torchrun launch ({K} ranks)"}


def explorers(runtime: Runtime, elem_id: str | None = None) -> gr.Slider:
    c = control(DecoderOptions, "explorers")
    return gr.Slider(
        c["minimum"],
        c["maximum"],
        value=runtime.launch_explorers or runtime.settings.explorers,
        step=1,
        label="Explorers K",
        elem_id=elem_id,
        **launched(runtime),
    )


def draft_box(runtime: Runtime, elem_id: str) -> gr.Checkbox:
    return gr.Checkbox(label="Draft chains", value=True, elem_id=elem_id, **launched(runtime))


def adapters_box(runtime: Runtime) -> gr.Checkbox:
    return gr.Checkbox(
        label="Inducing adapters",
        value=runtime.shipped_adapters,
        interactive=runtime.shipped_adapters,
        info="shipped for this model" if runtime.shipped_adapters else "none shipped for this model",
    )


def max_new(label: str, elem_id: str) -> gr.Slider:
    c = control(GenerationOptions, "max_new_tokens")
    return gr.Slider(c["minimum"], c["maximum"], value=c["value"], step=1, label=label, elem_id=elem_id)
