"""A request is checked once (issue 58): each entry point builds one request record where the request enters, and
the prompt's text check (``check_text``) and the warnings about the model's generation config (``ignored_settings``)
run exactly once per request — counted by a profiler hook on those functions' code, so every reference to them
counts, whichever module calls it and in whichever thread."""

import sys
import threading
from collections import Counter
from contextlib import contextmanager

from fastapi.testclient import TestClient
from helpers import run_cli

from dex_core import DexDecoder
from dex_core.runtime import request as requests
from dex_core.serving.api import make_app
from dex_core.testing import tiny_model, tiny_tokenizer

WATCHED = {requests.check_text.__code__: "check_text", requests.ignored_settings.__code__: "ignored_settings"}


@contextmanager
def calls():
    """Calls of the watched functions while the block runs, in this thread and in threads it starts."""
    seen, lock = Counter(), threading.Lock()

    def hook(frame, event, arg):
        if event == "call" and frame.f_code in WATCHED:
            with lock:
                seen[WATCHED[frame.f_code]] += 1

    sys.setprofile(hook)
    threading.setprofile(hook)
    try:
        yield seen
    finally:
        sys.setprofile(None)
        threading.setprofile(None)


def test_the_counter_sees_a_call_from_any_reference_and_any_thread():
    with calls() as seen:
        requests.check_text("a")
        worker = threading.Thread(target=requests.check_text, args=("b",))
        worker.start()
        worker.join()
    assert seen == {"check_text": 2}


def test_a_cli_generate_checks_its_request_once(capsys, tiny_dir):
    with calls() as seen:
        code, _, err = run_cli(
            capsys, "generate", "Hello there", "--model", str(tiny_dir), "--max-new-tokens", "3"
        )
    assert code == 0, err
    assert seen == {"check_text": 1, "ignored_settings": 1}


def test_an_http_completion_checks_its_request_once():
    decoder = DexDecoder(tiny_model("llama"), tokenizer=tiny_tokenizer(), explorers=2)
    with calls() as seen, TestClient(make_app(decoder, decoder.tokenizer, "tiny", 8)) as client:
        reply = client.post(
            "/v1/completions", json={"model": "tiny", "prompt": "Hello there", "max_tokens": 3}
        )
        assert reply.status_code == 200, reply.text
    assert reply.json()["usage"]["completion_tokens"] == 3
    assert seen == {"check_text": 1, "ignored_settings": 1}


def test_a_live_run_checks_its_request_once(tiny_dir):
    from app.host.settings import AppSettings
    from app.host.state import Runtime
    from app.ui import live
    from app.ui.handlers import StopRequests
    from app.ui.inputs import Inputs

    runtime = Runtime(AppSettings(model=str(tiny_dir), explorers=2))
    runtime.prepare()  # the model loads outside the count (it is no part of a request)
    inputs = Inputs(prompt="Hello there", chat=False, explorers=2, max_new_tokens=3)
    runtime.round_cost(
        runtime.decoder(inputs.config())
    )  # the first estimate's timed round: a request of its own
    with calls() as seen:
        frames = list(live.live_frames(runtime, StopRequests(), inputs))
    assert "data-state='finished'" in frames[-1][-1], frames[-1][-1]
    assert seen == {"check_text": 1, "ignored_settings": 1}
    runtime.close()
