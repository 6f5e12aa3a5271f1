"""The app under concurrent load (bounded: 8 clients, a few requests each, on a tiny model), and the
distributed backend's bound on live explorer groups."""

import gc
import threading
import time

import psutil
import pytest
from helpers import live_children, shown_tokens, started_since

from dex_core import DexError, ar_generate, encode_prompt, load_model
from dex_core.testing import tiny_tokenizer

PROMPTS = ["hello world the prime number", "the number w3 w7", "a prime w12 w40 w41", "world w5 the a"]


def _client(url, worker: int, model, results: list, errors: list) -> None:
    from gradio_client import Client

    tok = tiny_tokenizer()
    try:
        client = Client(url, verbose=False)
        for i in range(3):
            prompt = PROMPTS[(worker + i) % len(PROMPTS)]
            ids = encode_prompt(tok, prompt, chat=False)
            kind = ("generate", "race", "cancel")[(worker + i) % 3]
            if kind == "generate":
                k, n = 2 + (worker % 3), 10 + worker
                *_, last = client.submit(
                    prompt, False, k, "", False, True, False, 1.0, 0, 1.0, 0, n, api_name="/generate"
                )
                ar = ar_generate(model, ids, n).tokens
                results.append(shown_tokens(last[0]) == "".join(tok.decode([t]) for t in ar))
            elif kind == "race":
                ar_text, dex_text, _, summary = client.predict(prompt, False, 3, False, 12, api_name="/race")
                results.append(ar_text == dex_text and "identical output" in summary)
            else:
                job = client.submit(
                    prompt, False, 4, "", False, True, False, 1.0, 0, 1.0, 0, 200, api_name="/generate"
                )
                for _ in job:
                    break
                job.cancel()
                results.append(True)
    except Exception as err:  # reported by the test, with the worker's number
        errors.append(f"worker {worker}: {type(err).__name__}: {err}")


@pytest.mark.slow
def test_eight_concurrent_clients_get_exact_answers_and_memory_returns_near_baseline(app_server, tiny_dir):
    from transformers import AutoModelForCausalLM

    url, model = app_server.url, AutoModelForCausalLM.from_pretrained(tiny_dir)
    me = psutil.Process()
    running = live_children()  # the session's own (its Chromium, explorer groups other tests share)
    _client(url, 0, model, [], [])  # warm-up: model loaded, code paths compiled
    gc.collect()
    baseline = me.memory_info().rss
    results, errors = [], []
    threads = [threading.Thread(target=_client, args=(url, w, model, results, errors)) for w in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert not any(t.is_alive() for t in threads), "a client did not finish within 600 s"
    assert not errors, errors
    assert len(results) == 24 and all(results), results
    gc.collect()
    grown = (me.memory_info().rss - baseline) / 2**20
    assert grown < 150, f"RSS grew by {grown:.0f} MB under load"
    assert not started_since(running)  # the sequential backend starts no process


@pytest.mark.slow
@pytest.mark.process
def test_distributed_requests_with_different_settings_leave_at_most_one_explorer_group(tiny_dir):
    from app.host.settings import AppSettings
    from app.host.state import Runtime
    from app.ui.inputs import Inputs

    runtime = Runtime(AppSettings(model=str(tiny_dir), backend="distributed"))
    running = live_children()  # the session's own (its Chromium, explorer groups other tests share)
    reference, _ = load_model(str(tiny_dir), device="cpu")
    try:
        # groups are keyed by the resolved settings (RunSettings; which fields tell runs apart: test_stage_load):
        # another K, an option changed at the same K, then prune auto, which is 8 on CPU explorers: the same group
        settings = [
            dict(explorers=3),
            dict(explorers=2, decs=False),
            dict(explorers=2, prune="8"),
            dict(explorers=2),
        ]
        groups = []
        for controls in settings:
            config = Inputs(max_new_tokens=6, **controls).config()
            decoder = runtime.decoder(config)
            groups.append(decoder.group.pids())
            ids = encode_prompt(tiny_tokenizer(), "hello world", chat=False)
            assert (
                decoder.generate(ids, options=config.generation()).tokens
                == ar_generate(reference, ids, 6).tokens
            )
            assert decoder.model is None  # the server holds no weights: each explorer reads its own part
            alive = started_since(running)
            assert len(alive) == decoder.K, (controls, alive)
        assert groups[3] == groups[2] and len({tuple(g) for g in groups}) == 3
        with pytest.raises(DexError, match="the Analysis runs the whole model in this server's process"):
            runtime.model("the Analysis")
        # the Race's AR lane: AR through the same stages on the same group, then DEX (no third group)
        from app.ui.handlers import StopRequests
        from app.ui.inputs import Inputs
        from app.ui.race import race_frames

        frames = list(
            race_frames(
                runtime,
                StopRequests(),
                Inputs(prompt="hello world", chat=False, explorers=2, adapters=True, max_new_tokens=6),
            )
        )
        ar_text, dex_text, figure, summary = frames[-1]
        assert ar_text == dex_text and "identical output" in summary
        assert [t.name for t in figure.data] == [
            "AR through the same 2 stages on 2 devices (measured)",
            "DEX on 2 devices (measured)",
        ]
        assert "AR (through the same 2 stages, one device each)" in summary and "Projected" not in summary
        assert decoder.group.pids() == groups[3]
    finally:
        runtime.close()
    assert not started_since(running)


def test_two_visitors_with_the_same_settings_share_rounds_and_each_gets_its_answer_alone(
    app_server, tiny_dir
):
    """Live runs share the model's rounds (``DexDecoder.share``): two visitors who press Generate together both see
    tokens stream before either finishes, and each answer is the one its run gets alone (AR's)."""
    from gradio_client import Client
    from transformers import AutoModelForCausalLM

    model, tok, new = AutoModelForCausalLM.from_pretrained(tiny_dir), tiny_tokenizer(), 120
    prompts = PROMPTS[:2]
    clients = [Client(app_server.url, verbose=False) for _ in prompts]
    jobs = [
        c.submit(p, False, 3, "", False, True, False, 1.0, 0, 1.0, 0, new, api_name="/generate")
        for c, p in zip(clients, prompts)
    ]
    streamed, ended = [None, None], [None, None]
    deadline = time.monotonic() + 300
    while not all(ended) and time.monotonic() < deadline:
        for i, job in enumerate(jobs):
            outputs = job.outputs()
            shown = (
                outputs[-1][0] if outputs else None
            )  # a status-only frame leaves the text as it was (a dict)
            if streamed[i] is None and isinstance(shown, str) and shown_tokens(shown):
                streamed[i] = time.monotonic()
            if ended[i] is None and job.done():
                ended[i] = time.monotonic()
        time.sleep(0.005)
    assert all(ended) and all(streamed)
    assert max(streamed) < min(ended)  # each saw its tokens before either finished
    for job, prompt in zip(jobs, prompts):
        ar = ar_generate(model, encode_prompt(tok, prompt, chat=False), new).tokens
        assert shown_tokens(job.outputs()[-1][0]) == "".join(tok.decode([t]) for t in ar)
