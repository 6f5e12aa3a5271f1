"""What the suite shares, paid once a session: tiny random float64 models built offline from configs, explorer
groups (one per model, K and options), the real default model, and the markers that name the expensive kinds of
test (``process``, ``browser``, ``real_model``, ``slow``) so that a contributor can run a fast subset:

    python -m pytest -m "not slow and not browser" -q

Hypothesis runs the ``ci`` profile under ``CI`` (fewer examples, derandomized: the same cases every run) and the
``dev`` profile elsewhere; ``HYPOTHESIS_PROFILE=thorough`` runs many more examples."""

import os

import golden
import pytest
from helpers import BROWSER_ARGS, CHROMIUM, in_ci, launch_app, require_chromium
from hypothesis import HealthCheck, settings

from dex_core.testing import save_tiny, tiny_model

# the tests' own @settings name no example counts: the profile decides them
_PATIENT = {"deadline": None, "suppress_health_check": [HealthCheck.too_slow]}
settings.register_profile("ci", max_examples=12, derandomize=True, **_PATIENT)
settings.register_profile("dev", max_examples=12, **_PATIENT)
settings.register_profile("thorough", max_examples=200, **_PATIENT)
# fixtures that make a test one of the expensive kinds (the marker follows from the fixture it asks for)
MARK_BY_FIXTURE = {
    "explorer_group": "process",
    "browser": "browser",
    "page": "browser",
    "default_model": "real_model",
}


settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if in_ci() else "dev"))


def pytest_configure(config):
    """Under pytest-xdist (README's ``-n 2``) each worker's torch keeps to one thread: two workers on two cores."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        import torch

        torch.set_num_threads(1)


def pytest_collection_modifyitems(config, items):
    for item in items:
        for fixture, marker in MARK_BY_FIXTURE.items():
            if fixture in getattr(item, "fixturenames", ()):
                item.add_marker(marker)
        if item.get_closest_marker("real_model"):
            item.add_marker("slow")


@pytest.fixture(scope="session")
def llama():
    return tiny_model("llama")


@pytest.fixture(scope="session")
def qwen3():
    """The golden traces' model (``tests/golden.py``, which records them outside pytest too): Qwen 3 with a tied
    head and head_dim 16."""
    return golden.model()


@pytest.fixture(scope="session")
def explorer_group():
    """``explorer_group(model, K, **options)``: a distributed ``DexDecoder`` (K explorer processes on the CPU,
    one thread each), started on first use for that (model, K, options) and reused by every later test that
    asks for the same, then closed at the end of the session. A test that kills, stops or patches its
    explorers starts its own group instead. ``tests/distributed/test_distributed.py`` proves that a reused
    group gives a fresh group's trace."""
    from dex_core import DexDecoder

    groups = {}

    def get(model, K: int, **options):
        key = (id(model), K, tuple(sorted((k, _key(v)) for k, v in options.items())))
        decoder = groups.get(key)
        if decoder is None or not decoder.group.alive:
            decoder = DexDecoder(
                model, explorers=K, backend="distributed", devices=("cpu",) * K, threads=1, **options
            )
            groups[key] = decoder
        return decoder

    yield get
    for decoder in groups.values():
        decoder.close()


def _key(value):
    """An option's part of a group's key: hashable values as they are, objects (a tokenizer) by identity."""
    try:
        hash(value)
    except TypeError:
        return ("object", id(value))
    return value


@pytest.fixture(scope="session")
def default_model():
    """The real default model (SmolLM2-135M-Instruct, float32) and its tokenizer, loaded once a session."""
    from dex_core import load_model

    return load_model("default", device="cpu")


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    """A saved tiny Llama + tokenizer directory, loadable with ``--model DIR``."""
    return save_tiny(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def chromium_present():
    """Session-scoped, so that it runs before a module's browser or app fixture."""
    require_chromium()


@pytest.fixture(scope="session")
def browser(chromium_present):
    """One Chromium a session (Debian's, driven by Playwright: no browser download); each test opens its own
    context through ``page``, so no cookie, storage or download of one test reaches another."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=BROWSER_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser):
    """A fresh browser context and page (1400 × 1000, downloads accepted), closed after the test."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000}, accept_downloads=True)
    yield context.new_page()
    context.close()


@pytest.fixture(scope="session")
def app_server(tiny_dir, tmp_path_factory):
    """The app on the tiny Llama (K = 3 to start), served once a session on a free local port, with Gradio's temp
    folder of its own and one-second heartbeats (a closed client is noticed within about one); the upload and
    queue limits are the host's (``app.main.UPLOAD_LIMIT``, a queue of 64 for the load test); the OpenAI API is
    on (``/openai``), and the MCP server (``/gradio_api/mcp/``). A test that needs another setting changes it for its
    own duration only (``tuned``).
    ``.demo``, ``.url``, ``.temp``."""
    from types import SimpleNamespace

    from app.host.settings import AppSettings
    from app.main import UPLOAD_LIMIT

    temp = tmp_path_factory.mktemp("gradio-temp")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("GRADIO_TEMP_DIR", str(temp))
        env.setenv("GRADIO_HEARTBEAT_INTERVAL", "1")
        settings = AppSettings(
            model=str(tiny_dir), explorers=3, queue_size=64, openai_api=True, mcp_server=True
        )
        demo, url = launch_app(settings, max_file_size=UPLOAD_LIMIT)
        yield SimpleNamespace(demo=demo, url=url, temp=temp.resolve())
        demo.close()
