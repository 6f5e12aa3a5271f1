"""What an OpenAI-style request asks of DEX (``parse_request``): the body of ``POST /v1/completions`` or
``/v1/chat/completions`` checked against its declared schema (``request_models``: pydantic models, published in the
server's ``/openapi.json``) and turned into a ``Completion`` (token ids and ``GenerationOptions``), or ``ApiError``
with the HTTP status and the OpenAI error body that says what is wrong.

Fields DEX maps: ``model`` (must name the served model), ``prompt`` (completions: a string, token ids, or a list of
up to ``MAX_PROMPTS`` of either, each its own choice) or ``messages`` (chat: ``[{"role", "content"}]`` through the
tokenizer's chat template), ``stop`` (a string or up to 4), ``stream`` and ``stream_options.include_usage``, ``n``
(1 only), ``user``, ``max_completion_tokens`` (chat: ``max_tokens``' newer name), log-probabilities (completions'
``logprobs`` 0-5, chat's ``logprobs`` and ``top_logprobs`` 0-20: each committed token's at the final depth),
``echo`` (completions: the prompt scored, ``max_tokens`` 0 or 1), and the generation options the config declares
for the API (``GenerationOptions`` fields whose metadata has ``api``: ``max_tokens``, ``temperature``, ``top_p``,
``top_k``, ``seed``), their types, defaults and ranges read from that metadata (``dex_core.flags.api_fields``). Any
other field is refused by name rather than ignored: a client that sets ``presence_penalty`` would otherwise get text
made without it.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field, replace

import anyio
from pydantic import BaseModel, ValidationError
from starlette.requests import ClientDisconnect

from ..config import DexError, GenerationOptions
from ..flags import api_fields
from ..runtime.request import chat_ids, check_text
from .bodies import MAX_MESSAGES, MAX_PROMPTS, request_models

MAX_PROMPT_CHARS = 256 * 2**10  # characters of prompt text one request may send
MAX_BODY_BYTES = 4 * 2**20  # bytes of one request body (413 beyond): the longest prompt as UTF-8 JSON fits
BODY_SECONDS = 30.0  # a body that has not arrived whole this long after its headers is refused (408)
FIXED = {  # what a field must be, said whatever was wrong with it
    "prompt": f"prompt must be a string, a list of token ids, or a list of 1 to {MAX_PROMPTS} of either",
    "messages": f"messages must be a list of 1 to {MAX_MESSAGES} {{role, content}}, each role system, user or "
    "assistant",
    "stop": "stop must be a non-empty string or a list of up to 4 of them",
    "n": "n must be 1: DEX makes one completion a request",
}
TYPES = {
    "int_type": "an integer",
    "float_type": "a number",
    "bool_type": "true or false",
    "string_type": "text",
}


class Gone(Exception):
    """The client went away before its request arrived whole: there is no one to answer."""


async def read_body(request, limit: int = MAX_BODY_BYTES):
    """The JSON of ``request``'s body, read at most ``limit`` bytes far (413 beyond, said before reading when the
    headers declare more) and within ``BODY_SECONDS`` (408 for a client that stalls); ``ApiError`` 400 for what is
    not JSON or nests too deeply, ``Gone`` for a body cut off."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise ApiError(413, f"the request body is larger than {limit} bytes")
    chunks, size = [], 0
    try:
        with anyio.fail_after(BODY_SECONDS):
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise ApiError(413, f"the request body is larger than {limit} bytes")
                chunks.append(chunk)
    except ClientDisconnect:
        raise Gone from None
    except TimeoutError:
        raise ApiError(408, f"the request body did not arrive within {BODY_SECONDS:g} s") from None
    try:
        return json.loads(b"".join(chunks))
    except RecursionError:
        raise ApiError(400, "the request body's JSON is nested too deeply") from None
    except (ValueError, UnicodeDecodeError):
        raise ApiError(400, "the request body must be JSON (UTF-8)") from None


class ApiError(Exception):
    """A request refused: its HTTP status and the OpenAI error body."""

    def __init__(
        self, status: int, message: str, param: str | None = None, kind: str = "invalid_request_error"
    ):
        super().__init__(message)
        self.status, self.message, self.param, self.kind = status, message, param, kind

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": None}}


