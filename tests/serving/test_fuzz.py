"""Schemathesis against the declared schemas of both HTTP servers, over HTTP on 127.0.0.1: ``dex serve --http``'s
API (``make_app`` on the tiny Llama, as its ``/openapi.json`` publishes it) and the app's own routes (``/openai/*``
as ``/openai/openapi.json`` publishes them, Gradio's upload route as ``/gradio_api/openapi.json`` does, and Gradio's
file route, which nothing publishes, as ``FILE_ROUTE`` declares it here).

Bounds: ``EXAMPLES`` generated requests a server, derandomized (the same cases every run, no example database),
no deadline; both servers allow ``MOST_TOKENS`` new tokens a request, so a completion that runs is a round or two
of the tiny model. Half the cases are positive, half negative (schemathesis' two modes); half the positive
completions name the served model, so that they run rather than get 404. Every answer passes ``CHECKS``: not a
5xx, a declared status, content type, headers and body (each event of a stream too), and a body its schema
refuses is refused with a 4xx. ``positive_data_acceptance`` is left out: a body the schema allows may still be
refused for what a schema cannot say (a prompt of only whitespace, a prompt whose tokens pass the model's context
window). After the run the server's log holds no traceback."""

import collections

import httpx
import pytest
import requests
import schemathesis
import torch
from helpers import SERVED, serving, tuned, uploads_in
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode, checks

from app.host import api_routes
from dex_core import DexDecoder
from dex_core.testing import tiny_tokenizer

EXAMPLES = 520  # generated requests a server; the acceptance is 500
MOST_TOKENS = 1  # new tokens a fuzzed completion may ask for
CHECKS = [
    checks.not_a_server_error,
    checks.status_code_conformance,
    checks.content_type_conformance,
    checks.response_headers_conformance,
    checks.response_schema_conformance,
    checks.negative_data_rejection,
]
# a refusal is any 4xx: the app's upload route answers a part header it cannot parse with 413 (Gradio's message
# for it names a size), which schemathesis' default list for this check leaves out
CONFIG = schemathesis.Config.from_dict(
    {"checks": {"negative_data_rejection": {"expected-statuses": ["4XX"]}}}
)
_REFUSED = {"text/plain": {"schema": {"type": "string"}}, "application/json": {"schema": {"type": "object"}}}
FILE_ROUTE = {  # Gradio's file route, which /gradio_api/openapi.json leaves out, as the gate and Gradio answer it
    "/gradio_api/file={path}": {
        "get": {
            "operationId": "file",
            "parameters": [
                {"name": "path", "in": "path", "required": True, "schema": {"type": "string", "minLength": 1}}
            ],
            "responses": {
                "200": {"description": "the file", "content": {"*/*": {"schema": {}}}},
                "403": {
                    "description": "not a file the app serves (the gate: text; Gradio: JSON)",
                    "content": _REFUSED,
                },
                "404": {
                    "description": "no route: Starlette's path pattern stops at a newline",
                    "content": _REFUSED,
                },
            },
        }
    }
}


def fuzz(document: dict, url: str, served: str) -> collections.Counter:
    """``EXAMPLES`` requests generated from the OpenAPI ``document``, sent to the server at ``url``, each answer
    checked (``CHECKS``); returns the statuses answered, counted. ``served``: the model the server serves."""
    schema = schemathesis.openapi.from_dict(document, config=CONFIG)
    answered, session = collections.Counter(), requests.Session()

    def naming(pair):
        case, serve = pair
        if serve and isinstance(case.body, dict) and "model" in case.body:
            case.body["model"] = served
        return case

    positive = st.tuples(schema.as_strategy(GenerationMode.POSITIVE), st.booleans()).map(naming)
    negative = schema.as_strategy(GenerationMode.NEGATIVE)
    # half of each mode (one_of would weigh each negative operation as much as all the positive cases)
    cases = st.booleans().flatmap(lambda yes: positive if yes else negative)
    patient = [HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large]

    @settings(
        max_examples=EXAMPLES, derandomize=True, database=None, deadline=None, suppress_health_check=patient
    )
    @given(cases)
    def one(case):
        response = case.call(base_url=url, session=session, timeout=60)
        answered[response.status_code] += 1
        case.validate_response(response, checks=CHECKS)

    with session:
        one()
    return answered


def published(url: str) -> dict:
    return httpx.get(url, timeout=30).raise_for_status().json()


def assert_clean(answered: collections.Counter, capfd, caplog) -> None:
    """At least 500 requests answered, none with a 5xx, some completions run, and no traceback in the log."""
    log = capfd.readouterr()
    assert sum(answered.values()) >= 500 and answered[200] > 0, answered
    assert not [code for code in answered if code >= 500], answered
    assert "Traceback" not in log.err + log.out + caplog.text


@pytest.fixture
def one_thread():
    """Torch on one thread while a test fuzzes, as under pytest-xdist (``conftest.py``): each fuzzed run is a
    round or two of a tiny model, where a second thread only waits on the first."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_the_api_server_answers_every_fuzzed_request_as_it_declares(llama, one_thread, capfd, caplog):
    tokenizer = tiny_tokenizer()
    decoder = DexDecoder(llama, explorers=2, tokenizer=tokenizer)
    with serving(decoder, tokenizer, most_tokens=MOST_TOKENS) as url:
        capfd.readouterr()
        answered = fuzz(published(f"{url}/openapi.json"), url, SERVED)
    assert_clean(answered, capfd, caplog)


@pytest.fixture
def small_api(app_server, monkeypatch):
    """The shared app with its ``/openai`` API built afresh for one test, at most ``MOST_TOKENS`` new tokens a
    request (the API the session had comes back after it)."""
    mount = next(r for r in app_server.demo.server_app.routes if getattr(r, "path", "") == api_routes.PREFIX)
    monkeypatch.setattr(api_routes, "MOST_TOKENS", MOST_TOKENS)
    monkeypatch.setattr(mount.app, "app", None)  # built on the next request, with the bound above
    return app_server


def app_document(url: str) -> dict:
    """The app's routes under test, as one OpenAPI document: ``/openai``'s own (its paths under the prefix),
    Gradio's upload route and ``FILE_ROUTE``."""
    openai = published(f"{url}{api_routes.PREFIX}/openapi.json")
    upload = published(f"{url}/gradio_api/openapi.json")["paths"]["/gradio_api/upload"]
    paths = {api_routes.PREFIX + path: item for path, item in openai["paths"].items()}
    paths.update({"/gradio_api/upload": upload, **FILE_ROUTE})
    return {**openai, "servers": [{"url": "/"}], "paths": paths}  # the prefix is in the paths now


def test_the_apps_routes_answer_every_fuzzed_request_as_they_declare(small_api, one_thread, capfd, caplog):
    url, runtime = small_api.url.rstrip("/"), small_api.demo.runtime
    capfd.readouterr()
    answered = fuzz(app_document(url), url, runtime.settings.model)
    published(f"{url}{api_routes.PREFIX}/health")  # answered once the server logged all the fuzz made it log
    with tuned(runtime.settings, file_ttl=0):  # every upload the fuzz stored goes now
        runtime.uploads.expire()
    assert not uploads_in(small_api.temp)  # and the refused ones left nothing
    assert_clean(answered, capfd, caplog)
