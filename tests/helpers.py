"""Plain helpers the tests share (no fixtures: those are ``conftest.py``'s): CI and Chromium, the shared app's
settings for one test, the processes and upload files a test leaves, free ports, the app's launch and the API's,
hostile connections, the CLI run in-process, the text a page shows, a long draft-chain trace."""

import contextlib
import html
import importlib.util
import os
import re
import resource
import selectors
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
import uvicorn

from dex_core import DexDecoder
from dex_core.serving.api import make_app
from dex_core.serving.connections import server_config
from dex_core.testing import tiny_model, tiny_tokenizer
from dex_core.trace.events import RoundEvent


def in_ci() -> bool:
    """CI sets ``CI`` (``.ci/run`` runs under ``CI=true``): there a missing tool fails the suite."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


CHROMIUM = os.environ.get("DEX_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
BROWSER_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]


def require_chromium(path: str = CHROMIUM) -> None:
    """Skip the calling test where Chromium is missing, except in CI, where that fails it."""
    if not os.path.exists(path):
        missing = f"Debian chromium is not installed at {path} (.ci/run installs it)"
        if in_ci():
            pytest.fail(f"{missing}; CI is set, so the browser tests must run, not skip", pytrace=False)
        pytest.skip(missing)


needs_chromium = pytest.mark.usefixtures("chromium_present")


@contextlib.contextmanager
def tuned(settings, **values):
    """The shared app's settings changed for one test, and set back after it."""
    before = {name: getattr(settings, name) for name in values}
    for name, value in values.items():
        setattr(settings, name, value)
    try:
        yield settings
    finally:
        for name, value in before.items():
            setattr(settings, name, value)


def live_children() -> set[int]:
    """The ids of this process's live direct children (zombies and those that ended meanwhile left out): the
    session's shared explorer groups, app server helpers and Playwright's driver are among them."""
    import psutil

    alive = set()
    for child in psutil.Process().children():
        with contextlib.suppress(psutil.NoSuchProcess):
            if child.status() != psutil.STATUS_ZOMBIE:
                alive.add(child.pid)
    return alive


def started_since(before: set[int]) -> set[int]:
    """The live processes a test started and left: this process's children that were not in ``before`` (an
    earlier ``live_children()``) and every live descendant of theirs. Descendants of the children in ``before``
    are not counted, since Chromium starts and ends renderer processes of its own at any time."""
    import psutil

    new = live_children() - before
    found = set(new)
    for pid in new:
        with contextlib.suppress(psutil.NoSuchProcess):
            found |= {c.pid for c in psutil.Process(pid).children(recursive=True) if c.status() != "zombie"}
    return found


def files_in(root, empty: bool = False) -> list:
    """The plain files under ``root`` now (only the empty ones if ``empty``). The app's sweep deletes uploads
    and their folders at any moment: what goes while it is listed is simply not counted (``os.walk`` skips a
    folder it can no longer read, where pathlib's glob raises ``FileNotFoundError``)."""
    found = []
    for top, _, names in os.walk(root):
        for path in (Path(top, name) for name in names):
            with contextlib.suppress(FileNotFoundError):
                if path.is_file() and (not empty or path.stat().st_size == 0):
                    found.append(path)
    return found


def uploads_in(temp) -> list:
    """The upload files of every app under the Gradio temp folder ``temp``, as the sweep leaves them now."""
    return [path for app in temp.glob("dex-app-*") for path in files_in(app / "uploads")]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


SERVED = "tiny-llama"  # the model name ``serving``'s API serves


