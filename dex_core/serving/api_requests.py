"""What an OpenAI-style request asks of DEX (``parse_request``): the body of ``POST /v1/completions`` or
``/v1/chat/completions`` checked field by field and turned into a ``Completion`` (token ids and
``GenerationOptions``), or ``ApiError`` with the HTTP status and the OpenAI error body that says what is wrong.

Fields DEX maps: ``model`` (must name the served model), ``prompt`` (completions: one string) or ``messages``
(chat: ``[{"role", "content"}]`` through the tokenizer's chat template), ``max_tokens`` (or
``max_completion_tokens``), ``temperature``, ``top_p``, ``top_k``, ``seed``, ``stop`` (a string or up to 4),
``stream``, ``n`` (1 only), ``user``. Any other field is refused by name rather than ignored: a client that sets
``logprobs`` or ``presence_penalty`` would otherwise get text made without it.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..config import DexError, GenerationOptions
from ..runtime.request import chat_ids, check_text

KNOWN = {
    "model",
    "prompt",
    "messages",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "top_k",
    "seed",
    "stop",
    "stream",
    "n",
    "user",
}
MAX_PROMPT_CHARS = 256 * 2**10  # characters of prompt text one request may send


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
    """One request, ready to run: its prompt's token ids, its options, its stop strings, whether it streams."""

    ids: list[int]
    options: GenerationOptions
    stop: tuple[str, ...]
    stream: bool
    chat: bool


def _number(body: dict, name: str, kind: type, default):
    value = body.get(name, default)
    if value is None:
        return default
    if kind is float and type(value) is int:
        value = float(value)
    if type(value) is not kind:
        raise ApiError(400, f"{name} must be {'a number' if kind is float else 'an integer'}", name)
    return value


def _stop(body: dict) -> tuple[str, ...]:
    stop = body.get("stop")
    stops = [] if stop is None else [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or len(stops) > 4 or not all(isinstance(s, str) and s for s in stops):
        raise ApiError(400, "stop must be a non-empty string or a list of up to 4 of them", "stop")
    return tuple(stops)


def _prompt_ids(body: dict, tokenizer, chat: bool) -> list[int]:
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise ApiError(400, "messages must be a non-empty list of {role, content}", "messages")
        for m in messages:
            if not (isinstance(m, dict) and m.get("role") in ("system", "user", "assistant")):
                raise ApiError(400, "each message needs a role: system, user or assistant", "messages")
            if not isinstance(m.get("content"), str):
                raise ApiError(400, "each message's content must be text", "messages")
        text = "".join(m["content"] for m in messages)
    else:
        text = body.get("prompt")
        if not isinstance(text, str):
            raise ApiError(400, "prompt must be one string (DEX runs one prompt a request)", "prompt")
    if len(text) > MAX_PROMPT_CHARS:
        raise ApiError(413, f"the prompt is longer than {MAX_PROMPT_CHARS} characters", "prompt")
    try:
        check_text(text)
    except DexError as err:
        raise ApiError(400, str(err), "prompt") from None
    if chat:
        messages = [{"role": m["role"], "content": m["content"]} for m in body["messages"]]
        return chat_ids(tokenizer, messages, generation_prompt=True)
    return tokenizer(text, add_special_tokens=True)["input_ids"]


def parse_request(body, tokenizer, served: str, most_tokens: int, chat: bool) -> Completion:
    """``body`` (parsed JSON) as a ``Completion`` for the model named ``served``; at most ``most_tokens`` new
    tokens. ``ApiError`` for a field that is missing, of the wrong type, out of range or not supported."""
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    unknown = sorted(set(body) - KNOWN)
    if unknown:
        raise ApiError(400, f"DEX does not support {', '.join(map(repr, unknown))}", unknown[0])
    if body.get("model") != served:
        raise ApiError(
            404,
            f"the model {str(body.get('model'))[:80]!r} is not served here; this serves {served!r}",
            "model",
            "not_found_error",
        )
    if _number(body, "n", int, 1) != 1:
        raise ApiError(400, "n must be 1: DEX makes one completion a request", "n")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise ApiError(400, "stream must be true or false", "stream")
    name = "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"
    tokens = _number(body, name, int, most_tokens if chat else min(16, most_tokens))  # OpenAI's defaults
    if not 1 <= tokens <= most_tokens:
        raise ApiError(400, f"{name} must be between 1 and {most_tokens} (this server's bound)", name)
    temperature = _number(body, "temperature", float, 1.0)  # OpenAI's default: sampling
    top_p = _number(body, "top_p", float, 1.0)
    top_k = _number(body, "top_k", int, 0)
    seed = _number(body, "seed", int, 0)
    if temperature < 0:
        raise ApiError(400, "temperature must be >= 0 (0: greedy)", "temperature")
    if not 0 < top_p <= 1:
        raise ApiError(400, "top_p must be in (0, 1]", "top_p")
    try:
        options = GenerationOptions(
            max_new_tokens=tokens,
            temperature=temperature,
            top_k=top_k or None,
            top_p=None if top_p == 1 else top_p,
            seed=seed,
        )
    except DexError as err:
        raise ApiError(400, str(err)) from None
    return Completion(_prompt_ids(body, tokenizer, chat), options, _stop(body), stream, chat)
