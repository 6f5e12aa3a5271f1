"""What a visitor's session holds on the server: memory freed when the tab closes, one budget for all
sessions' traces, files served only while their session lasts, uploads bounded (``app.host.sessions``,
``app.host.files``, ``app.host.server``). The app runs for real; sessions are gradio_client clients, whose
heartbeat Gradio watches as it watches a browser tab's."""

import json
import os
import re
import signal
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import httpx
import pytest
from helpers import answers, files_in, free_port, tuned, uploads_in

from app.host.files import LOCK
from dex_core import DexDecoder
from dex_core.testing import tiny_model, tiny_tokenizer
from dex_core.trace.events import parse_events
from dex_core.trace.files import read_records, records, save_trace

HEARTBEAT = "1"  # seconds between Gradio's heartbeats: a closed client is noticed within about one


def make_trace(path: Path, megabytes: float, tokens: int = 40) -> Path:
    """A K=8 unpruned trace of a tiny 8-layer model of ``megabytes`` within a factor of 1.25 (a random model's
    lattice grows unevenly with its length, so the length is found in a few runs)."""
    decoder = DexDecoder(
        tiny_model("llama", layers=8, max_position_embeddings=4096),
        explorers=8,
        tokenizer=tiny_tokenizer(),
        trace_top=5,
        prune=None,
    )
    for _ in range(4):
        save_trace(path, decoder.generate([1, 2, 3, 4], tokens, node_text=True).trace, {"model": "tiny"})
        ratio = megabytes * 2**20 / path.stat().st_size
        if 1 / 1.25 < ratio < 1.25:
            return path
        tokens = max(10, min(4000, int(tokens * ratio)))
    raise AssertionError(f"no trace of about {megabytes} MB in four runs (the last: {1 / ratio:.2f} of it)")


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    return make_trace(tmp_path_factory.mktemp("traces") / "small.json", 0.7)


def visit(url: str, trace: Path, who: str | None = None):
    """A session that loads ``trace`` in the Debugger (and draws it, as the page does), from the client address
    ``who`` names (through the trusted local proxy's header) when given; returns the client."""
    from gradio_client import Client, handle_file

    headers = {"X-Forwarded-For": who} if who else None
    client = Client(url, verbose=False, download_files=False, headers=headers)
    control, status, box = client.predict(handle_file(str(trace)), api_name="/load")
    assert box is None  # the upload box is emptied, ready for another file
    assert "data-state='finished'" in status, status
    client.predict(control["value"] if isinstance(control, dict) else control, "ok", api_name="/after_load")
    return client


def until(check, seconds: float = 10.0):
    """Poll ``check`` until it returns something true (returned) or ``seconds`` pass (its last value)."""
    end = time.monotonic() + seconds
    while not (result := check()) and time.monotonic() < end:
        time.sleep(0.25)
    return result


def test_a_closed_tab_frees_its_session_and_large_outputs_are_not_kept(app_server, small):
    from app.host.sessions import LARGE_OUTPUT, REPLAYS, traces_in

    demo, url = app_server.demo, app_server.url
    client = visit(url, small)
    session, holder = client.session_hash, demo.state_holder
    held = [t for v in holder.session_data[session].state_data.values() for t in traces_in(v)]
    assert len(held) == 1 and demo.runtime.sessions.usage()[session] > 0

    def outputs():
        return [c.get("props", {}).get("value") for c in holder.session_data[session].config_values.values()]

    assert until(lambda: all(len(json.dumps(v, default=str)) < 2 * LARGE_OUTPUT for v in outputs()), 5)
    client.close()
    assert until(lambda: session not in holder.session_data, 10)
    assert session not in demo.runtime.sessions.usage()
    assert until(lambda: held[0] not in REPLAYS, 5)


