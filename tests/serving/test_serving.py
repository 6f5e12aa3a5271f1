"""The OpenAI-compatible API (``dex_core.serving.api``) driven by the official ``openai`` client, on the
sequential and the distributed schedule of a tiny float64 model: the text is AR's, a stream gives one chunk per
committed token in order, ``usage`` counts what the trace shows, bad requests get a 4xx with an OpenAI error body
and nothing in the server's log, and a full queue answers 429 at once."""

import functools
import json
import socket
import time

import httpx
import pytest
import torch
from helpers import SERVED, closed_within, half_open, hostile_http, scrape, serving

from dex_core import DexDecoder, ar_generate
from dex_core.runtime.request import chat_ids
from dex_core.serving import connections
from dex_core.serving.api_requests import MAX_BODY_BYTES, parse_request
from dex_core.serving.bodies import MAX_MESSAGES
from dex_core.serving.runner import Runner
from dex_core.testing import tiny_tokenizer
from dex_core.trace.events import RoundEvent

PROMPT = "hello world the prime number"


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer()


@pytest.fixture(scope="module")
def sequential(llama, tokenizer):
    decoder = DexDecoder(llama, explorers=3, tokenizer=tokenizer)
    with serving(decoder, tokenizer, most_tokens=64, queue=0) as url:
        yield url, decoder


def client(url: str):
    from openai import OpenAI

    return OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60)


def expected(llama, tokenizer, tokens: int):
    ids = tokenizer(PROMPT, add_special_tokens=True)["input_ids"]
    return ids, ar_generate(llama, ids, tokens).tokens


def test_a_completion_is_ars_text_with_usage_from_its_trace(sequential, llama, tokenizer):
    url, decoder = sequential
    ids, tokens = expected(llama, tokenizer, 24)
    reply = client(url).completions.create(model=SERVED, prompt=PROMPT, max_tokens=24, temperature=0)
    assert reply.choices[0].text == tokenizer.decode(tokens, skip_special_tokens=True)
    assert reply.choices[0].finish_reason in ("length", "stop")
    trace = decoder.generate(ids, 24).trace
    commits = [c for e in trace for c in e.commits]
    accepted = sum(1 for c in commits if c.matched_stage < 2 or c.drafted)
    assert accepted > 0  # the check below can fail: DEX matched early here
    usage = reply.usage
    assert (usage.prompt_tokens, usage.completion_tokens) == (len(ids), len(tokens))
    assert usage.completion_tokens_details.accepted_prediction_tokens == accepted
    extra = usage.model_extra["dex"]
    assert extra["explorers"] == 3 and sum(extra["matched_per_stage"]) == len(tokens)


def test_several_prompts_are_each_a_choice_with_ars_text_and_their_usage_summed(sequential, llama, tokenizer):
    url, _ = sequential
    ids, tokens = expected(llama, tokenizer, 6)
    other = tokenizer("the number", add_special_tokens=True)["input_ids"]
    body = {
        "model": SERVED,
        "prompt": [ids, other],
        "max_tokens": 6,
        "temperature": 0,
    }  # as lm-eval sends them
    reply = httpx.post(f"{url}/v1/completions", json=body, timeout=60).json()
    texts = [c["text"] for c in sorted(reply["choices"], key=lambda c: c["index"])]
    assert texts == [
        tokenizer.decode(ar_generate(llama, p, 6).tokens, skip_special_tokens=True) for p in (ids, other)
    ]
    assert (
        reply["usage"]["prompt_tokens"] == len(ids) + len(other) and reply["usage"]["completion_tokens"] == 12
    )


