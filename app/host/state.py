"""What the app's server holds (``Runtime``): one shared, read-only model per process, loaded on first use — or,
when explorer processes hold it, what the parent holds of it (``UnloadedModel``) and its explorer groups, keyed by
the run's settings (``RunSettings``), or the torchrun launch's one group — this machine's seconds profile, and what
finished runs teach the next estimate. Its settings: ``app.host.settings``.

Sessions keep only typed trace events (``dex_core.trace.events``, in ``gr.State``), bounded by ``app.host.sessions``
(memory) and ``app.host.files`` (disk), which the runtime holds. Model work is serialized by the app's event
concurrency settings.
"""

from __future__ import annotations

import atexit
import threading
from dataclasses import replace

import torch

from dex_core import DecoderPool, DexConfig, DexDecoder, DexError, encode_prompt, load_model, shipped_adapters
from dex_core.analysis.forecast import BASIS, Forecast, RoundCost, ar_seconds, forecast, time_rounds
from dex_core.analysis.profile import measure_profile, one_row, one_row_seconds
from dex_core.runtime.unloaded import UnloadedModel, device_type
from dex_core.trace.events import EndEvent

from .files import Files
from .gate import Calls
from .learned import SLOW_SECONDS, Learned
from .sessions import Sessions
from .settings import TRACE_TOP, AppSettings
from .sharing import Sharing
from .uploads import Uploads

TIMING_PROMPT = (
    "Give three tips for staying focused while studying."  # a round timed for first estimates: a chat prompt
)
WHOLE_MODEL = (
    "{what} runs the whole model in this server's process, and this server runs DEX distributed "
    "(DEX_BACKEND=distributed): each explorer process holds only its part of the model, and this process "
    "none of it. Serve the app with the sequential backend (DEX_BACKEND=sequential) for {what}."
)


