"""The app's MCP tools (``AppSettings.mcp_server``): Generate, Race and Analyse for agents, each the page's own run
(``live.live_steps``, ``race.race_steps``, ``analysis.analysed``) with the page's input checks and bounds — the model
queue (``concurrency_id="model"``: one model request at a time, ``queue_size`` waiting), ``request_seconds`` of model
time — answering one JSON object in place of the page's panels.

Gradio builds a tool's schema from its function (``gr.api``): the parameters are the fields of a typed record
(``Generation``, ``RaceCall``, ``Analysis``; ``bind`` spreads it), their defaults the page's controls' (the launch's
K), their descriptions the docstring's ``Args:`` lines, which ``_doc`` writes from the options' own help and ranges
(``dex_core.flags.control``), and ``_bounds`` puts the ranges into the schema too (``minimum``, ``maximum``).
"""

from __future__ import annotations

import inspect
import json
from dataclasses import asdict, dataclass, fields

import gradio as gr

from dex_core import DecoderOptions, DexConfig, DexError, GenerationOptions
from dex_core.flags import control
from dex_core.trace.events import EndEvent, RoundEvent

from ..host.state import Runtime
from . import live, race
from .analysis import analysed
from .handlers import StopRequests, bind, short_error
from .inputs import Inputs

PAGE = {f.name: f.default for f in fields(Inputs)}  # what the page's controls start at
OPTIONS = {  # a tool parameter -> the option it sets (its help and range)
    "max_new_tokens": GenerationOptions,
    "explorers": DecoderOptions,
    "chat": DexConfig,
    "temperature": GenerationOptions,
    "top_k": GenerationOptions,
    "top_p": GenerationOptions,
    "seed": GenerationOptions,
}
HELP = {  # where the option's own help does not fit the tool
    "prompt": "the prompt, as text",
    "sample": "sample with temperature, top_k, top_p and seed; false (the default): greedy",
    "temperature": "the sampling temperature, used when sample is true",
    "top_k": "sample only among the k most likely tokens; 0 = off",
    "top_p": "sample only within the top-p probability nucleus; 1 = off",
    "seed": "the sampling seed (the noise is keyed by seed and position)",
}
MODEL_QUEUE = {"concurrency_id": "model", "concurrency_limit": 1, "queue": True}  # the page's model requests'


@dataclass(frozen=True)
class Generation:
    """``dex_generate``'s parameters (the Live tab's, less its exploration details)."""

    prompt: str
    max_new_tokens: int = PAGE["max_new_tokens"]
    explorers: int = PAGE["explorers"]
    chat: bool = PAGE["chat"]
    sample: bool = PAGE["sample"]
    temperature: float = PAGE["temperature"]
    top_k: int = PAGE["top_k"]
    top_p: float = PAGE["top_p"]
    seed: int = PAGE["seed"]


@dataclass(frozen=True)
class RaceCall:
    """``dex_race``'s parameters."""

    prompt: str
    max_new_tokens: int = PAGE["max_new_tokens"]
    explorers: int = PAGE["explorers"]
    chat: bool = PAGE["chat"]


@dataclass(frozen=True)
class Analysis:
    """``dex_analyse``'s parameters."""

    prompt: str
    max_new_tokens: int = PAGE["max_new_tokens"]
    chat: bool = PAGE["chat"]


STOPS = StopRequests()  # an MCP call has no Stop: only the host's bound ends it early


def dex_generate(runtime: Runtime, call: Generation, request: gr.Request = None) -> str:
    """Generate text with DEX (depth exploration decoding) on this app's model. DEX is lossless: greedy, it gives
    plain autoregressive decoding's tokens (exactly in float32; in bfloat16 up to near-ties)."""
    *_, last = live.live_steps(runtime, STOPS, Inputs(**asdict(call)), request)
    if last.state == "error":
        raise short_error(DexError(last.detail))
    events = last.run.events
    end = events[-1] if isinstance(events[-1], EndEvent) else None
    tokens = [c.token for e in events if isinstance(e, RoundEvent) for c in e.commits]
    answer = {
        "text": runtime.tokenizer().decode(tokens, skip_special_tokens=True),
        "tokens": len(tokens),
        "rounds": sum(isinstance(e, RoundEvent) for e in events),
        "explorers": last.run.K,
        "depth_speedup": end.stats.depth_speedup if end else None,
        "stopped": None if end else _cut(runtime),
    }
    return json.dumps(answer)