def test_echo_scores_each_prompt_with_the_models_own_log_softmax(sequential, llama, tokenizer):
    url, _ = sequential
    ids = tokenizer(PROMPT, add_special_tokens=True)["input_ids"]
    body = {
        "model": SERVED,
        "prompt": [ids, ids],
        "echo": True,
        "max_tokens": 1,
        "temperature": 0,
        "logprobs": 2,
    }
    reply = httpx.post(f"{url}/v1/completions", json=body, timeout=60).json()
    text = httpx.post(f"{url}/v1/completions", json={**body, "prompt": PROMPT}, timeout=60).json()
    with torch.no_grad():
        truth = torch.log_softmax(llama(torch.tensor([ids])).logits[0].double(), dim=-1)
    following = truth[:-1].gather(1, torch.tensor(ids[1:])[:, None])[:, 0].tolist()
    for choice in reply["choices"]:
        scores = choice["logprobs"]
        assert scores["token_logprobs"][0] is None and scores["top_logprobs"][0] is None
        assert scores["token_logprobs"][1:-1] == pytest.approx(following, abs=1e-5)  # the prompt's tokens
        assert scores["token_logprobs"][-1] == pytest.approx(
            truth[-1].max().item(), abs=1e-5
        )  # its greedy next
        assert choice["text"].endswith(tokenizer.decode([truth[-1].argmax().item()]))
        assert all(len(top) <= 2 for top in scores["top_logprobs"][1:])
        assert (
            max(scores["top_logprobs"][-1].values()) == scores["token_logprobs"][-1]
        )  # lm-eval's greedy test
    assert text["choices"][0]["text"].startswith(PROMPT)  # a prompt given as text comes back as given
    assert text["choices"][0]["logprobs"] == reply["choices"][0]["logprobs"]
    assert reply["usage"] == {
        "prompt_tokens": 2 * len(ids),
        "completion_tokens": 2,
        "total_tokens": 2 * len(ids) + 2,
    }


def test_chat_logprobs_are_the_models_log_softmax_at_each_token_streamed_and_whole(
    sequential, llama, tokenizer
):
    url, _ = sequential
    messages = [{"role": "user", "content": PROMPT}]
    ids = chat_ids(tokenizer, messages, generation_prompt=True)
    made = llama.generate(
        torch.tensor([ids]),
        max_new_tokens=12,
        do_sample=False,
        output_logits=True,
        return_dict_in_generate=True,
        eos_token_id=None,
        pad_token_id=0,
    )
    truth = [torch.log_softmax(step[0].float(), dim=-1) for step in made.logits]
    tokens = made.sequences[0, len(ids) :].tolist()
    ask = functools.partial(
        client(url).chat.completions.create,
        model=SERVED,
        messages=messages,
        max_tokens=12,
        temperature=0,
        logprobs=True,
        top_logprobs=3,
    )
    whole = ask().choices[0].logprobs.content
    streamed = [
        entry
        for chunk in ask(stream=True)
        if chunk.choices[0].logprobs
        for entry in chunk.choices[0].logprobs.content
    ]
    for content in (whole, streamed):
        assert [entry.token for entry in content] == [tokenizer.decode([t]) for t in tokens]  # one a token
        for entry, token, scores in zip(content, tokens, truth):
            assert entry.logprob == pytest.approx(scores[token].item(), abs=1e-5)
            best = scores.topk(3)
            assert [e.logprob for e in entry.top_logprobs] == pytest.approx(best.values.tolist(), abs=1e-5)
            assert [e.token for e in entry.top_logprobs] == [
                tokenizer.decode([t]) for t in best.indices.tolist()
            ]
    plain = client(url).completions.create(
        model=SERVED, prompt=PROMPT, max_tokens=4, temperature=0, logprobs=2
    )
    assert (
        len(plain.choices[0].logprobs.token_logprobs) == 4
        and len(plain.choices[0].logprobs.top_logprobs[0]) <= 2
    )


