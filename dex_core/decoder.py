"""``DexDecoder``: the library's entry point. Options in, trace events or a ``GenerationResult`` out."""

from __future__ import annotations

from collections.abc import Iterator

import torch

from .algorithm.lattice import NO_PROPOSAL
from .config import DecoderOptions, DexError, GenerationOptions, pick
from .distributed import torchrun
from .distributed.group import ExplorerGroup
from .log import stderr
from .model.adapters import model_identity
from .model.cost import ModelCost
from .model.load import load_model
from .model.stage_load import skeleton
from .model.view import model_view
from .runtime.request import Request, make_request, warn
from .runtime.results import GenerationResult
from .runtime.schedule import InProcess, Schedule
from .runtime.scoring import Scored, score_prompt
from .runtime.settings import RunSettings, resolve_run
from .runtime.turns import Turns
from .runtime.unloaded import UnloadedModel, device_type
from .trace.build import start_event, with_text
from .trace.events import Event
from .values import integer


def model_source(
    spec: str, options: DecoderOptions, *, dtype="auto", device="auto", tokenizer=None, log=stderr
):
    """Model ``spec`` as a decoder of ``options`` takes it, with its tokenizer: loaded in this process (the sequential
    backend), or read without weights (``UnloadedModel``: explorer processes read their parts)."""
    if options.backend == "sequential":
        model, loaded = load_model(spec, dtype=dtype, device=device, log=log)
        return model, tokenizer or loaded
    unloaded = UnloadedModel.read(spec, dtype, device_type(options.devices, device), tokenizer, log)
    return unloaded, unloaded.tokenizer


def settings_of(model, options: DecoderOptions, tokenizer=None) -> RunSettings:
    """The run's settings of ``options`` on ``model`` (loaded, or an ``UnloadedModel``): what a decoder runs."""
    if isinstance(model, UnloadedModel):
        return model.settings(options)
    view = model_view(model)
    kind = device_type(options.devices) if options.backend == "distributed" else view.device.type
    return resolve_run(model, view, options, kind, tokenizer)