@contextlib.contextmanager
def serving(decoder, tokenizer, **bounds):
    """``dex serve --http``'s API (``make_app``, ``bounds`` its keywords) over ``decoder`` on a free local port, in a
    thread of this process, its connections bounded as ``dex serve --http`` bounds them; yields its base URL."""
    port = free_port()
    app = make_app(decoder, tokenizer, SERVED, **bounds)
    server = uvicorn.Server(server_config(app, "127.0.0.1", port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


def launch_app(settings, **launch):
    """Build the app for ``settings`` and serve it on a free local port; returns (demo, url). A port another
    process (a second pytest-xdist worker) took between the probe and the launch is answered by a fresh one."""
    from app.main import build_demo

    demo = build_demo(settings)
    for attempt in range(3):
        port = free_port()
        try:
            demo.launch(
                prevent_thread_lock=True, server_name="127.0.0.1", server_port=port, show_error=True, **launch
            )
        except OSError:
            if attempt == 2:
                raise
            continue
        return demo, f"http://127.0.0.1:{port}/"


def answers(url: str) -> bool:
    """Whether a GET of ``url`` answers 200 within 2 s (a server that has started)."""
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def half_open(url: str, count: int, start: bytes = b"GET / HTTP/1.1\r\nHost: x\r\n") -> list:
    """``count`` connections to the server at ``url`` that each send ``start`` (by default a request head that
    never ends) and then nothing. Raises this process's open-file limit to fit them (and the server's ends, where
    it runs in this process)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 2 * count + 1024
    if soft != resource.RLIM_INFINITY and soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(wanted, hard), hard))
    host, port = url.removeprefix("http://").split("/")[0].split(":")
    connections = []
    for _ in range(count):
        connection = socket.create_connection((host, int(port)), timeout=5)
        connection.sendall(start)
        connections.append(connection)
    return connections


def closed_within(connections: list, seconds: float) -> int:
    """How many of ``connections`` the server closed within ``seconds`` (each is closed here once it has);
    whatever the server sent on them is read and dropped."""
    deadline, closed = time.monotonic() + seconds, 0
    with selectors.DefaultSelector() as waiting:
        for connection in connections:
            waiting.register(connection, selectors.EVENT_READ)
        while closed < len(connections) and (left := deadline - time.monotonic()) > 0:
            for key, _ in waiting.select(left):
                try:
                    ended = not key.fileobj.recv(65536)
                except OSError:  # reset by the server
                    ended = True
                if ended:
                    waiting.unregister(key.fileobj)
                    key.fileobj.close()
                    closed += 1
    for connection in connections:
        connection.close()
    return closed


def hostile_http():
    """``benchmarks/hostile_http.py`` as a module: its ``KINDS`` of hostile request and ``health_during``."""
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "hostile_http.py"
    spec = importlib.util.spec_from_file_location("hostile_http", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_cli(capsys, *argv):
    """``dex`` in-process: (exit code, stdout, stderr)."""
    from dex_core.cli import main

    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def shown_tokens(page_html: str) -> str:
    spans = re.findall(r'<span class="dex-tok"[^>]*>(.*?)</span>', page_html, flags=re.S)
    return "".join(html.unescape(s) for s in spans)


def long_chain_trace(rounds: int = 3):
    """The first ``rounds`` rounds of a K = 8 run whose draft chains reach 30+ positions ahead of the anchor
    (prompt lookup in a repeated prompt, chains of up to 30 tokens)."""
    decoder = DexDecoder(
        tiny_model("llama", layers=8),
        explorers=8,
        tokenizer=tiny_tokenizer(),
        draft="length=30,rows=32,gate=0",
        prune=32,  # room for chains of 30 rows and a branch or two beside them
    )
    events = []
    for event in decoder.stream([4, 8, 15, 16, 23, 42, 7, 9] * 6, 32):
        events.append(event)
        if sum(isinstance(e, RoundEvent) for e in events) == rounds:
            return events
    return events


def start_gradio(env: dict, log: Path) -> subprocess.Popen:
    """``gradio app/main.py`` (README's command) with ``env``, its output in ``log``: the CLI runs the app in a child,
    both in a session of their own, so that ``os.killpg`` reaches whatever a test leaves."""
    with open(log, "w") as out:
        return subprocess.Popen(
            [str(Path(sys.executable).parent / "gradio"), "app/main.py"],
            env=env,
            cwd=Path(__file__).resolve().parents[1],
            stdout=out,
            stderr=out,
            start_new_session=True,
        )


def scrape(url: str) -> dict:
    """The server's ``/metrics``, parsed by ``prometheus_client``'s own text parser: (name, labels) -> value."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{url}/metrics", timeout=10).text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def interleaved(decoder, requests: list, first: int, cancel: tuple[int, int], join_at: int) -> dict:
    """Stream ``requests`` ((prompt, new tokens, options)) on ``decoder``, an event of each in flight in turn: the first
    ``first`` at once, the others once ``join_at`` turns have passed; request ``cancel[0]``'s stream is closed by its
    consumer once it has ``cancel[1]`` events. Returns each request's events (index -> list)."""
    streams = {i: decoder.stream(p, new, **o) for i, (p, new, o) in enumerate(requests[:first])}
    events = {i: [] for i in range(len(requests))}
    turns = 0
    while streams:
        for i, stream in list(streams.items()):
            event = next(stream, None)
            if event is None:
                del streams[i]
                continue
            events[i].append(event)
            if (i, len(events[i])) == cancel:
                stream.close()
                del streams[i]
        turns += 1
        if turns == join_at:
            streams.update(
                {i: decoder.stream(p, new, **o) for i, (p, new, o) in enumerate(requests) if i >= first}
            )
    return events
