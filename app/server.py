"""The app's Blocks and how they launch. A closed tab frees its session (Gradio's unload event, handled by
``app.sessions``), and every launch (``python app/main.py``, ``gradio app/main.py``, the tests) adds the
app's bounds: the file gate (``app.files.Gate``, a FastAPI middleware), the sweep of sessions and files
every ``SWEEP_SECONDS`` (a task of the server's lifespan), the upload size limit (a trace file's,
``TraceLimits.max_file_bytes``), and the removal of the app's folder when the server stops.
"""

from __future__ import annotations

import asyncio
import traceback
from contextlib import asynccontextmanager

import anyio
import gradio as gr
from starlette.middleware import Middleware

from dex_core.trace.schema import TRACE_LIMITS

from .files import Gate
from .sessions import Sessions

SWEEP_SECONDS = 1.0


@asynccontextmanager
async def sweeping(sessions: Sessions):
    """While the server runs: the sweep every ``SWEEP_SECONDS``; at its end the app's files go."""

    async def sweep():
        while True:
            await asyncio.sleep(SWEEP_SECONDS)
            try:
                sessions.drop_idle()  # on the event loop, like Gradio's own state sweep
                await anyio.to_thread.run_sync(sessions.sweep)
            except Exception:  # the sweep must outlive one bad pass; the log says what went wrong
                traceback.print_exc()

    task = asyncio.create_task(sweep())
    try:
        yield
    finally:
        task.cancel()
        sessions.files.remove()


def launch_options(blocks: SessionBlocks, given: dict) -> dict:
    """``launch`` keywords with the app's bounds added to ``given``: the gate and the sweep (FastAPI
    middleware and lifespan, composed with any the caller passes) and the upload size limit."""
    sessions = blocks.sessions
    sessions.blocks = sessions.files.blocks = blocks
    options = dict(given)
    options.setdefault("max_file_size", TRACE_LIMITS.max_file_bytes)
    app_kwargs = dict(options.get("app_kwargs") or {})
    outer = app_kwargs.get("lifespan")

    @asynccontextmanager
    async def lifespan(app):
        async with sweeping(sessions):
            if outer is None:
                yield
            else:
                async with outer(app) as state:
                    yield state

    app_kwargs["middleware"] = [Middleware(Gate, files=sessions.files), *app_kwargs.get("middleware", [])]
    app_kwargs["lifespan"] = lifespan
    return {**options, "app_kwargs": app_kwargs}


class SessionBlocks(gr.Blocks):
    """``gr.Blocks`` bound to the app's ``Sessions``: a closed tab frees its session, and every launch gets
    ``launch_options``."""

    def __init__(self, sessions: Sessions, **kwargs):
        super().__init__(**kwargs)
        self.sessions = sessions
        self.unload(sessions.closed)

    def launch(self, *args, **kwargs):
        return super().launch(*args, **launch_options(self, kwargs))
