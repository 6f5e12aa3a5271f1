"""An OpenAI-compatible HTTP API over a ``DexDecoder`` (``dex serve --http HOST:PORT``; ``make_app`` for an ASGI
server of one's own): ``POST /v1/completions``, ``POST /v1/chat/completions`` (``stream: true``: server-sent
events, one chunk per committed token in order, then ``[DONE]``), ``GET /v1/models``, ``GET /health``.

The decoder is the schedule: sequential or distributed explorer processes alike. Up to ``most`` requests run at a
time, sharing the decoder's rounds (``runner.Runner``; one on explorer processes); ``queue`` more may wait and any
beyond get 429 at once; each is bounded by ``most_tokens`` new tokens and ``seconds`` of model time (its run then
ends after the round in progress, ``finish_reason: "length"``); a client that goes away (streaming or not) ends its
run after the round in progress. Bodies are bounded before they are parsed and checked off the event loop
(``api_requests.read_body``, ``parse_request``). ``usage`` counts the prompt's and the completion's tokens,
``completion_tokens_details.accepted_prediction_tokens`` the committed tokens DEX did not have to wait for the final
stage to find (matched at a non-final stage, or committed from a draft chain), and a ``dex`` block the run's rounds,
rounds per token, the tokens matched at each stage, K and the depths. A malformed request gets a 4xx with an OpenAI
error body (``api_requests``), and nothing in the server's log."""

from __future__ import annotations

import asyncio
import functools
import json
import threading
import time
import uuid
from dataclasses import dataclass

import anyio
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from ..config import DexError
from ..runtime.heap import settle
from ..trace.events import EndEvent
from .answers import TextPieces, chunk, logprobs_of, reply, scored_choice, usage, whole
from .api_requests import ApiError, Completion, Gone, parse_request, read_body
from .bodies import ErrorBody, request_models
from .connections import server_config
from .metrics import CONTENT_TYPE, Metrics
from .pool import DecoderPool
from .runner import Ended, Runner, max_batch


def _finish(text: TextPieces, end: EndEvent | None) -> str:
    """Why the completion ended, in OpenAI's words: ``stop`` (a stop string or the model's EOS), else ``length``."""
    if text.stopped or (end is not None and end.stop == "eos"):
        return "stop"
    return "length"


@dataclass
class _Served:
    """What every route of one server shares."""

    tokenizer: object
    served: str
    most_tokens: int
    runner: Runner
    metrics: Metrics
    context: int | None  # the model's positions: a prompt and its new tokens fit within them


def make_app(
    decoder,
    tokenizer,
    served: str,
    most_tokens: int = 512,
    queue: int = 8,
    seconds: float = 0,
    per_client: int | None = None,
    most: int = 1,
) -> FastAPI:
    """The API over ``decoder`` (its ``tokenizer``), serving the model named ``served``; the bounds as
    ``Runner``'s (``most``: requests sharing rounds)."""
    app, runner = FastAPI(title="DEX"), Runner(decoder, queue, seconds, per_client, most)
    crew = getattr(
        getattr(decoder, "schedule", None), "crew", None
    )  # the runs that share rounds (sequential)
    metrics = Metrics(lambda: runner.running, lambda: runner.admitted - runner.running, crew)
    context = getattr(getattr(decoder, "view", None), "max_positions", None)
    api = _Served(tokenizer, served, most_tokens, runner, metrics, context)

    @app.exception_handler(ApiError)
    async def refused(_request, err: ApiError):
        return JSONResponse(err.body(), status_code=err.status)

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.get("/metrics", response_class=PlainTextResponse)  # Prometheus' text, so documented
    async def prometheus():
        return Response(metrics.text(), media_type=CONTENT_TYPE)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": served, "object": "model", "owned_by": "dex"}]}

    @app.post("/v1/completions", **_documented(False))
    async def completions(request: Request):
        return await _complete(api, request, chat=False)

    @app.post("/v1/chat/completions", **_documented(True))
    async def chat_completions(request: Request):
        return await _complete(api, request, chat=True)

    _publish(app, request_models(most_tokens))
    return app


def _documented(chat: bool) -> dict:
    """What ``/openapi.json`` says of a completion route: its request body (``request_models``, checked by hand from
    the raw body so that every refusal keeps OpenAI's error body) and its refusals."""
    name = "ChatCompletionRequest" if chat else "CompletionRequest"
    body = {"$ref": f"#/components/schemas/{name}"}
    refused = {"description": "refused: OpenAI's error body", "model": ErrorBody}
    event = {"type": "object", "required": ["data"], "properties": {"data": {"type": "string"}}}
    streamed = {"content": {"text/event-stream": {"schema": event}}}  # "stream": true (the schema: one event)
    return {
        "openapi_extra": {
            "requestBody": {"required": True, "content": {"application/json": {"schema": body}}}
        },
        "responses": {200: streamed, **{code: refused for code in (400, 404, 413, 429, 500)}},
    }


