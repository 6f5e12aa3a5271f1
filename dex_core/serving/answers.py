"""OpenAI's answer forms for the API (``dex_core.serving.api``): a whole completion or a stream's chunk, a
scored prompt's choice, the log-probabilities of committed tokens (chat's and a completion's forms), ``usage``
from a run's typed events, and a completion's text as its tokens commit (``TextPieces``, cut at a stop string)."""

from __future__ import annotations

import time

from ..runtime.console import TextStream
from ..runtime.scoring import Scored
from ..trace.events import EndEvent, Event, RoundEvent
from .api_requests import Completion


class TextPieces:
    """The text of a growing token list, piece by piece (``TextStream``'s windowed decode), cut at a stop string."""

    def __init__(self, tokenizer, stops: tuple[str, ...]):
        self.pieces, self.stops, self.stopped = [], stops, False
        self.stream = TextStream(tokenizer, out=self)

    def write(self, piece: str) -> None:
        self.pieces.append(piece)

    def flush(self) -> None:
        pass

    def push(self, token: int) -> str:
        """The new text ``token`` makes visible ("" while held back), cut before a stop string (then ``stopped``)."""
        before, done = len(self.pieces), "".join(self.pieces)
        self.stream.push(token)
        new = "".join(self.pieces[before:])
        for stop in self.stops:
            at = (done + new).find(stop)
            if at >= 0:
                self.stopped = True
                return (done + new)[:at][len(done) :]
        return new


def usage(prompt: int, events: list[Event]) -> dict:
    """The OpenAI ``usage`` of a run (its typed events), with DEX's own counts."""
    start = events[0]
    K, commits = start.explorers, [c for e in events for c in e.commits]
    matched = [0] * K
    for c in commits:
        matched[c.matched_stage] += 1
    accepted = sum(1 for c in commits if c.matched_stage < K - 1 or c.drafted)
    rounds = sum(1 for e in events if isinstance(e, RoundEvent))
    return {
        "prompt_tokens": prompt,
        "completion_tokens": len(commits),
        "total_tokens": prompt + len(commits),
        "completion_tokens_details": {"accepted_prediction_tokens": accepted},
        "dex": {
            "explorers": K,
            "depths": start.depths,
            "rounds": rounds,
            "rounds_per_token": round(rounds / max(1, len(commits)), 4),
            "matched_per_stage": matched,
            **_speed(events[-1]),
        },
    }


def _speed(end: Event) -> dict:
    """The run's model seconds and model tokens/s (``GenerationStats``: its own compute and host work, not the
    time the server spent streaming it), when the run reached its end event."""
    if not isinstance(end, EndEvent):
        return {}
    stats = end.stats
    return {
        "model_seconds": round(stats.model_seconds, 4),
        "model_tokens_per_second": round(stats.tokens_per_second, 3),
    }


def combined(uses: list[dict]) -> dict:
    """The ``usage`` of several prompts' runs (``usage``'s each): counts summed, DEX's rounds over all tokens."""
    if len(uses) == 1:
        return uses[0]
    out = {key: sum(u[key] for u in uses) for key in ("prompt_tokens", "completion_tokens", "total_tokens")}
    out["completion_tokens_details"] = {
        "accepted_prediction_tokens": sum(
            u["completion_tokens_details"]["accepted_prediction_tokens"] for u in uses
        )
    }
    dex = {**uses[0]["dex"], "rounds": sum(u["dex"]["rounds"] for u in uses)}
    dex["rounds_per_token"] = round(dex["rounds"] / max(1, out["completion_tokens"]), 4)
    dex["matched_per_stage"] = [sum(m) for m in zip(*(u["dex"]["matched_per_stage"] for u in uses))]
    if all("model_seconds" in u["dex"] for u in uses):
        seconds = sum(u["dex"]["model_seconds"] for u in uses)
        dex["model_seconds"] = round(seconds, 4)
        dex["model_tokens_per_second"] = round(out["completion_tokens"] / seconds, 3) if seconds else 0.0
    return {**out, "dex": dex}


def reply(job: Completion, rid: str, served: str, choices: list, suffix: str = "", **extra) -> dict:
    """OpenAI's envelope around ``choices``: a chat completion or a text completion (``suffix``: ".chunk")."""
    kind = ("chat.completion" if job.chat else "text_completion") + (suffix if job.chat else "")
    return {
        "id": rid,
        "object": kind,
        "created": int(time.time()),
        "model": served,
        "choices": choices,
        **extra,
    }