def test_a_stream_gives_one_chunk_per_token_in_order_then_usage_when_asked(sequential, llama, tokenizer):
    url, _ = sequential
    _, tokens = expected(llama, tokenizer, 20)
    ask = functools.partial(
        client(url).completions.create, model=SERVED, prompt=PROMPT, max_tokens=20, temperature=0, stream=True
    )
    chunks = list(ask(stream_options={"include_usage": True}))
    texts = [c.choices[0].text for c in chunks[:-2]]
    assert len(texts) == len(tokens) and "".join(texts) == tokenizer.decode(tokens, skip_special_tokens=True)
    assert chunks[-2].choices[0].finish_reason == "length" and all(c.usage is None for c in chunks[:-1])
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(
        tokens
    )  # OpenAI's last chunk
    plain = list(ask())  # not asked: no usage anywhere
    assert len(plain) == len(tokens) + 1 and all(c.usage is None for c in plain)


def test_the_distributed_schedule_answers_the_same_stream(llama, tokenizer, explorer_group):
    decoder = explorer_group(llama, 3)
    _, tokens = expected(llama, tokenizer, 16)
    with serving(decoder, tokenizer, most_tokens=32) as url:
        chunks = list(
            client(url).chat.completions.create(
                model=SERVED,
                messages=[{"role": "user", "content": PROMPT}],
                max_tokens=16,
                temperature=0,
                stream=True,
            )
        )
        whole = client(url).chat.completions.create(
            model=SERVED, messages=[{"role": "user", "content": PROMPT}], max_tokens=16, temperature=0
        )
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert streamed == whole.choices[0].message.content and whole.usage.completion_tokens == 16
    assert len(chunks) == 16 + 1


def test_metrics_count_each_stage_as_the_trace_does(sequential, llama, tokenizer):
    url, decoder = sequential
    before = scrape(url)
    list(
        client(url).completions.create(model=SERVED, prompt=PROMPT, max_tokens=24, temperature=0, stream=True)
    )
    after = scrape(url)
    trace = decoder.generate(expected(llama, tokenizer, 24)[0], 24).trace
    rounds = [e for e in trace if isinstance(e, RoundEvent)]
    matched, proposed = [0, 0, 0], [0, 0, 0]
    for event in rounds:
        for commit in event.commits:
            matched[commit.matched_stage] += 1
        for node in event.nodes:
            proposed[node.stage] += node.token >= 0
    assert matched[0] + matched[1] > 0  # stages before the last matched: the per-stage check can fail

    def delta(name, **labels):
        key = (name, tuple(sorted((k, str(v)) for k, v in labels.items())))
        return after[key] - before.get(key, 0.0)

    depths = decoder.depths
    per_stage = "dex:spec_decode_num_accepted_tokens_per_stage_total"
    assert [delta(per_stage, stage=k, depth=depths[k]) for k in range(3)] == matched
    drafts = "dex:spec_decode_num_draft_tokens_per_stage_total"
    assert [delta(drafts, stage=k, depth=depths[k]) for k in range(3)] == proposed
    assert delta("dex:rounds_total") == len(rounds) and delta("dex:generation_tokens_total") == 24
    assert delta("dex:request_success_total", finished_reason="length") == 1
    assert delta("dex:time_to_first_token_seconds_count") == 1
    assert delta("dex:time_per_output_token_seconds_count") == 23
    assert after[("dex:num_requests_running", ())] == 0


