"""Uploads counted from their first byte, per-visitor shares, traces read in a bounded worker, a killed
server's files swept, and malformed calls answered in one line (``app.host.uploads``, ``app.host.gate``,
``app.host.trace_worker``, ``app.host.files``). Raw HTTP where a hostile client would not behave like
``httpx``: bodies cut off, shorter than they say, or from addresses a trusted local proxy names (uvicorn
trusts ``X-Forwarded-For`` from 127.0.0.1)."""

import json
import os
import re
import select
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from helpers import tuned, uploads_in

from dex_core import TRACE_VERSION, DexError
from dex_core.trace.events import EndEvent, StartEvent

BOUNDARY = "dexboundary"
PART = (
    f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="files"; filename="t.json"\r\n'
    "Content-Type: application/json\r\n\r\n"
).encode()
END = f"\r\n--{BOUNDARY}--\r\n".encode()

ROOT = Path(__file__).resolve().parents[2]


def raw_upload(url: str, body: bytes, declared: int | None = None, who: str | None = None) -> bytes:
    """POST ``body`` to the upload route over a bare socket, saying it is ``declared`` bytes long (the body's own
    length by default; more, and the socket closes after the body); returns the status line (b"" if none). A reply
    that comes while the body is still being sent (a refusal) ends the sending."""
    host, port = url.split("//")[1].rstrip("/").split(":")
    head = (
        f"POST /gradio_api/upload HTTP/1.1\r\nHost: {host}\r\n"
        f"Content-Type: multipart/form-data; boundary={BOUNDARY}\r\n"
        f"Content-Length: {len(body) if declared is None else declared}\r\n"
        + (f"X-Forwarded-For: {who}\r\n" if who else "")
        + "Connection: close\r\n\r\n"
    )
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(head.encode())
        try:
            for start in range(0, len(body), 2**20):
                if select.select([s], [], [], 0.01 if start == 0 else 0)[0]:
                    break  # answered before the body was read
                s.sendall(body[start : start + 2**20])
            if declared is not None and declared > len(body):
                s.shutdown(socket.SHUT_WR)  # the client goes before its body ends
            reply = s.recv(4096)
        except (ConnectionResetError, BrokenPipeError, TimeoutError):
            reply = b""
    return reply.split(b"\r\n")[0]


def drained(uploads, seconds: float = 10) -> bool:
    """Wait until no upload is counted (the sweep deletes each ``file_ttl`` after it came)."""
    deadline = time.monotonic() + seconds
    while uploads.used() and time.monotonic() < deadline:
        time.sleep(0.25)
    return uploads.used() == 0


def hostile_trace(path: Path, megabytes: float) -> Path:
    """A trace whose events are all ``{}`` (Python builds 64 bytes for each 3 of JSON)."""
    head = json.dumps({"format": "dex-trace", "version": TRACE_VERSION})[:-1] + ', "events": ['
    path.write_text(head + ",".join(["{}"] * int(megabytes * 2**20 / 3)) + "]}")
    return path


def test_cut_off_and_short_bodies_leave_no_file_and_the_budget_unchanged(app_server):
    uploads, url, temp = app_server.demo.runtime.uploads, app_server.url, app_server.temp
    with tuned(app_server.demo.runtime.settings, file_ttl=2):
        assert drained(uploads)
        data = os.urandom(3 * 2**20)
        assert (
            raw_upload(url, PART + data) == b"HTTP/1.1 400 Bad Request"
        )  # no closing boundary: Gradio said 200
        assert (
            raw_upload(url, PART + data, declared=len(PART) + len(data) + 10_000) == b""
        )  # gone before its end
        time.sleep(0.3)
        assert uploads_in(temp) == [] and uploads.used() == 0
        assert raw_upload(url, PART + data + END) == b"HTTP/1.1 200 OK" and len(uploads_in(temp)) == 1
        assert uploads.used() == len(data)
        assert drained(uploads) and uploads_in(temp) == []


