"""``DecoderPool``: the decoders of one model that a server keeps, keyed by their run's settings (``RunSettings``: the
resolved depths, adapters, proposal heads, row budget, draft bounds, DECS). A request whose options resolve to
settings already open reuses that decoder (on the distributed backend its explorer processes stay up); at most
``size`` are open, and the least recently used is closed first. A torchrun launch's pool holds the launch's one
decoder, whose settings the launch fixed. The app's host, the HTTP API and torchrun serving take decoders from it."""

from __future__ import annotations

import threading
from collections import OrderedDict

from ..config import DecoderOptions, DexError
from ..decoder import DexDecoder, model_source, settings_of
from ..log import stderr
from ..runtime.settings import RunSettings


class DecoderPool:
    def __init__(self, model=None, size: int = 2, *, tokenizer=None, launched: DexDecoder | None = None):
        """``model``: loaded, or an ``UnloadedModel`` (``model_source``); ``launched``: a torchrun launch's decoder
        (then no model)."""
        if (model is None) == (launched is None):
            raise DexError("a DecoderPool holds a model or a torchrun launch's decoder: give one of them")
        if size < 1:
            raise DexError(f"a DecoderPool keeps at least one decoder; got size={size}")
        self.model, self.size, self.launched = model, size, launched
        self.tokenizer = launched.tokenizer if launched is not None else tokenizer
        self._open: OrderedDict[RunSettings, DexDecoder] = OrderedDict()  # least recently used first
        self._lock = threading.Lock()

    @classmethod
    def open(
        cls, spec: str, options: DecoderOptions, *, dtype="auto", device="auto", size: int = 2, log=stderr
    ) -> DecoderPool:
        """A pool for model ``spec`` on ``options``' backend (torchrun: every rank joins the launch here; the other
        ranks serve rank 0's requests and end their processes)."""
        if options.backend == "torchrun":
            return cls(
                launched=DexDecoder.from_pretrained(spec, options, dtype=dtype, device=device, log=log)
            )
        model, tokenizer = model_source(spec, options, dtype=dtype, device=device, log=log)
        return cls(model, size, tokenizer=tokenizer)

    def decoder(self, options: DecoderOptions) -> DexDecoder:
        """The decoder of ``options``: the open one of the same settings, else a new one (the least recently used
        closed first when ``size`` are open). A launch's pool answers with the launch's decoder."""
        if self.launched is not None:
            return self.launched
        settings = settings_of(self.model, options, self.tokenizer)
        with self._lock:
            if settings in self._open:
                self._open.move_to_end(settings)
                return self._open[settings]
            while len(self._open) >= self.size:
                self._open.popitem(last=False)[1].close()
            decoder = DexDecoder(self.model, options, tokenizer=self.tokenizer, settings=settings)
            self._open[settings] = decoder
            return decoder

    def __len__(self) -> int:
        return len(self._open) + (self.launched is not None)

    def close(self) -> None:
        """Close every decoder (their explorer processes end)."""
        with self._lock:
            for decoder in [*self._open.values(), *([self.launched] if self.launched else [])]:
                decoder.close()
            self._open.clear()
            self.launched = None