@dataclass
class Completion:
    """One request, ready to run: its prompts' token ids (several: each its own choice, run one after another) and
    their text where it was given as text, its options, its stop strings, whether it streams (and ends the stream
    with its usage: ``usage_chunk``), and for a scored prompt (``echo``) the log-probability alternatives a token
    (``logprobs``, None: none) and whether the model's next token follows (``next_token``)."""

    prompts: list[list[int]]
    options: GenerationOptions
    stop: tuple[str, ...]
    stream: bool
    chat: bool
    texts: list[str | None] = field(default_factory=lambda: [None])
    usage_chunk: bool = False
    echo: bool = False
    logprobs: int | None = None
    next_token: bool = False

    @property
    def ids(self) -> list[int]:
        """The first prompt's token ids (the only one but in a completions request that gave several)."""
        return self.prompts[0]

    def one(self, i: int) -> Completion:
        """This request for its ``i``-th prompt alone."""
        return replace(self, prompts=[self.prompts[i]], texts=[self.texts[i]])


def _refusal(err: ValidationError, model: type[BaseModel]) -> ApiError:
    """The first thing wrong with a body of ``model``, in words that name the field (unknown fields first, all of
    them)."""
    errors = err.errors(include_url=False)
    unknown = sorted(str(e["loc"][0]) for e in errors if e["type"] == "extra_forbidden")
    if unknown:
        return ApiError(400, f"DEX does not support {', '.join(map(repr, unknown))}", unknown[0])
    first = errors[0]
    name = str(first["loc"][0]) if first["loc"] else None
    if name is None:
        return ApiError(400, "the request body must be a JSON object")
    if name in FIXED:
        return ApiError(400, FIXED[name], name)
    if first["type"] == "missing":
        return ApiError(400, f"{name} is required", name)
    if first["type"] in TYPES:  # a nested field by its path (stream_options.include_usage)
        return ApiError(400, f"{'.'.join(map(str, first['loc']))} must be {TYPES[first['type']]}", name)
    return ApiError(400, f"{name} {_range(_schema(model)['properties'][name])}", name)


@functools.cache
def _schema(model: type[BaseModel]) -> dict:
    return model.model_json_schema()


def _range(prop: dict) -> str:
    """The range a property's schema allows, in words."""
    bounds = next((p for p in prop.get("anyOf", [prop]) if p.get("type") in ("integer", "number")), prop)

    def shown(key):
        value = bounds.get(key)
        return f"{value:g}" if isinstance(value, float) else value

    low, above, high = shown("minimum"), shown("exclusiveMinimum"), shown("maximum")
    if above is not None:
        return f"must be in ({above}, {high}]" if high is not None else f"must be > {above}"
    if low is not None and high is not None:
        return f"must be between {low} and {high}"
    return f"must be >= {low}" if low is not None else f"must be <= {high}"


def _checked_text(text: str) -> str:
    if len(text) > MAX_PROMPT_CHARS:
        raise ApiError(413, f"the prompt is longer than {MAX_PROMPT_CHARS} characters", "prompt")
    try:
        check_text(text)
    except DexError as err:
        raise ApiError(400, str(err), "prompt") from None
    return text


def _prompts(body, tokenizer, chat: bool, vocab: int | None) -> list[tuple[str | None, list[int]]]:
    """Each prompt of ``body`` as (its text, or None where given as ids; its token ids)."""
    if chat:
        _checked_text("".join(m.content for m in body.messages))
        messages = [{"role": m.role, "content": m.content} for m in body.messages]
        return [(None, chat_ids(tokenizer, messages, generation_prompt=True))]
    given = body.prompt
    several = given if isinstance(given, list) and given and not isinstance(given[0], int) else [given]
    if isinstance(several[0], str):
        if sum(map(len, several)) > MAX_PROMPT_CHARS:
            _checked_text("".join(several))  # says so
        return [(_checked_text(t), tokenizer(t, add_special_tokens=True)["input_ids"]) for t in several]
    if vocab is not None and any(t >= vocab for ids in several for t in ids):
        raise ApiError(400, f"a prompt's token ids must be in [0, {vocab})", "prompt")
    return [(None, list(ids)) for ids in several]


def _option_value(body, name: str):
    """A generation option as the body gives it (null: its default)."""
    value = getattr(body, name)
    return type(body).model_fields[name].default if value is None else value