BAD = [
    ({"n": 2}, 400, "n must be 1"),
    ({"max_tokens": 0}, 400, "max_tokens 0 is for scoring a prompt (echo: true)"),
    ({"max_tokens": 65}, 400, "max_tokens must be between 0 and 64"),
    ({"max_tokens": -1}, 400, "max_tokens must be between 0 and 64"),
    ({"temperature": -0.5}, 400, "temperature must be >= 0"),
    ({"top_p": 1.5}, 400, "top_p must be in (0, 1]"),
    ({"max_tokens": "ten"}, 400, "max_tokens must be an integer"),
    ({"logprobs": 6, "echo": True, "max_tokens": 0}, 400, "logprobs must be between 0 and 5"),
    ({"echo": True, "max_tokens": 2}, 400, "echo scores the prompt: max_tokens must be 0 or 1"),
    ({"echo": True, "max_tokens": 1, "temperature": 0.7}, 400, "temperature must be 0"),
    ({"echo": True, "max_tokens": 0, "stream": True}, 400, "is answered whole, not streamed"),
    ({"stream_options": {"include_usage": True}}, 400, "stream_options is for a stream"),
    ({"stream": True, "stream_options": {"include_usage": 1}}, 400, "stream_options.include_usage must be"),
    ({"prompt": [5, 96]}, 400, "token ids must be in [0, 96)"),
    ({"prompt": [5, -1]}, 400, "prompt must be a string, a list of token ids"),
    ({"prompt": ["a"] * 17}, 400, "a list of 1 to 16"),
    ({"prompt": ["a", [5]]}, 400, "prompt must be a string"),
    ({"prompt": ["hello", "world"], "stream": True}, 400, "a stream takes one prompt"),
    ({"model": "gpt-4"}, 404, "is not served here"),
    ({"prompt": "x" * 2**20}, 413, "the prompt is longer than"),
    ({"seed": 2**64}, 400, f"seed must be between 0 and {2**64 - 1}"),
    ({"seed": 1.5}, 400, "seed must be an integer"),
    ({"top_k": -1}, 400, "top_k must be >= 0"),
    ({"stream": "yes"}, 400, "stream must be true or false"),
    ({"stop": ["a"] * 5}, 400, "stop must be a non-empty string or a list of up to 4"),
]


def test_a_whole_number_written_as_a_float_is_the_integer_it_is(tokenizer):
    """``/openapi.json`` declares the counts as JSON Schema's ``integer``, which takes ``2.0`` (found by
    tests/serving/test_fuzz.py); a fraction is refused (``BAD``)."""
    body = {"model": SERVED, "prompt": PROMPT, "max_tokens": 2.0, "seed": 7.0, "top_k": 3.0, "n": 1.0}
    job = parse_request(body, tokenizer, SERVED, 64, chat=False)
    assert (job.options.max_new_tokens, job.options.seed, job.options.top_k) == (2, 7, 3)


def test_bad_requests_get_an_openai_error_body_and_the_server_logs_nothing(sequential, capfd):
    url, _ = sequential
    capfd.readouterr()
    for change, status, message in BAD:
        body = {"model": SERVED, "prompt": PROMPT, "max_tokens": 4, **change}
        reply = httpx.post(f"{url}/v1/completions", json=body, timeout=30)
        assert reply.status_code == status and message in reply.json()["error"]["message"], (
            change,
            reply.text,
        )
    chat = {"model": SERVED, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 4}
    for change, message in (
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs must be between 0 and 20"),
        ({"top_logprobs": 2}, "top_logprobs needs logprobs: true"),
        ({"logprobs": 1}, "logprobs must be true or false"),
        ({"echo": True}, "DEX does not support 'echo'"),
    ):
        reply = httpx.post(f"{url}/v1/chat/completions", json={**chat, **change}, timeout=30)
        assert reply.status_code == 400 and message in reply.json()["error"]["message"], (change, reply.text)
    raw = httpx.post(f"{url}/v1/completions", content=b"\xff\xfe{", timeout=30)
    assert raw.status_code == 400 and "JSON" in raw.json()["error"]["message"]
    start = time.monotonic()
    assert httpx.get(f"{url}/health", timeout=5).json() == {"status": "ok"}
    assert time.monotonic() - start < 5
    log = capfd.readouterr()
    assert "Traceback" not in log.err + log.out


