"""The app's Blocks and how they launch. A closed tab frees its session (Gradio's unload event, handled by
``app.host.sessions``), and every launch (``python app/main.py``, ``gradio app/main.py``, the tests) adds the
app's bounds: the gate (``app.host.gate.Gate``, a FastAPI middleware: files, uploads, malformed calls), the app's
folder made at the start (sweeping a killed server's) and removed at the end, the sweep of sessions and files
every ``SWEEP_SECONDS`` (a task of the server's lifespan), the OpenAI-compatible API where the settings ask
for it (``app.host.api_routes``), Gradio's MCP server where they ask for it, offering the page's tools only
(``app.host.mcp_route``), and the upload size limit (a trace file's, ``TraceLimits.max_file_bytes``). A call with
too few inputs for its endpoint is answered with one line and logged in one (``Calls``), not with Gradio's traceback.
An idle server stays quiet: Gradio's queue looks for work every ``QUEUE_POLL_SECONDS``, not every millisecond.
"""

from __future__ import annotations

import asyncio
import traceback
from contextlib import asynccontextmanager

import anyio
import gradio as gr
from gradio.exceptions import InvalidPathError
from pydantic import ValidationError
from starlette.middleware import Middleware

from dex_core import bounded_connections
from dex_core.trace.schema import TRACE_LIMITS

from . import trace_worker
from .api_routes import PREFIX, openai_routes
from .gate import Gate
from .mcp_route import keep_tools
from .state import Runtime
from .uploads import request_visitor

SWEEP_SECONDS = 1.0
# How often Gradio's queue looks for a new event while none waits, and for progress to send: its own 1 ms and 10 ms
# cost an idle server 4.4-5.3 % of a core (a bare Blocks, this 2-core CPU), these 1.0-1.1 %; a queued event waits up
# to 20 ms more (benchmarks/gradio_idle.py measures the app's whole tree)
QUEUE_POLL_SECONDS = 0.02
PROGRESS_POLL_SECONDS = 0.1


@asynccontextmanager
async def sweeping(runtime: Runtime):
    """While the server runs: the app's folder (made now, sweeping a killed server's), the sweep every
    ``SWEEP_SECONDS``; at its end the app's files go."""
    sessions = runtime.sessions

    async def sweep():
        while True:
            await asyncio.sleep(SWEEP_SECONDS)
            try:
                sessions.drop_idle()  # on the event loop, like Gradio's own state sweep
                await anyio.to_thread.run_sync(sessions.sweep)
                await anyio.to_thread.run_sync(runtime.uploads.expire)
            except Exception:  # the sweep must outlive one bad pass; the log says what went wrong
                traceback.print_exc()

    await anyio.to_thread.run_sync(runtime.files.folder)
    await anyio.to_thread.run_sync(sessions.freeze_start_up)  # before the server serves: before any session
    task = asyncio.create_task(sweep())
    try:
        yield
    finally:
        task.cancel()
        runtime.files.remove()
        trace_worker.stop()


def launch_options(blocks: SessionBlocks, given: dict) -> dict:
    """``launch`` keywords with the app's bounds added to ``given``: the gate and the sweep (FastAPI
    middleware and lifespan, composed with any the caller passes), the upload size limit, the page's stylesheet
    (``SessionBlocks.page_css``) and the MCP server as the settings say (``AppSettings.mcp_server``, whatever
    ``given`` or ``GRADIO_MCP_SERVER`` say)."""
    runtime = blocks.runtime
    runtime.sessions.blocks = runtime.files.blocks = runtime.uploads.blocks = blocks
    options = dict(given)
    options.setdefault("max_file_size", TRACE_LIMITS.max_file_bytes)
    if blocks.page_css:
        options.setdefault("css", blocks.page_css)
    options["mcp_server"] = runtime.settings.mcp_server
    app_kwargs = dict(options.get("app_kwargs") or {})
    outer = app_kwargs.get("lifespan")

    @asynccontextmanager
    async def lifespan(app):
        keep_tools(blocks)  # Gradio made its MCP server (if any) before the server started
        async with sweeping(runtime):
            if outer is None:
                yield
            else:
                async with outer(app) as state:
                    yield state

    api = PREFIX if runtime.settings.openai_api else None
    gate = Middleware(Gate, files=runtime.files, uploads=runtime.uploads, calls=runtime.calls, api=api)
    app_kwargs["middleware"] = [gate, *app_kwargs.get("middleware", [])]
    if runtime.settings.openai_api:  # ahead of Gradio's routes, behind the gate
        app_kwargs["routes"] = [openai_routes(runtime), *app_kwargs.get("routes", [])]
    app_kwargs["lifespan"] = lifespan
    return {**options, "app_kwargs": app_kwargs}


class SessionBlocks(gr.Blocks):
    """``gr.Blocks`` bound to the app's ``Runtime``: a closed tab frees its session, every launch gets
    ``launch_options``, and a call with too few inputs is refused in one line. ``tools``: the API names of the
    endpoints its MCP server offers (``app.ui.tools``); ``page_css``: the page's stylesheet, which Gradio 6 takes
    at launch (every launch: ``python app/main.py``, ``gradio app/main.py``, the tests)."""

    def __init__(self, runtime: Runtime, page_css: str = "", **kwargs):
        super().__init__(**kwargs)
        self.runtime = runtime
        self.page_css = page_css
        self.tools: list[str] = []
        self.unload(runtime.sessions.closed)

    def launch(self, *args, **kwargs):
        self._queue.sleep_when_free = QUEUE_POLL_SECONDS  # the queue that serves: .queue() makes a new one
        self._queue.progress_update_sleep_when_free = PROGRESS_POLL_SECONDS
        with bounded_connections():  # Gradio's server gets them too (dex_core.serving.connections)
            return super().launch(*args, **launch_options(self, kwargs))

    async def process_api(self, block_fn, inputs, *args, **kwargs):
        fn = self.fns[block_fn] if isinstance(block_fn, int) else block_fn
        if len(inputs) < len(
            fn.inputs
        ):  # Gradio would raise ValueError, which its queue logs with a traceback
            raise self._malformed(fn, kwargs, f"it gave {len(inputs)} of its {len(fn.inputs)} inputs")
        try:
            return await super().process_api(block_fn, inputs, *args, **kwargs)
        except InvalidPathError:  # a file input naming a path that was never uploaded here
            raise self._malformed(fn, kwargs, "it names a file that was not uploaded here") from None
        except ValidationError:  # a file input that is not Gradio's FileData
            raise self._malformed(fn, kwargs, "an input has the wrong shape") from None

    def _malformed(self, fn, kwargs: dict, why: str) -> gr.Error:
        """Count and log (one line) a call to ``fn`` that its inputs make malformed; the error to answer it with."""
        self.runtime.calls.malformed(request_visitor(kwargs.get("request")), f"/{fn.api_name}", why)
        return gr.Error(f"/{fn.api_name} refused this call: {why}", print_exception=False)
