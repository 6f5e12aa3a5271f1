"""Tiny random float64 models of each supported family, built offline from configs."""

import os
import shutil
import socket

import pytest

from dex_core.testing import tiny_model, tiny_tokenizer  # noqa: F401  (tests import them from here)


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


def in_ci() -> bool:
    """CI sets ``CI`` (``.ci/run`` runs under ``CI=true``): there a missing tool fails the suite."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def require_chromium(path: str = CHROMIUM) -> None:
    """Skip the calling test where Chromium is missing, except in CI, where that fails it."""
    if not os.path.exists(path):
        missing = f"Debian chromium is not installed at {path} (.ci/run installs it)"
        if in_ci():
            pytest.fail(f"{missing}; CI is set, so the browser tests must run, not skip", pytrace=False)
        pytest.skip(missing)


@pytest.fixture(scope="session")
def chromium_present():
    """Session-scoped, so that it runs before a module's browser or app fixture."""
    require_chromium()


needs_chromium = pytest.mark.usefixtures("chromium_present")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_app(settings, **launch):
    """Build the app for ``settings`` and serve it on a free local port; returns (demo, url)."""
    from app.main import build_demo

    demo = build_demo(settings)
    port = free_port()
    demo.launch(
        prevent_thread_lock=True, server_name="127.0.0.1", server_port=port, show_error=True, **launch
    )
    return demo, f"http://127.0.0.1:{port}/"