def chunk(
    job: Completion, rid: str, served: str, text: str | None, finish: str | None, scores: dict | None = None
) -> dict:
    """One chunk of a stream (``scores``: its token's log-probabilities, when asked); with ``usage_chunk`` every
    chunk says ``usage: null`` but the last (OpenAI's)."""
    usage = {"usage": None} if job.usage_chunk else {}
    if job.chat:
        delta = {} if text is None else {"content": text}
        choice = {"index": 0, "delta": delta, "finish_reason": finish}
        choice |= {"logprobs": scores} if job.logprobs is not None else {}
        return reply(job, rid, served, [choice], ".chunk", **usage)
    choice = {"index": 0, "text": text or "", "finish_reason": finish, "logprobs": scores}
    return reply(job, rid, served, [choice], **usage)


def said(token: str, value: float | None) -> dict:
    """A token in chat's log-probabilities: its text, log-probability and UTF-8 bytes."""
    return {"token": token, "logprob": value, "bytes": list(token.encode())}


def logprobs_of(job: Completion, tokenizer, commits: list, offset: int = 0) -> dict | None:
    """The log-probabilities of ``commits`` (commit records, which carry them) in OpenAI's form: chat's
    ``{"content": [{token, logprob, bytes, top_logprobs}]}``, a completion's ``{tokens, token_logprobs,
    top_logprobs, text_offset}`` (its text starting ``offset`` characters in); None when the request did not ask."""
    if job.logprobs is None:
        return None
    pieces = [tokenizer.decode([c.token]) for c in commits]
    tops = [[(tokenizer.decode([t]), v) for t, v in (c.top_logprobs or [])[: job.logprobs]] for c in commits]
    if job.chat:
        content = [
            {**said(p, c.logprob), "top_logprobs": [said(t, v) for t, v in top]}
            for p, c, top in zip(pieces, commits, tops)
        ]
        return {"content": content}
    return {
        "tokens": pieces,
        "token_logprobs": [c.logprob for c in commits],
        "top_logprobs": [dict(top) for top in tops],
        "text_offset": [offset + sum(map(len, pieces[:i])) for i in range(len(pieces))],
    }


def scored_choice(job: Completion, tokenizer, i: int, scored: Scored) -> dict:
    """The ``i``-th prompt's choice: its text (and the next token's), its log-probabilities when asked."""
    tokens, values, tops = list(job.prompts[i]), list(scored.logprobs), list(scored.top)
    if job.next_token:
        tokens, values, tops = (
            tokens + [scored.next[0][0]],
            values + [scored.next[0][1]],
            tops + [scored.next],
        )
    pieces = [tokenizer.decode([t]) for t in tokens]
    prompt = job.texts[i] if job.texts[i] is not None else tokenizer.decode(job.prompts[i])
    text = prompt + (pieces[-1] if job.next_token else "")
    logprobs = None
    if job.logprobs is not None:
        offsets = [sum(map(len, pieces[:j])) for j in range(len(pieces))]
        alternatives = [
            None if j == 0 else {tokenizer.decode([t]): v for t, v in top[: job.logprobs]}
            for j, top in enumerate(tops)
        ]
        logprobs = {
            "tokens": pieces,
            "token_logprobs": values,
            "top_logprobs": alternatives,
            "text_offset": offsets,
        }
    return {"index": i, "text": text, "finish_reason": "length", "logprobs": logprobs}


def whole(job: Completion, rid: str, served: str, answers: list[tuple]) -> dict:
    """The whole answer: a choice for each prompt's (text, finish reason, usage, log-probabilities), their usage
    together."""
    if job.chat:
        text, finish, use, scores = answers[0]
        choice = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}
        choice |= {"logprobs": scores} if job.logprobs is not None else {}
        return reply(job, rid, served, [choice], usage=use)
    choices = [
        {"index": i, "text": text, "finish_reason": finish, "logprobs": scores}
        for i, (text, finish, _, scores) in enumerate(answers)
    ]
    return reply(job, rid, served, choices, usage=combined([a[2] for a in answers]))