def _cut_off(url: str, declared: int, sent: bytes) -> None:
    """A client that declares a body of ``declared`` bytes, sends ``sent`` and closes its connection."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as conn:
        head = f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        conn.sendall(f"{head}Content-Length: {declared}\r\n\r\n".encode() + sent)


def test_hostile_bodies_are_refused_at_the_door_and_the_server_logs_nothing(sequential, tokenizer, capfd):
    url, decoder = sequential
    capfd.readouterr()
    post = functools.partial(httpx.post, f"{url}/v1/completions", timeout=30)
    nested = b'{"model": "%s", "prompt": ' % SERVED.encode() + b"[" * 2000 + b"]" * 2000 + b"}"
    deep = post(content=nested)
    assert deep.status_code == 400 and "nested too deeply" in deep.json()["error"]["message"]
    huge = post(content=b" " * (MAX_BODY_BYTES + 1))  # told by its length, before any of it is parsed
    assert huge.status_code == 413 and huge.json()["error"]["type"] == "invalid_request_error"
    streamed = post(content=iter([b" " * 2**20] * 5))  # no length declared: counted as it arrives
    assert streamed.status_code == 413 and "larger than" in streamed.json()["error"]["message"]
    chat = {"model": SERVED, "messages": [{"role": "user", "content": ""}] * (MAX_MESSAGES + 1)}
    many = httpx.post(f"{url}/v1/chat/completions", json=chat, timeout=30)
    assert many.status_code == 400 and f"1 to {MAX_MESSAGES}" in many.json()["error"]["message"]
    context = decoder.view.max_positions
    long = " ".join(["prime"] * context)  # more tokens than the model's positions
    beyond = post(json={"model": SERVED, "prompt": long, "max_tokens": 4})
    assert (
        beyond.status_code == 400
        and f"context window is {context} tokens" in beyond.json()["error"]["message"]
    )
    prompt = " ".join(["prime"] * (context - 40))
    size = len(tokenizer(prompt)["input_ids"])
    fits = post(json={"model": SERVED, "prompt": prompt, "max_tokens": 64})  # asked for more than fits: 400
    assert fits.status_code == 400 and fits.json()["error"]["param"] == "max_tokens"
    shrunk = post(json={"model": SERVED, "prompt": prompt, "temperature": 0})  # no length asked: what fits
    assert shrunk.status_code == 200 and shrunk.json()["usage"]["completion_tokens"] <= context - size
    for _ in range(1000):
        _cut_off(url, 1000, b'{"model":')  # the body never arrives whole
    assert httpx.get(f"{url}/health", timeout=5).json() == {"status": "ok"}
    log = capfd.readouterr()
    assert "Traceback" not in log.err + log.out and len((log.err + log.out).splitlines()) <= 5


def test_a_body_that_stalls_is_refused_within_its_bound(sequential, monkeypatch):
    from dex_core.serving import api_requests

    monkeypatch.setattr(api_requests, "BODY_SECONDS", 0.5)
    url, _ = sequential
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as conn:
        head = f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        conn.sendall(f"{head}Content-Length: 100\r\n\r\n".encode() + b'{"model":')  # then nothing
        start = time.monotonic()
        answer = b""
        while b"did not arrive" not in answer and (chunk := conn.recv(4096)):  # the head, then the body
            answer += chunk
        answer = answer.decode()
    assert answer.startswith("HTTP/1.1 408") and "did not arrive within 0.5 s" in answer
    assert time.monotonic() - start < 3


@pytest.fixture
def prompt_bounds(monkeypatch):
    """The connections' bounds a second, checked every 0.2 s (``dex_core.serving.connections``)."""
    for name, seconds in (("HEAD_SECONDS", 1.0), ("BODY_GAP_SECONDS", 1.0), ("CHECK_SECONDS", 0.2)):
        monkeypatch.setattr(connections, name, seconds)


def _stall_head(path: str = "/v1/completions") -> bytes:
    """A request's head declaring 100 bytes of body, and the body's first 9."""
    return f'POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{{"model":'.encode()


