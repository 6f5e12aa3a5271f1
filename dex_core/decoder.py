"""``DexDecoder``: the library's entry point. Options in, trace events or a ``GenerationResult`` out."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import torch

from .algorithm.lattice import NO_PROPOSAL
from .config import DecoderOptions, DexError, GenerationOptions, pick, stage_bounds
from .distributed import torchrun
from .distributed.group import ExplorerGroup
from .log import stderr
from .model.adapters import model_identity
from .model.cost import ModelCost
from .model.explorer import Explorer
from .model.load import load_model
from .model.proposal import ProposalHead
from .model.stage_load import skeleton
from .model.view import model_view
from .runtime.engine import run_rounds
from .runtime.links import LocalLink
from .runtime.request import make_request
from .runtime.results import GenerationResult
from .runtime.settings import RunSettings, resolve_run
from .runtime.unloaded import UnloadedModel, device_type
from .trace.events import round_commits, start_event


def _options(options, overrides) -> DecoderOptions:
    if options is not None and not isinstance(options, DecoderOptions):
        raise DexError(f"options must be a DecoderOptions (or a DexConfig); got {type(options).__name__}")
    return pick(DecoderOptions, options or DecoderOptions(), **overrides)


class DexDecoder:
    """Depth Exploration Decoding over a Hugging Face causal LM.

    Options are the fields of ``DecoderOptions`` (pass ``options=``, keywords, or both: keywords win):
    ``depths`` is the exploration set (strictly increasing, ending at the model's layer count), or
    ``explorers`` = K asks for the best set for K stored with the adapter file when there is one (the
    shipped adapters carry K = 2 and K = 4), else a uniform split (``depth_choice`` says which). ``adapters`` —
    'auto' (the shipped set when the model is the default model), 'default', 'none', an adapter file, or a
    mapping from non-final depths to modules — are applied to a depth's hidden state before the LM head; they
    change only which branch survives, never the committed tokens. ``proposal_vocab`` sets the rows of the
    non-final stages' light proposal heads (``dex_core.model.proposal``; the final stage always scores the whole
    vocabulary). ``tokenizer`` (optional) adds token text to traces and derives a token ranking when no adapter
    file stores one. The options are resolved once into ``settings`` (``RunSettings``).

    ``backend="sequential"`` runs every explorer in this process, one after another each round.
    ``backend="distributed"`` starts K explorer processes on torch.distributed (one per device in
    ``devices``: default ``cuda:0..K-1``, taking the GPUs in turn when fewer are visible (rows staged
    through the host), else CPU with ``threads`` threads each); they stay up across calls until ``close()``
    (or the end of a ``with`` block). Same API, same tokens, same trace events.

    ``DexDecoder(model)`` takes a loaded model (its explorer processes receive their parts' tensors from this
    process). ``DexDecoder.from_pretrained(spec)`` takes a model spec: distributed, this process then holds the
    config and tokenizer only and each explorer reads its own part from the checkpoint — the way to run a
    model that does not fit one device.
    """

    def __init__(self, model, options: DecoderOptions | None = None, *, tokenizer=None, **overrides):
        options = _options(options, overrides)
        if options.backend == "torchrun":
            raise DexError(
                "under torchrun each rank reads its own part of the checkpoint: use "
                "DexDecoder.from_pretrained(spec, backend='torchrun')"
            )
        view = model_view(model)
        kind = device_type(options.devices) if options.backend == "distributed" else view.device.type
        settings = resolve_run(model, view, options, kind, tokenizer)
        self._setup(view, settings, options, tokenizer, model=model)

    @classmethod
    def from_pretrained(
        cls,
        spec: str = "default",
        options: DecoderOptions | None = None,
        *,
        dtype="auto",
        device="auto",
        tokenizer=None,
        log=stderr,
        **overrides,
    ) -> DexDecoder:
        """A decoder for model ``spec`` ('default', a directory, a .gguf file or a hub id) in ``dtype`` ('auto':
        float32 on CPU, the checkpoint's half precision on CUDA). Sequential: the model is loaded in this process
        on ``device``. Distributed: this process reads the config, the tokenizer and 64 rows of the embedding
        (the adapters' fit) and no other weights; each explorer process reads its own part of the checkpoint
        (``device`` 'cpu' puts every explorer on the CPU)."""
        options = _options(options, overrides)
        if options.backend == "sequential":
            model, loaded = load_model(spec, dtype=dtype, device=device, log=log)
            return cls(model, options, tokenizer=tokenizer or loaded)
        if options.backend == "torchrun":
            return cls._on_torchrun(spec, options, dtype, device, tokenizer, log)
        kind = device_type(options.devices, device)
        return cls.from_unloaded(UnloadedModel.read(spec, dtype, kind, tokenizer, log), options, log=log)

    @classmethod
    def from_unloaded(
        cls, model: UnloadedModel, options: DecoderOptions | None = None, *, settings=None, log=stderr
    ) -> DexDecoder:
        """A decoder of ``model``, which this process does not load (``UnloadedModel.read``), on explorer
        processes (the distributed backend), each of which reads its own part of the checkpoint. ``settings``:
        the run's, when the caller resolved them already (``model.settings(options)``)."""
        options = _options(options, {"backend": "distributed"})
        settings = settings or model.settings(options, log)
        if model.device_type == "cpu" and options.devices is None:
            options = pick(DecoderOptions, options, devices=("cpu",) * settings.K)
        decoder = cls.__new__(cls)
        decoder._setup(
            model.view, settings, options, model.tokenizer, folder=model.folder, identity=model.identity
        )
        return decoder

    @classmethod
    def _on_torchrun(cls, spec, options: DecoderOptions, dtype, device, tokenizer, log):
        """Every rank of a torchrun launch joins the group; rank 0 gets the decoder, and every other rank serves
        rank 0's requests until rank 0 closes it, then ends its process (exit code 0)."""
        group = torchrun.join(spec, options, dtype, device, log)
        if group.rank != 0:
            group.follow()
            raise SystemExit(0)
        shape = skeleton(group.config, group.view.dtype, group.folder)  # the whole model's shapes, no weights
        decoder = cls.__new__(cls)
        tokenizer = tokenizer or group.tokenizer
        identity = model_identity(group.view.model)  # rank 0's part holds the embeddings
        decoder._setup(model_view(shape), group.settings, options, tokenizer, group=group, identity=identity)
        return decoder

    def _setup(
        self,
        view,
        settings: RunSettings,
        options: DecoderOptions,
        tokenizer,
        *,
        model=None,
        folder=None,
        group=None,
        identity=None,
    ):
        self.options, self.view, self.settings, self.tokenizer = options, view, settings, tokenizer
        self.identity = identity or model_identity(view.model)  # for the start event (a skeleton's: given)
        self.model = model  # None when explorer processes read the checkpoint themselves
        self.cost_model = ModelCost.of(view.model, settings.adapters, settings.proposal_vocab)
        self.cost = self.cost_model.weights()  # for the trace's start event
        self.backend, self.group, self.explorers = options.backend, group, []
        if self.backend in ("distributed", "torchrun"):
            self.group = group or ExplorerGroup(settings, view.model, options, folder)
            self._adapters = dict.fromkeys(
                settings.adapters.depths
            )  # the modules live in the explorer processes
            return
        self._adapters = settings.adapters.build(settings.depths, view.device, view.dtype)
        head = (
            None if settings.shortlist is None else ProposalHead(view, settings.shortlist)
        )  # shared by stages
        self.explorers = [
            Explorer(view, k, self.K, *stage_bounds(settings.depths, k), self._adapters.get(d), head)
            for k, d in enumerate(settings.depths)
        ]
        if settings.compile:
            for e in self.explorers:
                e.compile_step()

    depths = property(lambda self: self.settings.depths)
    depth_choice = property(lambda self: self.settings.depth_choice)
    decs = property(lambda self: self.settings.decs)
    trace_top = property(lambda self: self.settings.trace_top)
    prune = property(lambda self: self.settings.prune)
    adapters = property(
        lambda self: self._adapters, doc="depth -> adapter module (None: in an explorer process)"
    )
    proposal_vocab = property(lambda self: self.settings.proposal_vocab or self.view.vocab)
    shortlist = property(
        lambda self: (
            None
            if self.settings.shortlist is None
            else torch.tensor(self.settings.shortlist, dtype=torch.long, device="cpu")
        ),
        doc="the light heads' token ids (None: full heads)",
    )

    @property
    def K(self) -> int:
        return len(self.depths)

    def _text(self, token: int) -> str | None:
        return None if self.tokenizer is None or token == NO_PROPOSAL else self.tokenizer.decode([token])

    def generate(
        self,
        input_ids,
        max_new_tokens: int | None = None,
        *,
        options: GenerationOptions | None = None,
        pipeline: bool = False,
        **overrides,
    ) -> GenerationResult:
        """Run to the end; ``overrides`` are ``GenerationOptions`` fields (temperature, top_k, top_p, seed, …);
        ``pipeline``: AR through the same stages instead of DEX (see ``stream``)."""
        return GenerationResult.from_trace(
            list(self.stream(input_ids, max_new_tokens, options=options, pipeline=pipeline, **overrides))
        )

    @torch.no_grad()
    def stream(
        self,
        input_ids,
        max_new_tokens: int | None = None,
        *,
        options: GenerationOptions | None = None,
        pipeline: bool = False,
        **overrides,
    ) -> Iterator[dict]:
        """Yield trace events: a start event, one event per round, and an end event with the stats.

        ``pipeline=True``: AR through the same K stages on the same devices (pipeline-parallel AR at batch 1,
        the like-for-like baseline where the model only fits across them): no stage but the last proposes, so
        each token walks all K stages in K rounds and equals the AR reference's; no adapter, light head, DECS
        or draft chain runs, and the trace says so."""
        opts = GenerationOptions.build(options, max_new_tokens=max_new_tokens, **overrides)
        request = dataclasses.replace(make_request(self.view, input_ids, opts), pipeline=pipeline)
        yield start_event(
            request, self.view, self.settings, cost=self.cost, device=self._device(), identity=self.identity
        )
        if self.group is not None:
            for event in self.group.run(request):
                yield self._add_text(event)
            return
        yield from run_rounds(
            self.view,
            self.settings,
            self.explorers,
            LocalLink(),
            request,
            self._text if self.tokenizer is not None else None,
        )

    def _device(self) -> str:
        """Where the token choices are made: this model's device, or the final explorer's."""
        return str(self.group.devices[-1]) if self.group is not None else str(self.view.device)

    def _add_text(self, event: dict) -> dict:
        """Token text for events made by explorer processes (which hold no tokenizer)."""
        if self.tokenizer is not None and event["event"] == "round":
            for node in event["nodes"]:
                node["text"] = self._text(node["token"])
                node["top"] = [[t, p, self._text(t)] for t, p, *_ in node["top"]]
            for commit in round_commits(event) + [event["commit"] or {"token": 0}]:  # "commit": the first
                commit["text"] = self._text(commit["token"])
        return event

    def close(self) -> None:
        """End the explorer processes of the distributed backend (a no-op for the sequential one)."""
        if self.group is not None:
            self.group.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