def test_eight_sessions_stay_within_the_trace_budget_and_the_oldest_are_told(app_server, small):
    from app.host.sessions import COMPACT_FACTOR

    demo, url = app_server.demo, app_server.url
    sessions, each = demo.runtime.sessions, int(COMPACT_FACTOR * small.stat().st_size)
    megabytes = -(-3 * each // 2**20)  # room for 3 of the 8 traces, or a few more when rounded up
    fits = megabytes * 2**20 // each
    assert 3 <= fits < 8
    clients = []
    with tuned(demo.runtime.settings, trace_memory_mb=megabytes):
        for _ in range(8):
            clients.append(visit(url, small))
            assert sum(sessions.usage().values()) <= megabytes * 2**20
        usage = sessions.usage()
        assert [c for c in clients if usage.get(c.session_hash, 0) > 0] == clients[
            -fits:
        ]  # the oldest went first
        table = clients[0].predict(1, api_name="/show")[1]
    assert "dropped to free memory" in table and f"{megabytes} MB of traces" in table
    shown = clients[-1].predict(1, api_name="/show")[1]
    assert "dbg-empty" not in shown and "dropped" not in shown
    for client in clients:
        client.close()


def test_one_visitors_sessions_keep_within_its_slice_and_drop_their_own_trace_not_anothers(app_server, small):
    from app.host.sessions import COMPACT_FACTOR

    demo, url = app_server.demo, app_server.url
    sessions, each = demo.runtime.sessions, int(COMPACT_FACTOR * small.stat().st_size)
    megabytes = -(-2 * each // 2**20)  # one visitor's slice: room for 2 traces
    assert megabytes * 2**20 // each == 2
    with tuned(demo.runtime.settings, visitor_trace_mb=megabytes, trace_memory_mb=1024):
        other = visit(url, small, who="198.51.100.20")
        mine = [visit(url, small, who="203.0.113.20") for _ in range(3)]
        usage = sessions.usage()
        assert [usage.get(c.session_hash, 0) > 0 for c in (other, *mine)] == [True, False, True, True]
        table = mine[0].predict(1, api_name="/show")[1]
    assert f"{megabytes} MB of traces for each visitor (DEX_VISITOR_TRACE_MB)" in table
    for client in (other, *mine):
        client.close()


def test_the_bundled_example_that_sessions_share_is_nobodys_to_drop(app_server):
    from gradio_client import Client

    demo, url = app_server.demo, app_server.url
    first, second = (Client(url, verbose=False, download_files=False) for _ in range(2))
    first.predict(api_name="/page_load")  # the page's load event: the bundled example in the session's State
    assert demo.runtime.sessions.usage()[first.session_hash] > 0
    second.predict(api_name="/page_load")
    usage = demo.runtime.sessions.usage()
    assert usage[first.session_hash] == usage[second.session_hash] == 0
    first.close(), second.close()


def test_a_trace_larger_than_the_whole_budget_is_refused_with_the_setting_named(app_server, small):
    demo, url = app_server.demo, app_server.url
    from gradio_client import Client, handle_file

    client = Client(url, verbose=False, download_files=False)
    with tuned(demo.runtime.settings, trace_memory_mb=1):
        status = client.predict(handle_file(str(small)), api_name="/load")[1]
    assert "data-state='error'" in status and "DEX_TRACE_MEMORY_MB" in status and "1 MB" in status
    client.close()


def test_a_saved_file_is_served_only_while_its_session_lasts(app_server, small):
    url, temp = app_server.url, app_server.temp
    client = visit(url, small)
    saved = client.predict(api_name="/save")  # the hidden download's file, which the page then downloads
    path = Path(saved["path"])
    assert path.parent.parent.parent == temp and len(path.parent.name) >= 22  # 128 random bits
    got = httpx.get(saved["url"])
    assert (
        got.status_code == 200
        and json.loads(got.content)["events"] == json.loads(small.read_text())["events"]
    )
    guessed = saved["url"].replace(path.parent.name, "A" * len(path.parent.name))
    assert httpx.get(guessed).status_code == 403
    client.close()
    assert until(lambda: httpx.get(saved["url"]).status_code == 403, 10)
    assert not path.parent.exists()


def test_a_download_expires_after_file_ttl(tiny_dir, tmp_path, monkeypatch):
    from app.host.files import Files
    from app.host.settings import AppSettings

    monkeypatch.setenv("GRADIO_TEMP_DIR", str(tmp_path))
    files = Files(AppSettings(model=str(tiny_dir), file_ttl=1))
    path = files.export("a session", "dex-trace.json")
    path.write_text("{}")
    assert files.serves(path.resolve())
    time.sleep(1.2)
    assert not files.serves(path.resolve())
    files.expire()
    assert not path.parent.exists()
    files.remove()
    assert not list(tmp_path.glob("dex-app-*"))


def test_files_in_gradios_temp_folder_the_app_did_not_write_are_not_served(app_server):
    url, temp = app_server.url, app_server.temp
    other = temp / "another-process" / "secret.txt"
    other.parent.mkdir(exist_ok=True)
    other.write_text("not this app's")
    assert httpx.get(f"{url}gradio_api/file={other}").status_code == 403
    assert httpx.get(f"{url}gradio_api/file/{other}").status_code == 403
    stored = httpx.post(f"{url}gradio_api/upload", files={"files": ("up.json", b"{}")}).json()[0]
    assert httpx.get(f"{url}gradio_api/file={stored}").status_code == 403  # uploads are not served back
    assert httpx.get(f"{url}gradio_api/deep_link", params={"session_hash": "x"}).status_code == 404
    nul = httpx.get(f"{url}gradio_api/file={temp}/x%00.png")  # no file has such a name: refused, no traceback
    assert nul.status_code in (403, 404) and "Traceback" not in nul.text


def test_analysis_links_dex_papers_report_which_is_served_and_nothing_beside_it(app_server):
    from app.main import PAPER_REPORT

    url = app_server.url
    config = httpx.get(f"{url}config").json()
    links = [
        c["props"]["value"]
        for c in config["components"]
        if "id='an-paper'" in str(c.get("props", {}).get("value"))
    ]
    href = re.search(r"href='([^']+)'", links[0]).group(1)
    page = httpx.get(url + href)
    assert page.status_code == 200 and "Fig. 3" in page.text and "Appendix B" in page.text
    beside = PAPER_REPORT.parents[2] / "BENCHMARKS.md"  # docs/, outside the report's folder
    assert beside.is_file() and httpx.get(f"{url}gradio_api/file={beside}").status_code in (403, 404)


def test_a_loaded_upload_is_deleted_and_leaves_no_empty_temp_file(app_server, small):
    demo, temp = app_server.demo, app_server.temp
    with tuned(demo.runtime.settings, file_ttl=1):
        client = visit(app_server.url, small)
        assert until(lambda: not uploads_in(temp), 6)
    assert not [p for p in files_in(temp, empty=True) if p.name != LOCK]
    client.close()


def test_the_compare_slot_admits_and_deletes_its_upload_and_a_text_round_logs_no_traceback(
    app_server, small, capfd
):
    demo, url, temp = app_server.demo, app_server.url, app_server.temp
    from gradio_client import Client, handle_file

    client = Client(url, verbose=False, download_files=False)
    capfd.readouterr()
    with tuned(demo.runtime.settings, trace_memory_mb=1):  # run A counts against the budget like any trace
        refused = client.predict(handle_file(str(small)), api_name="/load_pinned")
    assert "data-state='error'" in str(refused) and "DEX_TRACE_MEMORY_MB" in str(refused)
    assert "run A is unchanged" in str(refused)
    with tuned(demo.runtime.settings, file_ttl=1):  # a read upload goes within file_ttl
        pinned = client.predict(handle_file(str(small)), api_name="/load_pinned")
        assert "data-state='finished'" in str(pinned) and "run A pinned: " in str(pinned)
        assert until(lambda: not uploads_in(temp), 6)  # both gone
    assert not [p for p in files_in(temp, empty=True) if p.name != LOCK]
    frame = client.predict("round three", api_name="/show")  # a Debugger round as text: clamped, no traceback
    assert "dbg-empty" in str(frame)
    log = capfd.readouterr()
    assert "Traceback" not in log.err + log.out and "Could not preprocess" not in log.err + log.out
    client.close()


def test_compacted_traces_are_equal_smaller_and_within_the_estimate(small):
    """A loaded trace's typed events, read back as the server reads the worker's lines (``compacted``), hold the
    same records in about a third less memory, within the estimate; ``footprint`` (what the sessions measure a
    trace they did not load by) counts Python's own bytes of an event within 5%."""
    from app.host.sessions import COMPACT_FACTOR, HEAP_FACTOR, footprint
    from app.host.trace_worker import compacted

    size = small.stat().st_size
    lines = [json.dumps(r, separators=(",", ":")) for r in read_records(small)[0]]

    def held(read):
        tracemalloc.start()
        events = read()
        used = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        return events, used

    plain, typed = held(lambda: parse_events(json.loads(line) for line in lines))
    shared, compact = held(lambda: parse_events(compacted(lines)))
    assert json.dumps(records(shared)) == json.dumps(records(plain))
    assert HEAP_FACTOR * compact <= COMPACT_FACTOR * size and compact < 0.7 * typed
    assert 0.95 * typed <= sum(map(footprint, plain)) <= 1.05 * typed


@pytest.mark.slow  # a 20 MB trace made, then loaded six times in a server of its own
@pytest.mark.process
def test_four_closed_sessions_of_a_20_mb_trace_leave_at_most_64_mb_and_sigterm_removes_the_folder(
    tiny_dir, small, tmp_path
):
    import psutil

    # 300 tokens: one generation of 19 MB here (700 tokens took four, 138 s)
    big = make_trace(tmp_path / "big.json", 20, tokens=300)
    temp, port = tmp_path / "gradio-temp", free_port()
    env = dict(
        os.environ,
        GRADIO_TEMP_DIR=str(temp),
        GRADIO_HEARTBEAT_INTERVAL=HEARTBEAT,
        DEX_TRACE_MEMORY_MB="2048",
        DEX_VISITOR_TRACE_MB="2048",
    )
    server = subprocess.Popen(
        [sys.executable, "app/main.py", "--model", str(tiny_dir), "--port", str(port)],
        env=env,
        cwd=Path(__file__).resolve().parents[2],
    )
    url = f"http://127.0.0.1:{port}/"
    try:
        assert until(lambda: answers(url), 120), "the app did not start"

        def rss():
            return psutil.Process(server.pid).memory_info().rss

        warm = visit(url, small)  # imports and first-use caches, and an export: the app's folder exists
        warm.predict(api_name="/save")
        warm.close()
        time.sleep(3)
        fresh = rss()
        visit(
            url, big
        ).close()  # the first big trace's caches (and allocator pages) are the server's, not theirs
        time.sleep(3)
        base = rss()
        clients = [visit(url, big) for _ in range(4)]
        held = rss() - base
        for client in clients:
            client.close()
        # the server frees through the system allocator with two arenas (app/main.py; CPython's own allocator kept
        # 50-150 MB here, glibc's per-thread arenas 42-47 MB; two arenas -1 to +46 MB: docs/HOSTING.md)
        environ = psutil.Process(server.pid).environ()
        assert environ.get("PYTHONMALLOC") == "malloc" and environ.get("MALLOC_ARENA_MAX") == "2"
        # at most 64 MB, a tenth of what the sessions held; up to 60 s, as a loaded CI machine notices closed tabs late
        freed = until(lambda: rss() - base <= min(64 * 2**20, held / 10), 60)
        print(
            f"4 sessions of a {big.stat().st_size / 2**20:.1f} MB trace: +{held / 2**20:.0f} MB held, "
            f"+{(rss() - base) / 2**20:.0f} MB after they closed (+{(rss() - fresh) / 2**20:.0f} MB over the "
            "server before its first big trace)"
        )
        assert freed
        assert list(temp.glob("dex-app-*"))
        server.send_signal(signal.SIGTERM)
        assert server.wait(60) == 128 + signal.SIGTERM
        assert not list(temp.glob("dex-app-*"))
    finally:
        server.kill()