def _publish(app: FastAPI, models: dict) -> None:
    """Add the request bodies' schemas to the app's ``/openapi.json``."""
    build = app.openapi

    def openapi() -> dict:
        if app.openapi_schema is None:
            schema = build()
            schemas = schema.setdefault("components", {}).setdefault("schemas", {})
            for model in models.values():
                body = model.model_json_schema(ref_template="#/components/schemas/{model}")
                schemas.update(body.pop("$defs", {}))
                schemas[model.__name__] = body
        return app.openapi_schema

    app.openapi = openapi


async def _complete(api: _Served, request: Request, chat: bool):
    """One completion request: checked, admitted, run in a worker thread; streamed or answered whole (several
    prompts one after another under one admission; a prompt scored, ``echo``, by one forward)."""
    arrived = time.monotonic()
    try:
        body = await read_body(request)
    except Gone:  # the client left before its request arrived: nothing to answer, nothing to log
        return Response(status_code=400)
    vocab = getattr(getattr(api.runner.decoder, "view", None), "vocab", None)
    checked = functools.partial(
        parse_request, body, api.tokenizer, api.served, api.most_tokens, chat, api.context, vocab
    )
    job = await anyio.to_thread.run_sync(checked)  # the template and the tokenizer run off the event loop
    client, rid = (
        request.client.host if request.client else "",
        ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex,
    )
    if (job.echo or job.logprobs is not None) and getattr(api.runner.decoder, "model", None) is None:
        raise ApiError(
            400,
            "log-probabilities and echo are read from the model in the server's process: serve with --backend "
            "sequential",
            "logprobs" if job.logprobs is not None else "echo",
        )
    if job.echo:
        return await _scored(api, job, rid, client)
    if job.stream:
        events, gone = _start(api.runner, job, client)
        pieces = _pieces(job, api.tokenizer, events, gone, api.metrics.start(len(job.ids), arrived))
        stream = _sse(job, rid, api.served, pieces, gone, api.tokenizer)
        return StreamingResponse(stream, media_type="text/event-stream")
    answers = []
    with api.runner.holding(client):  # --request-seconds bounds the prompts together
        since = time.monotonic()
        for i in range(len(job.prompts)):
            answers.append(
                await _answer(api, request, job.one(i), client, arrived if i == 0 else None, since)
            )
            if answers[-1][1] == "abort":  # the client went: the prompts after it do not run
                break
    return whole(job, rid, api.served, answers)


async def _answer(api: _Served, request: Request, job: Completion, client: str, arrived, since: float):
    """One prompt's run, answered whole: (its text, finish reason, usage, log-probabilities when asked); a client
    that leaves ends it."""
    events, gone = _start(api.runner, job, client, held=True, since=since)
    tally = api.metrics.start(len(job.ids), arrived or time.monotonic())
    text, final, commits = "", None, []
    watch = asyncio.create_task(
        _watch(request, gone)
    )  # a client that leaves ends its run, as a stream's does
    try:
        async for piece, finish, said in _pieces(job, api.tokenizer, events, gone, tally):
            text, final = text + (piece or ""), (finish, said) if finish else final
            commits += [] if finish else [said]
    finally:
        watch.cancel()
    return text, *final, logprobs_of(job, api.tokenizer, commits)


async def _scored(api: _Served, job: Completion, rid: str, client: str) -> dict:
    """A completions request with ``echo``: each prompt scored by the model (``Runner.score``), with its greedy
    next token when ``max_tokens`` is 1, as OpenAI's ``logprobs`` (``tokens``, ``token_logprobs``,
    ``top_logprobs``, ``text_offset``)."""
    with api.runner.holding(client):
        scored = await anyio.to_thread.run_sync(api.runner.score, job)
    choices = [scored_choice(job, api.tokenizer, i, s) for i, s in enumerate(scored)]
    prompt = sum(map(len, job.prompts))
    made = len(job.prompts) if job.next_token else 0
    use = {"prompt_tokens": prompt, "completion_tokens": made, "total_tokens": prompt + made}
    return reply(job, rid, api.served, choices, usage=use)


async def _watch(request: Request, gone: threading.Event) -> None:
    """Set ``gone`` when the client of a whole (not streamed) answer disconnects."""
    while not gone.is_set():
        if await request.is_disconnected():
            gone.set()
            return
        await asyncio.sleep(0.05)