class Runtime:
    def __init__(self, settings: AppSettings | None = None):
        self.settings = settings or AppSettings.from_env()
        self._lock = threading.Lock()
        self.sharing = Sharing()  # Live runs share the model; a Race or an Analysis has it alone
        self._model = self._tokenizer = None
        self._pool: DecoderPool | None = None  # decoders by run settings, or the torchrun launch's one
        self.files = Files(self.settings)  # the app's folder, exports, what the gate serves
        self.uploads = Uploads(self.settings, self.files)  # uploads, counted from their first byte
        self.calls = Calls()  # malformed API calls, counted; a flood rate-limited
        self.sessions = Sessions(self.settings, self.files)  # what sessions hold in memory, and its budget
        self._profiles: dict[int, dict] = {}  # seconds profiles by proposal-head rows
        self._one_row: dict[int, dict] = {}  # one-row seconds by proposal-head rows: first estimates
        self._learned: dict[int, Learned] = {}  # by K: what finished runs teach the next first estimate
        self._rounds: dict[str, RoundCost] = {}  # by run settings: a round timed here, for first estimates
        self._drawn: dict[str, float] = {}  # by run settings: the seconds the page adds to such a round

    @property
    def distributed(self) -> bool:
        """No process holds the whole model: explorer processes (distributed) or torchrun ranks (torchrun)."""
        return self.settings.backend in ("distributed", "torchrun")

    @property
    def launch_explorers(self) -> int | None:
        """K when a torchrun launch fixed the explorers and their settings (None: the controls choose)."""
        launched = self._pool.launched if self._pool is not None else None
        return None if launched is None else launched.K

    def join_torchrun(self) -> None:
        """Every rank of ``torchrun ... app/main.py --backend torchrun``, before the app launches: join the group
        (``DexDecoder.from_pretrained(backend='torchrun')``). Rank 0 keeps the decoder, which every request
        then uses; every other rank serves rank 0's requests until rank 0 ends, then exits."""
        options = replace(
            DexConfig(model=self.settings.model).decoder(), backend="torchrun", trace_top=TRACE_TOP
        )
        self._pool = DecoderPool.open(
            self.settings.model, options, dtype=self.settings.dtype, device=self.settings.device
        )
        self._tokenizer = self._pool.tokenizer
        atexit.register(self.close)  # the other ranks end when rank 0 closes the group

    @property
    def loaded(self) -> bool:
        return self._tokenizer is not None

    def prepare(self, log=None) -> None:
        """What a first request needs, loaded once: sequential, the whole model and its tokenizer; distributed,
        what the parent holds (``UnloadedModel``: the model's folder, the default model and .gguf files converted
        once, its config and tokenizer) and no weights (each explorer process reads its own part). ``log`` gets a
        line per stage (fetch, convert, load)."""
        with self._lock:
            if self._tokenizer is not None:
                return
            if self.distributed:
                kind = device_type(None, self.settings.device)
                unloaded = UnloadedModel.read(
                    self.settings.model, self.settings.dtype, kind, log=log or (lambda line: None)
                )
                self._tokenizer = unloaded.tokenizer
                self._pool = DecoderPool(unloaded, self.settings.max_groups)
            else:
                more = {"log": log} if log is not None else {}
                self._model, self._tokenizer = load_model(
                    self.settings.model, dtype=self.settings.dtype, device=self.settings.device, **more
                )
                self._pool = DecoderPool(self._model, self.settings.max_groups, tokenizer=self._tokenizer)

    def tokenizer(self):
        self.prepare()
        return self._tokenizer

    def need_whole_model(self, what: str) -> None:
        """DexError under the distributed backend, where no process holds the whole model (``what``: the feature
        that needs it)."""
        if self.distributed:
            raise DexError(WHOLE_MODEL.format(what=what))

    def model(self, what: str = "this"):
        """(model, tokenizer) of the sequential backend, loading them on first use (``need_whole_model``)."""
        self.need_whole_model(what)
        self.prepare()
        return self._model, self._tokenizer

    def profiled(self, decoder: DexDecoder) -> bool:
        return decoder.proposal_vocab in self._profiles

    def profile(self, decoder: DexDecoder) -> dict:
        """This machine's seconds profile for the decoder's model and proposal heads
        (``dex_core.analysis.profile``: measured once, about half a minute, then cached on disk and here)."""
        model, _ = self.model("the seconds profile")
        with self._lock:
            if decoder.proposal_vocab not in self._profiles:
                self._profiles[decoder.proposal_vocab] = measure_profile(
                    model, decoder.proposal_vocab, log=lambda _: None
                )
            return self._profiles[decoder.proposal_vocab]

    def one_row(self, rows: int) -> dict:
        """Seconds of a layer, the full head and a light head of ``rows`` rows at one row on this machine: from
        the full profile when a race measured it, else timed once here (a fraction of a second)."""
        model, _ = self.model("the estimate")
        with self._lock:
            if rows not in self._one_row:
                full = self._profiles.get(rows)
                self._one_row[rows] = (
                    one_row(full) if full and "layer" in full else one_row_seconds(model, rows)
                )
            return self._one_row[rows]

    def round_cost(self, decoder: DexDecoder) -> RoundCost:
        """What a round of ``decoder``'s settings costs on this machine: timed once, by a short real run on a fixed
        prompt (``time_rounds``, a few seconds at most on the default model), then kept."""
        key = repr(decoder.settings)
        if key not in self._rounds:
            self._rounds[key] = time_rounds(decoder, self.encode(TIMING_PROMPT, True))
        return self._rounds[key]

    def round_timed(self, decoder: DexDecoder) -> bool:
        """Whether a first estimate at ``decoder``'s settings needs no round timed (timed already, or not made)."""
        return decoder.backend != "sequential" or repr(decoder.settings) in self._rounds

    def forecast(self, decoder: DexDecoder, max_new_tokens: int, page=None) -> Forecast | None:
        """The first estimate of a DEX run on the sequential schedule: this server's last runs at the same K when
        there are some (``app.host.learned.Learned``: their seconds as the page saw them), else a round timed here at
        the run's settings (``round_cost``) plus ``page(cost)``, the seconds the page adds to a round (None: nothing,
        a reader that draws nothing); None for explorer groups."""
        if decoder.backend != "sequential":
            return None
        learned = self._learned.get(decoder.K)
        first = learned.forecast(max_new_tokens) if learned else None
        if first is not None:
            return first
        cost, key = self.round_cost(decoder), repr(decoder.settings)
        if page is not None and key not in self._drawn:
            self._drawn[key] = page(cost)  # timed once too
        per_round = cost.round_seconds + (self._drawn[key] if page is not None else 0.0)
        return forecast(per_round, decoder.K, max_new_tokens, None, BASIS, cost.prefill_seconds)

    def learn(self, K: int, events: list, seconds: float | None) -> None:
        """What a finished run at K that took ``seconds`` (None: not measured) teaches the next run's first
        estimate at K (``Learned``; a run that did not finish teaches nothing)."""
        if seconds and events and isinstance(events[-1], EndEvent):
            self._learned.setdefault(K, Learned(K)).add(events[-1].stats, seconds)

    def slow_notice(
        self, decoder: DexDecoder | None, max_new_tokens: int, ar: bool = False, first: Forecast | None = None
    ) -> str | None:
        """A warning (not a refusal) before settings expected to take over ``SLOW_SECONDS`` here: DEX with
        ``decoder`` (Live: its forecast), AR beside it (``ar``: the Race), or AR and the logit lens alone
        (``decoder`` None: the Analysis, its lens passes counted as half an AR pass a token). Past the host's bound
        on a request's model time it says so. ``first``: the decoder's forecast, when the caller has it already."""
        if decoder is not None and decoder.backend != "sequential":
            return None
        model, _ = self.model("the Analysis")
        one = self.one_row(decoder.proposal_vocab if decoder else model.config.vocab_size)
        ar_time = ar_seconds(one, model.config.num_hidden_layers, max_new_tokens)
        if first is None and decoder is not None:
            first = self.forecast(decoder, max_new_tokens)
        seconds = 1.5 * ar_time if first is None else first.seconds + ar * ar_time
        if seconds < SLOW_SECONDS:
            return None
        bound = self.settings.request_seconds
        end = f" This host ends a request after {bound} s, with what it made." if 0 < bound < seconds else ""
        if first is None:
            return (
                f"analysing {max_new_tokens} tokens: about {seconds:.0f} s here; fewer tokens is faster.{end}"
            )
        what = f"K={decoder.K} × {max_new_tokens} tokens"
        if ar:
            return (
                f"a race of {what} and AR beside them: about {seconds:.0f} s here; fewer tokens or a smaller K "
                f"is faster.{end}"
            )
        return (
            f"{what}: {first.text()} on this machine, where the explorers take turns; fewer tokens or a smaller "
            f"K is faster.{end}"
        )

    def encode(self, prompt: str, chat: bool) -> list[int]:
        return encode_prompt(self.tokenizer(), prompt, chat)

    def device_notice(self, count: int) -> str | None:
        """Why a distributed run uses CPU explorers on a machine with too few GPUs (None when it does not)."""

        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if self.settings.backend == "distributed" and self.settings.device != "cpu" and 0 < gpus < count:
            return (
                f"{count} explorers need {count} GPUs (one per explorer) but {gpus} are visible: "
                f"the explorers run on CPU. Choose K ≤ {gpus} to use the GPUs."
            )
        return None

    @property
    def shipped_adapters(self) -> bool:
        """Whether the adapters box can do anything: a named model that ships an adapter file."""
        return shipped_adapters(self.settings.model) is not None

    def decoder(self, config: DexConfig) -> DexDecoder:
        """A decoder for the config's exploration, from the runtime's ``DecoderPool``: decoders (and their explorer
        groups) are kept, keyed by the run's settings, at most ``max_groups`` at once, the least recently used closed
        first; under torchrun, the launch's one decoder. Distributed, each explorer reads its own part of the
        checkpoint (DEX_DEVICE=cpu: CPU explorers, even beside GPUs)."""
        options = replace(config.decoder(), backend=self.settings.backend)
        if options.backend == "torchrun" and self.launch_explorers is None:
            raise DexError("the torchrun backend needs the app started under torchrun (see README)")
        if options.backend == "sequential":
            self.model()  # loaded on first use
        self.prepare()
        decoder = self._pool.decoder(options)
        decoder.share(self.live_batch)
        return decoder

    @property
    def live_batch(self) -> int:
        """Live runs that share each round (``DexDecoder.share``): the setting's, on every backend."""
        return self.settings.live_batch

    def close(self) -> None:
        with self._lock:
            if self._pool is not None:
                self._pool.close()