def test_connections_that_stop_sending_are_closed_and_others_are_served(sequential, prompt_bounds, capfd):
    url, _ = sequential
    capfd.readouterr()
    silent = half_open(url, 500)  # a head that never ends
    stalled = half_open(url, 20, start=_stall_head())  # a body that stops
    start = time.monotonic()
    body = {"model": SERVED, "prompt": PROMPT, "max_tokens": 4}
    answer = httpx.post(f"{url}/v1/completions", json=body, timeout=30)
    assert answer.status_code == 200 and time.monotonic() - start < 2
    assert closed_within(silent + stalled, 6) == 520  # 1 s bounds, checked every 0.2 s, on a busy machine
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as slow:  # steady, if slow: never cut off
        text = json.dumps(body).encode()
        slow.sendall(
            f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: {len(text)}\r\n\r\n".encode()
        )
        for part in (text[:10], text[10:20], text[20:30], text[30:]):
            time.sleep(0.6)  # each pause within the bound, all of them past it
            slow.sendall(part)
        assert slow.recv(64).startswith(b"HTTP/1.1 200")
    log = capfd.readouterr()
    assert "Traceback" not in log.err + log.out and len((log.err + log.out).splitlines()) <= 5


def test_health_answers_within_a_second_through_100_hostile_requests(sequential, prompt_bounds, capfd):
    url, _ = sequential
    capfd.readouterr()
    result = hostile_http().health_during(url, 100, workers=8)
    assert result["health_failures"] == 0 and result["longest_wait_s"] <= 1.0, result
    answers = result["answers"]
    assert answers["nested 2,000 deep"] == {"400": 13} and answers["100,000 empty messages"] == {"400": 13}
    assert answers["5 MiB streamed"] == {"413": 13} and answers["prompt past the context"] == {"400": 12}
    assert answers["head never ends"] == {"closed": 12} and answers["not HTTP"] == {"400": 12}
    log = capfd.readouterr()
    assert "Traceback" not in log.err + log.out and len((log.err + log.out).splitlines()) <= 5


def test_a_client_of_a_whole_answer_that_leaves_ends_its_run(llama, tokenizer):
    body = {"model": SERVED, "prompt": PROMPT, "max_tokens": 64, "temperature": 0}
    paced = Paced(DexDecoder(llama, explorers=3, tokenizer=tokenizer))
    with serving(paced, tokenizer, most_tokens=64, queue=0) as url:
        host, port = url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=5) as conn:
            data = json.dumps(body).encode()
            head = f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            conn.sendall(f"{head}Content-Length: {len(data)}\r\n\r\n".encode() + data)
            time.sleep(0.5)  # it runs (a 64-token run takes over 6 s here)
        left = time.monotonic()
        while 'finished_reason="abort"} 1.0' not in (metrics := httpx.get(f"{url}/metrics", timeout=5).text):
            assert time.monotonic() - left < 3, metrics
            time.sleep(0.05)
        again = httpx.post(f"{url}/v1/completions", json={**body, "max_tokens": 2}, timeout=30)
        assert again.status_code == 200 and time.monotonic() - left < 3  # its slot is free again


class Paced:
    """The decoder, its rounds 0.1 s apart: a run that lasts while the test sends the next request."""

    def __init__(self, decoder):
        self.decoder = decoder

    def stream(self, ids, **kw):
        for event in self.decoder.stream(ids, **kw):
            time.sleep(0.1)
            yield event


