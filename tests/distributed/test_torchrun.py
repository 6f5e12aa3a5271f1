"""A group started by torchrun across two local "nodes" (two launches of two ranks each, a c10d rendezvous on
127.0.0.1): ``dex generate`` and the app run DEX K=4 on it, every rank holding only its own stage."""

import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import pytest
from helpers import answers, free_port, scrape

from dex_core import ar_generate, encode_prompt, load_model

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.process


def two_nodes(command: list[str], tmp_path: Path, env=None) -> list[subprocess.Popen]:
    """``command`` (what follows ``torchrun``'s own options) launched as node 0 and node 1, two ranks each."""
    torchrun = shutil.which("torchrun", path=os.path.dirname(sys.executable))
    rendezvous = ["--nnodes", "2", "--nproc-per-node", "2", "--rdzv-backend", "c10d"]
    rendezvous += ["--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--rdzv-id", tmp_path.name]
    return [
        subprocess.Popen(
            [torchrun, *rendezvous, "--node-rank", str(n), *command],
            cwd=ROOT,
            env={**os.environ, **(env or {})},
            stdout=open(tmp_path / f"node{n}.out", "w"),
            stderr=subprocess.STDOUT,
        )
        for n in range(2)
    ]


def _end(nodes: list[subprocess.Popen], seconds: float) -> list[int]:
    try:
        return [p.wait(timeout=seconds) for p in nodes]
    finally:
        for p in nodes:
            if p.poll() is None:
                p.kill()


@pytest.mark.slow  # two torchrun launches of two ranks (about a minute)
def test_dex_serve_on_two_torchrun_nodes_runs_k4_and_prints_ars_text(tiny_dir, tmp_path):
    prompts = ["hello world", "the prime number"]
    args = ["-m", "dex_core.serving", "--model", str(tiny_dir), "--no-chat", "--device", "cpu"]
    args += ["--max-new-tokens", "12", "--prompt", prompts[0], "--prompt", prompts[1]]
    codes = _end(two_nodes(args, tmp_path), 240)
    out = (tmp_path / "node0.out").read_text()
    assert codes == [0, 0], out[-3000:]
    model, tokenizer = load_model(str(tiny_dir), device="cpu")
    for prompt in prompts:
        ar = ar_generate(model, encode_prompt(tokenizer, prompt, chat=False), 12).tokens
        assert tokenizer.decode(ar, skip_special_tokens=True).strip() in out
    assert out.count("depths [2, 3, 5, 6] (K=4; uniform split)") == 2


@pytest.mark.slow  # two torchrun launches of the app (about a minute)
def test_the_app_served_from_two_torchrun_nodes_answers_generate_and_race(tiny_dir, tmp_path):
    from gradio_client import Client

    port = free_port()
    args = [
        "app/main.py",
        "--backend",
        "torchrun",
        "--model",
        str(tiny_dir),
        "--device",
        "cpu",
        "--port",
        str(port),
    ]
    nodes = two_nodes(args, tmp_path, {"GRADIO_TEMP_DIR": str(tmp_path / "gradio")})
    url = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and not answers(url):
            assert all(p.poll() is None for p in nodes), (tmp_path / "node0.out").read_text()[-3000:]
            time.sleep(1)
        client = Client(url, verbose=False)
        controls = (False, 2, "", False, True, False, 1.0, 0, 1.0, 0, 12)  # K=2 asked: the launch's 4 run
        *_, last = list(client.submit("hello world", *controls, api_name="/generate"))
        assert "data-state='finished'" in last[-1] and "K=4" in last[-1], last[-1]
        ar_text, dex_text, _, summary = client.predict("hello world", False, 2, False, 12, api_name="/race")
        assert ar_text == dex_text and "identical output" in summary
        assert "AR (through the same 4 stages, one device each)" in summary
        model, tokenizer = load_model(str(tiny_dir), device="cpu")
        ids = encode_prompt(tokenizer, "hello world", chat=False)
        assert dex_text == tokenizer.decode(ar_generate(model, ids, 12).tokens, skip_special_tokens=True)
    finally:
        for p in nodes:
            p.terminate()
        codes = _end(nodes, 60)
    assert all(code is not None for code in codes)


@pytest.mark.slow  # one torchrun launch of two ranks serving HTTP (about 10 s)
def test_dex_serve_http_under_torchrun_answers_from_rank_0_with_ars_text(tiny_dir, tmp_path):
    from openai import OpenAI

    port, torchrun = free_port(), shutil.which("torchrun", path=os.path.dirname(sys.executable))
    args = [torchrun, "--standalone", "--nproc-per-node", "2", "-m", "dex_core.serving", "--http"]
    args += [f"127.0.0.1:{port}", "--model", str(tiny_dir), "--device", "cpu", "--max-new-tokens", "16"]
    log = open(tmp_path / "launch.out", "w")
    launch = subprocess.Popen(args, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and not answers(f"{url}/health"):
            assert launch.poll() is None, (tmp_path / "launch.out").read_text()[-3000:]
            time.sleep(0.5)
        client = OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60)
        chunks = list(
            client.completions.create(
                model=str(tiny_dir),
                prompt="hello world",
                max_tokens=12,
                temperature=0,
                stream=True,
                stream_options={"include_usage": True},
            )
        )
        # three at once share rank 0's rounds (--max-batch: 8 on CPU), rank 1 told who joins and leaves each step
        prompts = ["the prime number", "hello", "a b c d e f"]
        with ThreadPoolExecutor(3) as pool:
            answered = list(pool.map(lambda p: complete(client, str(tiny_dir), p), prompts))
        shared = scrape(url)[("dex:rounds_shared", ())]
        ranks = psutil.Process(launch.pid).children(recursive=True)
    finally:
        launch.terminate()
        code = _end([launch], 60)
    assert code[0] is not None and not [p for p in ranks if p.is_running() and p.status() != "zombie"]
    model, tokenizer = load_model(str(tiny_dir), device="cpu")
    ar = ar_generate(model, tokenizer("hello world")["input_ids"], 12).tokens
    assert "".join(c.choices[0].text for c in chunks[:-2]) == tokenizer.decode(ar, skip_special_tokens=True)
    assert len(chunks) == 12 + 2 and chunks[-1].usage.model_extra["dex"]["explorers"] == 2
    for prompt, answer in zip(prompts, answered):
        alone = ar_generate(model, tokenizer(prompt)["input_ids"], 10 + len(prompt) % 7).tokens
        assert answer.choices[0].text == tokenizer.decode(alone, skip_special_tokens=True), prompt
    # fewer rounds ran than the four requests' rounds added up: some ran together
    rounds = [chunks[-1].usage.model_extra["dex"]["rounds"]] + [
        a.usage.model_extra["dex"]["rounds"] for a in answered
    ]
    assert 0 < shared < sum(rounds)


def complete(client, model: str, prompt: str):
    """A whole greedy completion of ``prompt``, 10 to 16 new tokens as its length says."""
    return client.completions.create(
        model=model, prompt=prompt, max_tokens=10 + len(prompt) % 7, temperature=0
    )