def parse_request(
    body,
    tokenizer,
    served: str,
    most_tokens: int,
    chat: bool,
    context: int | None = None,
    vocab: int | None = None,
) -> Completion:
    """``body`` (parsed JSON) as a ``Completion`` for the model named ``served``; at most ``most_tokens`` new
    tokens, and each prompt and them within the model's ``context`` window (its positions), its token ids within
    ``vocab``. ``ApiError`` for a field that is missing, of the wrong type, out of range or not supported."""
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    model = request_models(most_tokens)[chat]
    try:
        request = model.model_validate(body)
    except ValidationError as err:
        raise _refusal(err, model) from None
    if request.model != served:
        raise ApiError(
            404,
            f"the model {request.model[:80]!r} is not served here; this serves {served!r}",
            "model",
            "not_found_error",
        )
    _check_modes(request, chat)
    length = "max_completion_tokens" if chat and request.max_completion_tokens is not None else "max_tokens"
    prompts = _prompts(request, tokenizer, chat, vocab)
    if len(prompts) > 1 and request.stream:
        raise ApiError(400, "a stream takes one prompt; send several prompts without stream", "stream")
    tokens = _option_value(request, length)
    fitted = [_fitted(len(ids), tokens, context, getattr(request, length)) for _, ids in prompts]
    options = _generation(request, max(1, min(fitted)))  # a scored prompt (echo) runs no generation
    stops = () if request.stop is None else (request.stop,) if isinstance(request.stop, str) else request.stop
    echo = not chat and request.echo
    return Completion(
        [ids for _, ids in prompts],
        options,
        tuple(stops),
        request.stream,
        chat,
        texts=[text for text, _ in prompts],
        usage_chunk=request.stream_options is not None and request.stream_options.include_usage,
        echo=echo,
        logprobs=((request.top_logprobs or 0) if request.logprobs else None) if chat else request.logprobs,
        next_token=echo and tokens == 1,
    )


def _generation(request, tokens: int) -> GenerationOptions:
    """The ``GenerationOptions`` a request's body gives (its API fields), making ``tokens`` new tokens."""
    given = {info["option"]: _option_value(request, n) for n, info in api_fields(GenerationOptions).items()}
    given |= {"max_new_tokens": tokens, "top_k": given["top_k"] or None}
    given["top_p"] = None if given["top_p"] == 1 else given["top_p"]
    try:
        return GenerationOptions(**given)
    except DexError as err:
        raise ApiError(400, str(err)) from None


def _check_modes(request, chat: bool) -> None:
    """400 for a combination of fields DEX does not run: stream options without a stream; chat's top_logprobs
    without logprobs; max_tokens 0 but to score a prompt; a scored prompt (``echo``) that streams, makes more than
    the model's one greedy next token, or samples it."""
    if request.stream_options is not None and not request.stream:
        raise ApiError(400, "stream_options is for a stream (stream: true)", "stream_options")
    if chat:
        if request.top_logprobs is not None and not request.logprobs:
            raise ApiError(400, "top_logprobs needs logprobs: true", "top_logprobs")
        return
    tokens = _option_value(request, "max_tokens")
    if not request.echo:
        if tokens == 0:
            raise ApiError(400, "max_tokens 0 is for scoring a prompt (echo: true)", "max_tokens")
        return
    if request.stream:
        raise ApiError(400, "echo (a prompt scored) is answered whole, not streamed", "stream")
    if tokens > 1:
        raise ApiError(400, "echo scores the prompt: max_tokens must be 0 or 1", "max_tokens")
    if tokens == 1 and _option_value(request, "temperature") != 0:
        raise ApiError(
            400,
            "echo with max_tokens 1 gives the model's greedy next token: temperature must be 0",
            "temperature",
        )


def _fitted(prompt: int, tokens: int, context: int | None, asked: int | None) -> int:
    """The new tokens a request runs: ``tokens`` when the prompt's ``prompt`` tokens and they fit the model's
    ``context``; a length the client did not give (``asked`` None) shrinks to what fits. 400 naming both otherwise."""
    if context is None or prompt + tokens <= context:
        return tokens
    if asked is None and prompt < context:
        return context - prompt
    raise ApiError(
        400,
        f"the prompt is {prompt} tokens and {tokens} more were asked for: the model's context window is {context} "
        "tokens; send a shorter prompt or ask for fewer tokens",
        "prompt" if prompt >= context else "max_tokens",
    )
