"""Tiny random float64 models of each supported family, built offline from configs."""

import os
import shutil
import socket

import pytest

from dex_core.models import tiny_model, tiny_tokenizer  # noqa: F401  (tests import them from here)


@pytest.fixture(scope="session")
def llama():
    return tiny_model("llama")


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    """A saved tiny Llama + tokenizer directory, loadable with ``--model DIR``."""
    path = tmp_path_factory.mktemp("tiny-llama")
    tiny_model("llama").save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    return path


CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
BROWSER_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                "--disable-sync", "--no-first-run", "--disable-quic"]
needs_chromium = pytest.mark.skipif(not os.path.exists(CHROMIUM),
                                    reason="Debian chromium is not installed (.ci/run installs it)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_app(settings, **launch):
    """Build the app for ``settings`` and serve it on a free local port; returns (demo, url)."""
    from app.main import build_demo

    demo = build_demo(settings)
    port = free_port()
    demo.launch(prevent_thread_lock=True, server_name="127.0.0.1", server_port=port, show_error=True, **launch)
    return demo, f"http://127.0.0.1:{port}/"