def dex_race(runtime: Runtime, call: RaceCall, request: gr.Request = None) -> str:
    """Race DEX against plain autoregressive decoding (AR) on one prompt on this machine: both texts, whether they
    are identical, and each one's measured seconds (with the sequential backend also DEX's projected time on one
    device per explorer)."""
    *_, raced = race.race_steps(runtime, STOPS, Inputs(**asdict(call)), request)
    decode = raced.tokenizer.decode
    answer = {
        "ar_text": decode(raced.ar.tokens, skip_special_tokens=True),
        "dex_text": decode(raced.dex.tokens, skip_special_tokens=True),
        "identical": raced.done and raced.ar.tokens == raced.dex.tokens,
        "ar_seconds": raced.ar.clock,
        "dex_seconds": raced.dex.clock,
        "dex_projected_seconds": raced.projected.clock if raced.profile is not None else None,
        "facts": raced.facts(),
        "stopped": raced.stopped and f"stopped {raced.stopped}",
    }
    return json.dumps(answer)


def dex_analyse(runtime: Runtime, call: Analysis, request: gr.Request = None) -> str:
    """Analyse the model's greedy answer to a prompt: each token's earliest available depth (EAD: the first layer
    that already predicts it) and the speedups and costs that predicts for DEX at K = 2..8."""
    try:
        done = analysed(runtime, Inputs(**asdict(call)))
    except DexError as err:
        raise short_error(err) from None
    answer = {
        "text": done.tokenizer.decode(done.tokens, skip_special_tokens=True),
        "tokens": len(done.tokens),
        "readiness": done.found.readiness,
        "stopped": done.cut and f"stopped {done.cut}",
    }
    return json.dumps(answer)


RETURNS = {
    dex_generate: "a JSON object: text (the answer), tokens, rounds, explorers, depth_speedup (K over rounds per "
    "token), stopped (null, or why the host's bound ended the run early)",
    dex_race: "a JSON object: ar_text, dex_text, identical, ar_seconds, dex_seconds, dex_projected_seconds, facts "
    "(K, depths, rounds per token, cost per token), stopped",
    dex_analyse: "a JSON object: text (the greedy answer), tokens, readiness (per token its EAD; per K the "
    "predicted speedup and cost), stopped",
}


def _cut(runtime: Runtime) -> str:
    bound = runtime.settings.request_seconds
    return f"stopped at this host's limit of {bound} s of model time per request, with what it made"


def _doc(fn, record) -> str:
    """``fn``'s docstring with an ``Args:`` line per field of ``record`` (the option's help and range) and its
    ``Returns:``, as Gradio reads a tool's description from it."""
    lines = []
    for f in fields(record):
        option = control(OPTIONS[f.name], f.name) if f.name in OPTIONS else {}
        said = [HELP.get(f.name) or option.get("info", "")]
        if option.get("minimum") is not None and option.get("maximum") is not None:
            said.append(f"{option['minimum']} to {option['maximum']}")
        lines.append(f"    {f.name}: " + "; ".join(filter(None, said)))
    return f"{inspect.getdoc(fn)}\n\nArgs:\n" + "\n".join(lines) + f"\n\nReturns:\n    {RETURNS[fn]}"


def _bounds(demo: gr.Blocks, dependency, record) -> None:
    """The options' ranges in the tool's schema (Gradio gives a parameter its type only)."""
    for f, component in zip(fields(record), demo.fns[dependency["id"]].inputs):
        option = control(OPTIONS[f.name], f.name) if f.name in OPTIONS else {}
        schema = component.api_info()  # the dict the schema is built from
        schema.update({k: option[k] for k in ("minimum", "maximum") if option.get(k) is not None})


def register(demo: gr.Blocks, runtime: Runtime) -> None:
    """The tools, as endpoints of ``demo`` (inside its context; its API lists them too), the only ones its MCP
    server offers (``demo.tools``); the explorers start at the launch's K, as the page's controls do."""
    page_k = {"explorers": runtime.launch_explorers or runtime.settings.explorers}
    for fn, record in ((dex_generate, Generation), (dex_race, RaceCall), (dex_analyse, Analysis)):
        handler = bind(fn, runtime, record=record)
        signature = inspect.signature(handler)
        handler.__signature__ = signature.replace(
            parameters=[
                p.replace(default=page_k.get(p.name, p.default)) for p in signature.parameters.values()
            ]
        )
        handler.__doc__ = _doc(fn, record)
        dependency = gr.api(handler, api_name=fn.__name__, **MODEL_QUEUE)
        _bounds(demo, dependency, record)
        demo.tools.append(fn.__name__)
