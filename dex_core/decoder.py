"""``DexDecoder``: the library's entry point. Options in, trace events or a ``GenerationResult`` out."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import torch

from .adapters import choose_depths, resolve_adapters
from .config import DecoderOptions, DexError, GenerationOptions, pick, stage_bounds
from .cost import ModelCost
from .engine import run_rounds
from .explorer import Explorer
from .device import dtype_name, resolve_prune
from .models import model_view
from .proposal import adapter_ranking, proposal_heads
from .request import make_request
from .results import GenerationResult
from .trace import round_commits, start_event
from .transport import LocalLink


class DexDecoder:
    """Depth Exploration Decoding over a Hugging Face causal LM.

    Options are the fields of ``DecoderOptions`` (pass ``options=``, keywords, or both: keywords win):
    ``depths`` is the exploration set (strictly increasing, ending at the model's layer count), or
    ``explorers`` = K asks for the best set for K stored with the adapter file when there is one (the
    shipped adapters carry K = 2 and K = 4), else a uniform split (``depth_choice`` says which). ``adapters`` — 'auto' (the shipped set when the model
    is the default model), 'default', 'none', an adapter file, or a mapping from non-final depths to
    modules — are applied to a depth's hidden state before the LM head; they change only which branch
    survives, never the committed tokens. ``proposal_vocab`` sets the rows of the non-final stages'
    light proposal heads (``dex_core.proposal``; the final stage always scores the whole vocabulary).
    ``tokenizer`` (optional) adds token text to traces and derives a token ranking when no adapter
    file stores one.

    ``backend="sequential"`` runs every explorer in this process, one after another each round.
    ``backend="distributed"`` starts K explorer processes on torch.distributed (one per device in
    ``devices``: default ``cuda:0..K-1``, taking the GPUs in turn when fewer are visible (rows staged
    through the host), else CPU with ``threads`` threads each); they stay up across calls until ``close()`` (or the end of a ``with`` block). Same API,
    same tokens, same trace events.
    """

    def __init__(self, model, options: DecoderOptions | None = None, *, tokenizer=None, **overrides):
        if options is not None and not isinstance(options, DecoderOptions):
            raise DexError(f"options must be a DecoderOptions (or a DexConfig); got {type(options).__name__}")
        self.options = pick(DecoderOptions, options or DecoderOptions(), **overrides)
        self.model = model
        self.view = model_view(model)
        self.depths, self.depth_choice = choose_depths(model, self.options)
        self.decs = self.options.decs
        self.tokenizer = tokenizer
        self.trace_top = self.options.trace_top
        if self.trace_top > self.view.vocab:
            raise DexError(f"trace_top must be at most the model's vocabulary of {self.view.vocab} tokens; "
                           f"got {self.trace_top}")
        self.adapters = resolve_adapters(self.options.adapters, model, self.depths)
        heads = proposal_heads(self.view, self.depths, self.options.proposal_vocab,
                               adapter_ranking(self.options.adapters, model), tokenizer)
        self.proposal_vocab = len(heads[0]) if heads else self.view.vocab
        self.shortlist = heads[0].ids.cpu() if heads else None  # the light heads' token ids
        self.cost = ModelCost.of(model, self.adapters, self.proposal_vocab).weights()  # for the trace's start event
        self.backend = self.options.backend
        self.group = None
        self.explorers: list[Explorer] = []
        if self.backend == "distributed":
            from .group import ExplorerGroup, resolve_devices

            self.prune = resolve_prune(self.options.prune, resolve_devices(self.options.devices, self.K))
            self.group = ExplorerGroup(model, self.depths, self.adapters, replace(self.options, prune=self.prune),
                                       self.shortlist)
        else:
            self.prune = resolve_prune(self.options.prune, [self.view.device.type])
            self.explorers = [Explorer(self.view, k, self.K, *stage_bounds(self.depths, k),
                                       self.adapters.get(self.depths[k]), heads.get(k)) for k in range(self.K)]

    @property
    def K(self) -> int:
        return len(self.depths)

    def _text(self, token: int) -> str | None:
        return None if self.tokenizer is None else self.tokenizer.decode([token])

    def generate(self, input_ids, max_new_tokens: int | None = None, *, options: GenerationOptions | None = None,
                 **overrides) -> GenerationResult:
        """Run to the end; ``overrides`` are ``GenerationOptions`` fields (temperature, top_k, top_p, seed, …)."""
        return GenerationResult.from_trace(list(self.stream(input_ids, max_new_tokens, options=options, **overrides)))

    @torch.no_grad()
    def stream(self, input_ids, max_new_tokens: int | None = None, *, options: GenerationOptions | None = None,
               **overrides) -> Iterator[dict]:
        """Yield trace events: a start event, one event per round, and an end event with the stats."""
        opts = GenerationOptions.build(options, max_new_tokens=max_new_tokens, **overrides)
        request = make_request(self.view, input_ids, opts)
        yield start_event("dex", self.depths, self.view.num_layers, request, self.decs, self.adapters,
                          self.proposal_vocab, self.depth_choice, self.prune, self.cost,
                          dtype=dtype_name(self.view.dtype), device=self._device(), draft=self.options.draft)
        if self.group is not None:
            for event in self.group.run(request):
                yield self._add_text(event)
            return
        yield from run_rounds(self.view, self.depths, self.explorers, LocalLink(self.K), request, self.decs,
                              self.trace_top, self._text if self.tokenizer is not None else None, self.prune,
                              self.options.draft)

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

