"""The bundled example (assets/traces/example.json) is a run of the page's defaults: Generate on its prompt with no
control touched makes the same run. A default changed without making the example again fails here (remake it with
``python scripts/example_trace.py``). Reads the trace only: no model."""

import dataclasses

from app.host.settings import TRACE_TOP, AppSettings
from app.ui.debugger import EXAMPLE, TRACES
from app.ui.inputs import Inputs
from dex_core.config import DraftBounds
from dex_core.device import resolve_dtype
from dex_core.runtime.settings import resolve_prune
from dex_core.trace.events import RoundEvent, StartEvent
from dex_core.trace.files import load_trace


def test_the_bundled_example_was_made_with_the_options_generate_sends_by_default():
    events, meta = load_trace(TRACES / f"{EXAMPLE}.json")
    start, config = events[0], Inputs(prompt=meta["prompt"]).config()
    assert isinstance(start, StartEvent) and start.method == "dex"
    assert meta["model"] == AppSettings.model and start.made_on == "cpu"
    assert start.dtype == str(resolve_dtype(AppSettings.dtype, start.made_on)).removeprefix("torch.")
    recorded = {
        "explorers": start.explorers,
        "depths chosen": start.depth_choice != "given",
        "adapters": bool(start.adapter_depths),
        "decs": start.decs,
        "sampling": start.sampling,
        "max_new_tokens": start.max_new_tokens,
        "prune": start.prune,
        "draft": start.draft,
    }
    defaults = {
        "explorers": config.explorers,
        "depths chosen": config.depths is None,  # no depths given: the stored best set or a uniform split
        "adapters": config.adapters != "none",
        "decs": config.decs,
        "sampling": {
            "temperature": config.temperature,
            "top_k": config.top_k,
            "top_p": config.top_p,
            "seed": 0,
        },
        "max_new_tokens": config.max_new_tokens,
        "prune": resolve_prune(config.prune, [start.made_on]),  # "auto": the CPU's row budget
        "draft": dataclasses.asdict(DraftBounds.parse(config.draft)),
    }
    assert config.seed == 0 and recorded == defaults
    tops = [len(n.top) for e in events if isinstance(e, RoundEvent) for n in e.nodes]
    assert max(tops) == TRACE_TOP  # the candidates the app records per node


def test_the_prompt_box_opens_on_the_examples_prompt_and_its_load_writes_only_another_traces(
    tmp_path, monkeypatch
):
    """A load event answering late on a busy server once overwrote a prompt already typed with the example's (the
    page opened with the default box's text); now the box is built with the example's prompt and the load writes
    only the prompt of another bundled trace named by ``?trace=``."""
    import gradio as gr

    from app.ui import debugger as dbg
    from app.ui import page
    from dex_core.trace.files import save_trace

    events, meta = load_trace(TRACES / f"{EXAMPLE}.json")
    save_trace(tmp_path / f"{EXAMPLE}.json", events, meta)
    save_trace(tmp_path / "other.json", events, {**meta, "prompt": "another prompt"})
    monkeypatch.setattr(dbg, "TRACES", tmp_path)
    dbg._bundled.cache_clear()
    monkeypatch.setattr(
        dbg, "_bundled", dbg._bundled.__wrapped__
    )  # this folder's files, nothing cached after

    def loaded(**query):
        return page.example_prompt(type("Request", (), {"query_params": query})())

    assert page.opening_prompt("fallback") == meta["prompt"]
    assert loaded() == loaded(trace=EXAMPLE) == loaded(trace="unknown") == gr.skip()
    assert loaded(trace="other") == "another prompt"
    monkeypatch.setattr(dbg, "TRACES", tmp_path / "none")
    assert page.opening_prompt("fallback") == "fallback" and loaded() == gr.skip()