def test_three_big_uploads_from_one_visitor_leave_over_half_the_budget_to_another(app_server):
    uploads, url = app_server.demo.runtime.uploads, app_server.url
    big = PART + os.urandom(63 * 2**20) + END
    before = set(uploads_in(app_server.temp))  # other tests' files: their own clocks
    with tuned(app_server.demo.runtime.settings, upload_mb=256, visitor_upload_mb=96, file_ttl=2):
        assert drained(uploads)
        assert [raw_upload(url, big, who="203.0.113.5") for _ in range(3)] == [
            b"HTTP/1.1 200 OK",
            b"HTTP/1.1 413 Request Entity Too Large",
            b"HTTP/1.1 413 Request Entity Too Large",
        ]
        assert uploads.used("203.0.113.5") <= 128 * 2**20 < 256 * 2**20 - uploads.used()
        refusal = uploads.refusal("203.0.113.5", len(big))
        assert "each visitor may hold 96 MB (DEX_VISITOR_UPLOAD_MB)" in refusal and re.search(
            r"goes in \d+ s", refusal
        )
        assert raw_upload(url, big, who="198.51.100.7") == b"HTTP/1.1 200 OK"
        said_large = raw_upload(url, b"", declared=66 * 2**20, who="198.51.100.8")
        assert said_large == b"HTTP/1.1 413 Request Entity Too Large"  # refused by its Content-Length, unread
        assert drained(uploads) and not set(uploads_in(app_server.temp)) - before


def test_uploads_are_bounded_in_total_and_one_without_a_size_is_refused(app_server):
    demo, url = app_server.demo, app_server.url

    def upload(body, name="up.bin"):
        return httpx.post(f"{url}gradio_api/upload", files={"files": (name, body)})

    with tuned(demo.runtime.settings, upload_mb=1, file_ttl=2):
        assert drained(demo.runtime.uploads)
        first = upload(os.urandom(600_000))
        assert first.status_code == 200 and Path(first.json()[0]).is_file()
        refused = upload(os.urandom(600_000), "more.bin")
        assert refused.status_code == 413 and "DEX_UPLOAD_MB" in refused.text
        deadline = time.monotonic() + 6
        while Path(first.json()[0]).exists() and time.monotonic() < deadline:
            time.sleep(0.25)
        assert not Path(first.json()[0]).exists()
        assert upload(os.urandom(600_000), "later.bin").status_code == 200
        chunked = httpx.post(
            f"{url}gradio_api/upload",
            content=iter([b"x" * 10]),
            headers={"content-type": f"multipart/form-data; boundary={BOUNDARY}"},
        )
        assert chunked.status_code == 411


