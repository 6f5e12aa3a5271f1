"""The bodies of ``POST /v1/completions`` and ``/v1/chat/completions`` as the API declares them
(``request_models``: pydantic models, published in the server's ``/openapi.json`` and fuzzed against it) and
OpenAI's error body (``ErrorBody``). The generation options' types, defaults and ranges come from their metadata
(``dex_core.flags.api_fields``); what the server does with a body is ``api_requests``'."""

from __future__ import annotations

import functools
import typing
from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, create_model

from ..config import GenerationOptions
from ..flags import api_fields

MAX_MESSAGES = 512  # messages of one chat request (each adds its template's text to the prompt)
MAX_PROMPTS = 16  # prompts of one completions request (a list: each its own choice, run one after another)
MAX_PROMPT_TOKENS = 32 * 2**10  # token ids of one prompt given as ids (the model's context bounds it further)
MAX_LOGPROBS = {False: 5, True: 20}  # alternatives a position: completions' logprobs, chat's top_logprobs


_Stop = Annotated[str, Field(min_length=1)]


def _whole(value):
    """A whole number written as a float (``16.0``) as the int it is: JSON Schema's ``integer`` takes it too."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class StreamOptions(_Strict):
    """What a stream adds: ``include_usage``, a last chunk with the request's usage and no choices."""

    include_usage: bool = False


class Message(BaseModel):
    """One chat message (other keys OpenAI defines, such as ``name``, are not used)."""

    model_config = ConfigDict(strict=True)
    role: Literal["system", "user", "assistant"]
    content: str


def _option(info: dict, kind: type, **override):
    """A generation option as the API declares it: null or absent takes its default; an integer may be written as
    a whole float (``16.0``)."""
    bounds = {"ge": info["minimum"], "gt": info["exclusive_minimum"], "le": info["maximum"], **override}
    bounds = {k: v for k, v in bounds.items() if v is not None and k != "default"}
    default = override.get("default", info["default"])
    option = Annotated[kind | None, Field(default=default, description=info["help"], **bounds)]
    return Annotated[option, BeforeValidator(_whole)] if kind is int else option


def _options(most_tokens: int, chat: bool) -> dict:
    """The generation options the API takes (``api_fields``), typed from ``GenerationOptions``; ``max_tokens`` is
    bounded by the server and defaults as OpenAI's do (16 for completions, the bound for chat)."""
    hints = typing.get_type_hints(GenerationOptions)
    out = {}
    for name, info in api_fields(GenerationOptions).items():
        kind = next(
            t
            for t in (int, float)
            if hints[info["option"]] is t or t in typing.get_args(hints[info["option"]])
        )
        bound = {"le": most_tokens, "default": most_tokens if chat else min(16, most_tokens)}
        bound |= {} if chat else {"ge": 0}  # 0: a prompt scored (echo), nothing made
        out[name] = _option(info, kind, **(bound if info["option"] == "max_new_tokens" else {}))
    if chat:  # max_tokens' newer name: it wins when given
        info = api_fields(GenerationOptions)["max_tokens"]
        out["max_completion_tokens"] = _option(info, int, le=most_tokens, default=None)
    return out


@functools.lru_cache(maxsize=8)
def request_models(most_tokens: int) -> dict[bool, type[BaseModel]]:
    """The request bodies (chat: True) of a server that makes at most ``most_tokens`` tokens a request."""
    common = {
        "model": (str, Field(description="the served model's name (GET /v1/models)")),
        "stop": (
            _Stop | Annotated[list[_Stop], Field(max_length=4)] | None,
            Field(default=None, description="up to 4 stop strings"),
        ),
        "stream": (
            bool,
            Field(default=False, description="server-sent events, one chunk per committed token"),
        ),
        "n": (
            Annotated[Literal[1], BeforeValidator(_whole)],
            Field(default=1, description="completions a request: 1"),
        ),
        "user": (str | None, None),
        "stream_options": (
            StreamOptions | None,
            Field(default=None, description="with stream: include_usage adds a last chunk with the usage"),
        ),
    }
    ids = Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1, max_length=MAX_PROMPT_TOKENS)]
    several = Annotated[list[str] | list[ids], Field(min_length=1, max_length=MAX_PROMPTS)]
    prompt = {
        "prompt": (
            str | ids | several,
            Field(description=f"the prompt: text, token ids, or a list of up to {MAX_PROMPTS} of either"),
        ),
        "echo": (bool, Field(default=False, description="score the prompt: its text and log-probabilities")),
        "logprobs": (
            int | None,
            Field(default=None, ge=0, le=MAX_LOGPROBS[False], description="alternatives a token (with echo)"),
        ),
    }
    chat_logprobs = {
        "logprobs": (bool, Field(default=False, description="log-probabilities of the answer's tokens")),
        "top_logprobs": (int | None, Field(default=None, ge=0, le=MAX_LOGPROBS[True])),
    }
    messages = {
        "messages": (
            list[Message],
            Field(min_length=1, max_length=MAX_MESSAGES, description="the conversation"),
        )
    }
    return {
        chat: create_model(
            "ChatCompletionRequest" if chat else "CompletionRequest",
            __base__=_Strict,
            **common,
            **({**messages, **chat_logprobs} if chat else prompt),
            **_options(most_tokens, chat),
        )
        for chat in (False, True)
    }


class ErrorBody(BaseModel):
    """OpenAI's error body: ``{"error": {"message", "type", "param", "code"}}``."""

    error: dict[str, str | None]