def test_beyond_the_queue_a_request_gets_429_at_once_and_a_client_that_leaves_frees_its_slot(
    llama, tokenizer
):
    body = {"model": SERVED, "prompt": PROMPT, "max_tokens": 64, "temperature": 0, "stream": True}
    paced = Paced(DexDecoder(llama, explorers=3, tokenizer=tokenizer))
    with serving(paced, tokenizer, most_tokens=64, queue=0) as url:
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as running:
            lines = running.iter_lines()  # kept: an iterator dropped closes the response
            assert next(lines).startswith("data: ")  # the first chunk: it runs (queue=0: nothing may wait)
            start = time.monotonic()
            refused = httpx.post(f"{url}/v1/completions", json={**body, "stream": False}, timeout=30)
            assert refused.status_code == 429 and "queue is full" in refused.json()["error"]["message"]
            assert time.monotonic() - start < 2
        left = time.monotonic()  # the client left: its run ends after its round, and the slot frees
        while (
            again := httpx.post(f"{url}/v1/completions", json={**body, "max_tokens": 2, "stream": False})
        ).status_code == 429:
            time.sleep(0.05)
        assert again.status_code == 200 and time.monotonic() - left < 1.5  # a 64-token run would take > 6 s


def test_a_client_told_its_stream_ended_may_send_its_next_request_at_once(sequential, tokenizer, monkeypatch):
    """The run's admission ends before its last chunk goes out: a slow release (a busy machine's worker thread)
    delays the [DONE], never answers the client's next request 429 (queue=0: nothing may wait)."""
    release = Runner.release

    def slow(runner, client=""):
        time.sleep(0.4)
        release(runner, client)

    monkeypatch.setattr(Runner, "release", slow)
    url, _ = sequential
    body = {"model": SERVED, "prompt": PROMPT, "max_tokens": 4, "temperature": 0, "stream": True}
    for _ in range(3):
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as answer:
            assert (
                answer.status_code == 200
                and [line for line in answer.iter_lines() if line][-1] == "data: [DONE]"
            )


def test_one_client_may_hold_at_most_its_share_of_the_queue():
    from dex_core.serving.api_requests import ApiError

    runner = Runner(decoder=None, queue=4, seconds=0, per_client=1)
    runner.admit("10.0.0.1")
    with pytest.raises(ApiError, match="this client has 1 request") as refused:
        runner.admit("10.0.0.1")
    assert refused.value.status == 429
    runner.admit("10.0.0.2")  # another visitor still gets in
    runner.release("10.0.0.1")
    runner.admit("10.0.0.1")  # its slot came back when its run ended
    assert runner.admitted == 2


def test_requests_at_once_share_rounds_and_each_answer_is_ars(llama, tokenizer):
    """``most=3``: three streaming clients at once run in the same rounds (``/metrics``: the shared rounds' rows
    hold several requests'), each answer AR's text, and the running count never passes 3."""
    import threading

    decoder = DexDecoder(llama, explorers=3, tokenizer=tokenizer)
    prompts = [PROMPT, "the number w3 w7", "a prime w12 w40 w41"]
    answers, lanes = {}, []
    with serving(decoder, tokenizer, most_tokens=64, queue=4, most=3) as url:

        def ask(prompt):
            body = {"model": SERVED, "prompt": prompt, "max_tokens": 40, "temperature": 0, "stream": True}
            with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as reply:
                chunks = [json.loads(line[6:]) for line in reply.iter_lines() if line.startswith("data: {")]
            answers[prompt] = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])

        threads = [threading.Thread(target=ask, args=(p,)) for p in prompts]
        for t in threads:
            t.start()
        while any(t.is_alive() for t in threads):
            lanes.append(len(decoder.explorers[0].seats))
            time.sleep(0.002)
        metrics = httpx.get(f"{url}/metrics").text
    for prompt in prompts:
        ids = tokenizer(prompt, add_special_tokens=True)["input_ids"]
        assert answers[prompt] == tokenizer.decode(
            ar_generate(llama, ids, 40).tokens, skip_special_tokens=True
        )
    assert max(lanes) >= 2 and max(lanes) <= 3  # requests shared the stage steps, at most 3 of them
    shared = float(
        next(line.split()[-1] for line in metrics.splitlines() if line.startswith("dex:rounds_shared "))
    )
    assert shared > 0 and "dex:rows_per_round" in metrics