def _start(
    runner: Runner, job: Completion, client: str, held: bool = False, since: float | None = None
) -> tuple[asyncio.Queue, threading.Event]:
    """Admit ``job`` (429 beyond the bounds; ``held``: admitted already) and run it in a worker thread, its model
    time counted from ``since`` (default: its start): its events come on the queue (None last); setting the event
    ends it after the round in progress."""
    if not held:
        runner.admit(client)
    events, gone, loop = asyncio.Queue(), threading.Event(), asyncio.get_running_loop()

    def work():
        try:
            runner.run(job, lambda e: loop.call_soon_threadsafe(events.put_nowait, e), gone, since)
        except Exception as err:  # the run failed (an explorer died): the client is told
            loop.call_soon_threadsafe(events.put_nowait, Ended("failed", str(err)[:200]))
        finally:  # the admission ends before the client is told: a client may send its next request at once
            if not held:
                runner.release(client)
            loop.call_soon_threadsafe(events.put_nowait, None)

    threading.Thread(target=work, daemon=True).start()
    return events, gone


async def _pieces(job: Completion, tokenizer, events: asyncio.Queue, gone: threading.Event, tally):
    """(text, None, commit record) per committed token, then ("", finish_reason, usage); a client that stops reading
    ends the run (``gone``). ``tally``: the request's share of the server's metrics (``Metrics.start``)."""
    text, seen, end, reason, left = TextPieces(tokenizer, job.stop), [], None, "abort", False
    try:
        while (event := await events.get()) is not None:
            if isinstance(event, Ended) and event.why == "failed":
                reason = "error"
                raise ApiError(500, f"the run failed: {event.detail}", kind="server_error")
            if isinstance(event, Ended):
                left = event.why == "gone" and not text.stopped  # the client went: the run was cut for it
                continue
            seen.append(event)
            tally.see(event)
            for commit in () if text.stopped else event.commits:
                piece = text.push(commit.token)
                yield piece, None, commit
                if text.stopped:
                    gone.set()  # the stop string came: the run ends after this round
            end = event if isinstance(event, EndEvent) else end
        reason = "abort" if left else _finish(text, end)
        yield "", reason, usage(tally.prompt, seen)
    finally:
        gone.set()
        tally.end(reason)


async def _sse(job: Completion, rid: str, served: str, pieces, gone: threading.Event, tokenizer):
    """The stream's events (a token's log-probabilities in its chunk, when asked); a client that goes away (the
    response is cancelled) ends the run (``gone``)."""
    try:
        made = 0  # characters streamed so far: a completion's text_offset
        async for piece, finish, said in pieces:
            scores = None if finish else logprobs_of(job, tokenizer, [said], made)
            yield f"data: {json.dumps(chunk(job, rid, served, None if finish else piece, finish, scores))}\n\n"
            made += len(piece or "")
            if finish is not None and job.usage_chunk:  # OpenAI's last chunk: no choices, the usage
                yield f"data: {json.dumps(reply(job, rid, served, [], '.chunk', usage=said))}\n\n"
    except ApiError as err:  # the run failed after the stream began: said in the stream
        yield f"data: {json.dumps(err.body())}\n\n"
    finally:
        gone.set()
        await pieces.aclose()
    yield "data: [DONE]\n\n"


def address(text: str) -> tuple[str, int]:
    """``HOST:PORT`` as (host, port); DexError otherwise."""
    host, _, port = str(text).rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise DexError(f"--http takes HOST:PORT, e.g. 127.0.0.1:8000; got {text!r}")
    return host, int(port)


def serve_http(config, where: str, log, bounds: dict) -> None:
    """Serve ``config``'s model (a ``DexConfig``: its schedule, sequential or distributed) at ``where``
    (HOST:PORT) until interrupted; at most ``config.max_new_tokens`` new tokens a request; ``bounds``: ``make_app``'s
    (``queue``, ``seconds``, ``most``: None for the device's default)."""
    host, port = address(where)
    pool = DecoderPool.open(config.model, config.decoder(), dtype=config.dtype, device=config.device, log=log)
    try:
        decoder = pool.decoder(config.decoder())
        bounds = {**bounds, "most": max_batch(decoder, bounds.get("most"))}
        app = make_app(decoder, decoder.tokenizer, config.model, config.max_new_tokens, **bounds)
        settle()  # the loaded model and the app out of the collector's sight (runtime.heap)
        log(
            f"serving {config.model!r} (K={decoder.K}, {config.backend}, {bounds['most']} request(s) a round) at "
            f"http://{host}:{port}/v1"
        )
        uvicorn.Server(server_config(app, host, port, log_level="warning", access_log=False)).run()
    finally:
        pool.close()