def _launched(spec: str, group) -> UnloadedModel:
    """What rank 0 of a torchrun launch holds of the whole model: its shapes, config, tokenizer and identity (its
    part holds the embeddings)."""
    shape = skeleton(group.config, group.view.dtype, group.folder)  # the whole model's shapes, no weights
    kind = torch.device(group.devices[-1]).type
    identity = model_identity(group.view.model)
    return UnloadedModel(spec, group.folder, group.config, group.tokenizer, identity, model_view(shape), kind)


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

    def __init__(
        self,
        model,
        options: DecoderOptions | None = None,
        *,
        tokenizer=None,
        schedule: Schedule | None = None,
        settings: RunSettings | None = None,
        **overrides,
    ):
        """``model``: a loaded model, or an ``UnloadedModel`` (this process holds no weights: explorer processes read
        their parts of the checkpoint). ``schedule``: where the explorers run (default: as ``options.backend`` says,
        in this process or on explorer processes this decoder starts); its settings are the run's. ``settings``:
        the options resolved already (``DecoderPool`` resolves them to find a decoder)."""
        options = _options(options, overrides)
        unloaded = isinstance(model, UnloadedModel)
        if unloaded and options.backend == "sequential":
            options = pick(DecoderOptions, options, backend="distributed")  # no weights here to run
        if options.backend == "torchrun" and schedule is None:
            raise DexError(
                "under torchrun each rank reads its own part of the checkpoint: use "
                "DexDecoder.from_pretrained(spec, backend='torchrun')"
            )
        self.view = model.view if unloaded else model_view(model)
        self.tokenizer = tokenizer or (model.tokenizer if unloaded else None)
        self.settings = settings = (
            schedule.settings if schedule is not None else settings or settings_of(model, options, tokenizer)
        )
        if unloaded and model.device_type == "cpu" and options.devices is None:
            options = pick(DecoderOptions, options, devices=("cpu",) * settings.K)
        self.options, self.backend = options, options.backend
        self.identity = model.identity if unloaded else model_identity(model)  # for the start event
        self.model = (
            None if unloaded else model
        )  # None when explorer processes read the checkpoint themselves
        self.cost_model = ModelCost.of(self.view.model, settings.adapters, settings.proposal_vocab)
        self.cost = self.cost_model.weights()  # for the trace's start event
        if schedule is None and options.backend == "sequential":
            schedule = InProcess(self.view, settings)
        elif schedule is None:
            schedule = ExplorerGroup(settings, self.view.model, options, model.folder if unloaded else None)
        self.schedule = schedule
        self._turns = Turns()  # its explorers serve one run at a time: the newest

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
        (``device`` 'cpu' puts every explorer on the CPU). Torchrun: every rank of the launch joins the group;
        rank 0 gets the decoder, and every other rank serves rank 0's requests until rank 0 closes it, then ends
        its process (exit code 0)."""
        options = _options(options, overrides)
        if options.backend == "torchrun":
            group = torchrun.join(spec, options, dtype, device, log)
            if group.rank != 0:
                group.follow()
                raise SystemExit(0)
            return cls(_launched(spec, group), options, tokenizer=tokenizer, schedule=group)
        model, tokenizer = model_source(
            spec, options, dtype=dtype, device=device, tokenizer=tokenizer, log=log
        )
        return cls(model, options, tokenizer=tokenizer)

    depths = property(lambda self: self.settings.depths)
    depth_choice = property(lambda self: self.settings.depth_choice)
    decs = property(lambda self: self.settings.decs)
    trace_top = property(lambda self: self.settings.trace_top)
    prune = property(lambda self: self.settings.prune)

    @property
    def adapters(self) -> dict:
        """Depth -> adapter module (None: the module lives in an explorer process)."""
        if isinstance(self.schedule, InProcess):
            return self.schedule.adapters
        return dict.fromkeys(self.settings.adapters.depths)

    @property
    def explorers(self) -> list:
        """The explorers this process runs (none on explorer processes)."""
        return self.schedule.explorers if isinstance(self.schedule, InProcess) else []

    @property
    def group(self):
        """The explorer processes' group (None: every explorer runs in this process)."""
        return None if isinstance(self.schedule, InProcess) else self.schedule

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

    def request(
        self,
        input_ids,
        max_new_tokens: int | None = None,
        *,
        options: GenerationOptions | None = None,
        pipeline: bool = False,
        logprobs: int | None = None,
        **overrides,
    ) -> Request:
        """A checked request (``dex_core.runtime.request.Request``) for this decoder's model: the prompt's token ids
        and ``GenerationOptions`` (``overrides``: their fields, winning over ``options``); the settings of the model's
        generation config it does not apply are in its ``notes`` (for the caller to show; ``stream`` given token ids
        says them in a ``GenerationConfigWarning``). ``pipeline``: AR through the same stages instead of DEX (see
        ``stream``). ``logprobs``: each committed token's commit record carries its log-probability at the final
        depth and this many likeliest alternatives (0 to 20; this process's explorers only: the sequential
        backend)."""
        opts = GenerationOptions.build(options, max_new_tokens=max_new_tokens, **overrides)
        if logprobs is not None and not isinstance(self.schedule, InProcess):
            raise DexError(
                "log-probabilities are read in this process's explorers: the sequential backend only"
            )
        return make_request(self.view, input_ids, opts, pipeline=pipeline, logprobs=logprobs)

    def score(self, input_ids, top: int = 1) -> Scored:
        """The prompt ``input_ids`` (token ids) scored by the unmodified model: each token's log-probability given
        those before it and the ``top`` likeliest there, and after it (``runtime.scoring``). The model's forward runs
        in this process: the sequential backend only (explorer processes hold parts of it)."""
        if self.model is None:
            raise DexError(
                "scoring a prompt runs the whole model in one process: the sequential backend only (explorer "
                "processes each hold a part of it)"
            )
        return score_prompt(self.model, list(input_ids), top)

    def generate(self, input_ids, max_new_tokens: int | None = None, **kwargs) -> GenerationResult:
        """Run to the end (arguments as ``stream``'s)."""
        return GenerationResult.from_trace(list(self.stream(input_ids, max_new_tokens, **kwargs)))

    @torch.no_grad()
    def stream(
        self, input_ids, max_new_tokens: int | None = None, *, node_text: bool = False, **kwargs
    ) -> Iterator[Event]:
        """Yield typed trace events (``dex_core.trace.events``): a start event, one event per round, and an end
        event with the stats. ``input_ids``: a ``Request`` built already (``request``), or the prompt's token ids,
        with ``request``'s arguments (``options``, ``pipeline``, ``GenerationOptions`` fields).

        ``pipeline=True``: AR through the same K stages on the same devices (pipeline-parallel AR at batch 1,
        the like-for-like baseline where the model only fits across them): no stage but the last proposes, so
        each token walks all K stages in K rounds and equals the AR reference's; no adapter, light head, DECS
        or draft chain runs, and the trace says so.

        With a tokenizer, the committed tokens' text is in the trace; ``node_text=True`` adds every lattice node's
        and top candidate's (what a drawing of the lattice shows: the app, a saved trace), decoded for each round."""
        if isinstance(input_ids, Request):
            if max_new_tokens is not None or kwargs:
                raise DexError("a Request carries its options: give them to DexDecoder.request, not stream")
            request = input_ids
        else:
            request = warn(
                self.request(input_ids, max_new_tokens, **kwargs), stacklevel=4
            )  # past no_grad's frame
        yield start_event(
            request, self.view, self.settings, cost=self.cost, device=self._device(), identity=self.identity
        )
        steps = self.schedule.run(request)
        for event in steps if self.schedule.shares else self._turns.take(steps):
            yield event if self.tokenizer is None else with_text(event, self._text, node_text)

    def share(self, most: int) -> None:
        """Let up to ``most`` requests in flight on this decoder share each round (``dex_core.runtime.crew``): each
        keeps its own lattice, sampler and KV lane, and gets exactly the tokens it would get alone; every explorer
        runs one step a round over all their rows (explorer processes and torchrun ranks: one send of every
        request's rows and one exchange of their choices a round). 1 (the default): one run at a time, a newer run
        stopping the older."""
        self.schedule.share(integer(most, "max_batch", 1))

    def _device(self) -> str:
        """Where the token choices are made: the final explorer's device."""
        return str(self.schedule.devices[-1])

    def close(self) -> None:
        """End the explorer processes of a distributed schedule (a no-op in this process)."""
        self.schedule.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
