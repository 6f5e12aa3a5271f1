"""``dex serve --http``'s OpenAI-compatible API on the app's own server, under ``/openai`` (``--openai-api``,
``DEX_OPENAI_API=1``; off by default): ``/openai/v1/completions``, ``/openai/v1/chat/completions``,
``/openai/v1/models``, ``/openai/metrics``, ``/openai/health`` (``dex_core.openai_app``), mounted ahead of
Gradio's routes and behind the gate (``app.host.server.launch_options``).

It serves the app's model at the launch's K (``AppSettings.explorers``) on a decoder of its own beside the app's
runs: the sequential backend's weights are shared and only read (an explorer group runs one request at a time,
so ``AppSettings`` refuses the setting with the other backends). Bounded as the app is: one API run at a time,
``queue_size`` more waiting, one running or waiting per visitor (client address), ``request_seconds`` of model
time each, at most the app's ``max_new_tokens`` bound. The model loads on the first API request, off the event
loop, as it does for the app's first run.
"""

from __future__ import annotations

import asyncio

import anyio
from starlette.routing import Mount

from dex_core import DexConfig, DexDecoder, GenerationOptions, openai_app
from dex_core.flags import control

from .state import Runtime

PREFIX = "/openai"
MOST_TOKENS = control(GenerationOptions, "max_new_tokens")["maximum"]  # the app's Max new tokens bound


class _Later:
    """An ASGI app built on its first request (``build`` runs in a worker thread, once)."""

    def __init__(self, build):
        self.build, self.app, self._lock = build, None, asyncio.Lock()

    async def __call__(self, scope, receive, send):
        if self.app is None:
            async with self._lock:
                if self.app is None:
                    self.app = await anyio.to_thread.run_sync(self.build)
        await self.app(scope, receive, send)


def openai_routes(runtime: Runtime) -> Mount:
    """The API as a route of the app's server (``PREFIX``)."""
    settings = runtime.settings

    def build():
        model, tokenizer = runtime.model("the OpenAI-compatible API")
        options = DexConfig(model=settings.model, explorers=settings.explorers).decoder()
        decoder = DexDecoder(model, options, tokenizer=tokenizer)
        bounds = dict(queue=settings.queue_size, seconds=settings.request_seconds, per_client=1)
        return openai_app(decoder, tokenizer, settings.model, MOST_TOKENS, **bounds)

    return Mount(PREFIX, app=_Later(build))