def test_a_killed_servers_folder_is_swept_at_the_next_start_and_a_live_ones_kept(
    tmp_path, tiny_dir, monkeypatch
):
    from app.host.files import Files
    from app.host.settings import AppSettings

    killed = """
import os, signal, sys
from app.host.files import Files
from app.host.settings import AppSettings
root = Files(AppSettings(model=sys.argv[1])).folder()
(root / "uploads" / "x").mkdir(parents=True)
(root / "uploads" / "x" / "left.json").write_text("{}")
print(root, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""
    env = dict(os.environ, GRADIO_TEMP_DIR=str(tmp_path))
    root = Path(
        subprocess.run(
            [sys.executable, "-c", killed, str(tiny_dir)],
            env=env,
            capture_output=True,
            text=True,
            cwd=Path(__file__).resolve().parents[2],
        ).stdout.strip()
    )
    assert (root / "uploads" / "x" / "left.json").is_file()
    monkeypatch.setenv(
        "GRADIO_TEMP_DIR", str(tmp_path)
    )  # set back after the test: the shared app reads it too
    live = Files(AppSettings(model=str(tiny_dir)))
    kept = live.folder()  # a live server's folder (its lock held by this process)
    time.sleep(0.05)
    restarted = Files(AppSettings(model=str(tiny_dir)))
    restarted.folder()
    assert not root.exists() and kept.is_dir()
    restarted.remove()
    live.remove()


def test_a_trace_of_empty_objects_is_refused_by_the_workers_memory_bound(tmp_path):
    from app.host.trace_worker import MEMORY_FACTOR, read_trace

    hostile = hostile_trace(tmp_path / "empty-objects.json", 8)
    with pytest.raises(DexError, match=rf"more than \d+ MB of memory, {MEMORY_FACTOR}x its size"):
        read_trace(hostile)
    small = hostile_trace(tmp_path / "few.json", 0.001)  # within the bound: refused for what it is
    with pytest.raises(DexError, match=r"events\[0\] is missing event"):
        read_trace(small)


def test_the_trace_workers_helper_reads_a_trace_in_under_100_mb_without_torch():
    """The helper imports only the trace package of ``dex_core`` (the face is lazy): no torch mapped into it, and
    a small resident set (it held ~248 MB when importing ``dex_core`` loaded torch and transformers)."""
    import psutil

    from app.host import trace_worker

    events, meta = trace_worker.read_trace(ROOT / "assets" / "traces" / "example.json")
    assert isinstance(events[0], StartEvent) and isinstance(events[-1], EndEvent)
    helper = psutil.Process(trace_worker._helper[0].pid)
    libraries = {Path(m.path).name for m in helper.memory_maps() if m.path}
    assert not {name for name in libraries if "torch" in name}, "the helper loaded torch"
    assert any(name.startswith("libpython") or "python" in name for name in libraries)  # the maps are read
    assert helper.memory_info().rss < 100 * 2**20


def test_a_malformed_call_is_answered_in_one_line_and_a_flood_is_rate_limited(app_server, capfd):
    from app.host.gate import FLOOD_CALLS

    url, calls = app_server.url, app_server.demo.runtime.calls
    capfd.readouterr()
    counted = calls.count
    who = {"X-Forwarded-For": "192.0.2.44"}
    event = httpx.post(f"{url}gradio_api/call/generate", json={"data": [1, 2, 3]}, headers=who).json()
    reply = httpx.get(f"{url}gradio_api/call/generate/{event['event_id']}", timeout=30).text
    assert "/generate refused this call: it gave 3 of its 14 inputs" in reply
    log = capfd.readouterr()
    assert "Traceback" not in log.err + log.out
    assert "malformed call to /generate from 192.0.2.44: it gave 3 of its 14 inputs" in log.err
    odd = {"X-Forwarded-For": "192.0.2.46"}
    assert httpx.post(f"{url}gradio_api/call/nosuch", json={"data": []}, headers=odd).status_code == 404
    join = {"data": [], "fn_index": 99999, "session_hash": "x"}
    assert httpx.post(f"{url}gradio_api/queue/join", json=join, headers=odd).status_code == 404
    for given, said in (
        (
            {"path": "/etc/passwd", "meta": {"_type": "gradio.FileData"}},
            "names a file that was not uploaded here",
        ),
        ({"path": "../../etc/passwd"}, "an input has the wrong shape"),
    ):
        event = httpx.post(f"{url}gradio_api/call/load", json={"data": [given]}, headers=odd).json()
        assert said in httpx.get(f"{url}gradio_api/call/load/{event['event_id']}", timeout=30).text
    log = capfd.readouterr()
    assert (
        "Traceback" not in log.err + log.out and log.err.count("malformed call") == 1
    )  # one a client a minute
    for _ in range(FLOOD_CALLS - 1):
        event = httpx.post(f"{url}gradio_api/call/generate", json={"data": [1]}, headers=who).json()
        httpx.get(f"{url}gradio_api/call/generate/{event['event_id']}", timeout=30)
    flooded = httpx.post(f"{url}gradio_api/call/generate", json={"data": [1]}, headers=who)
    assert flooded.status_code == 429 and "too many malformed calls" in flooded.text
    assert calls.count == counted + FLOOD_CALLS + 4
    other = httpx.post(
        f"{url}gradio_api/call/generate", json={"data": [1]}, headers={"X-Forwarded-For": "192.0.2.45"}
    )
    assert other.status_code == 200  # another visitor is not refused
    httpx.get(f"{url}gradio_api/call/generate/{other.json()['event_id']}", timeout=30)
    log = capfd.readouterr()
    assert "Traceback" not in log.err + log.out and log.err.count("malformed call") == 1  # .44's was logged
    assert "from 192.0.2.45" in log.err


def test_an_upload_gradios_form_parser_fails_on_is_refused_in_one_line(app_server, capfd):
    """A plain form field beside an ``upload_id`` (Gradio's parser reads the name of a file it has not got; found
    by tests/serving/test_fuzz.py) is answered 400, not 500 with a traceback."""
    capfd.readouterr()
    body = f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="files"\r\n\r\nabc'.encode() + END
    kind = {"Content-Type": f"multipart/form-data; boundary={BOUNDARY}"}
    reply = httpx.post(f"{app_server.url}gradio_api/upload?upload_id=x", content=body, headers=kind)
    assert reply.status_code == 400 and "send each file as a file part" in reply.text
    log = capfd.readouterr()
    assert "Traceback" not in log.err + log.out
