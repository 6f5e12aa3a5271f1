"""The app as an MCP server (``AppSettings.mcp_server``, ``app.ui.tools``, ``app.host.mcp_route``), through the
official ``mcp`` client: the tools it lists and their schemas, the generating tool's text against Hugging Face
greedy, each caller counted as the visitor it is (never as the loopback address Gradio calls its queue from, nor as
an address it names itself), and the gate's bounds on the MCP route. Two addresses on this machine: 127.0.0.1, whose
``X-Forwarded-For`` uvicorn trusts (a local proxy naming its client), and 127.0.0.2, a client it does not trust."""

import asyncio
import concurrent.futures
import json

import httpx
import pytest

PROMPT = "hello world the prime number"
MCP = "gradio_api/mcp/"
JSON = {"content-type": "application/json", "accept": "application/json, text/event-stream"}


def mcp_calls(url: str, calls: list, source: str = "127.0.0.1", headers: dict | None = None):
    """One MCP session from ``source`` (sending ``headers`` with every request): its tool list, then each
    ``(tool, arguments)`` of ``calls``'s result. Returns (tools, results)."""
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    async def session():
        transport = httpx.AsyncHTTPTransport(local_address=source)
        timeout = httpx.Timeout(30, read=120)
        async with httpx.AsyncClient(transport=transport, headers=headers, timeout=timeout) as http:
            async with streamable_http_client(url + MCP, http_client=http) as (read, write, _):
                async with ClientSession(read, write) as client:
                    await client.initialize()
                    tools = (await client.list_tools()).tools
                    return tools, [await client.call_tool(name, args) for name, args in calls]

    with concurrent.futures.ThreadPoolExecutor(1) as thread:  # a loop of its own: the browser tests' sync
        return thread.submit(asyncio.run, session()).result()  # Playwright runs one in this thread


def test_the_client_lists_the_three_tools_with_typed_described_and_bounded_parameters(app_server):
    tools, _ = mcp_calls(app_server.url, [])
    by_name = {tool.name: tool for tool in tools}
    assert sorted(by_name) == [
        "dex_analyse",
        "dex_generate",
        "dex_race",
    ]  # the page's own endpoints are not tools
    generate = by_name["dex_generate"]
    assert "DEX" in generate.description and "Returns: a JSON object: text" in generate.description
    schema = generate.inputSchema
    assert schema["required"] == ["prompt"]
    params = schema["properties"]
    assert list(params) == [
        "prompt",
        "max_new_tokens",
        "explorers",
        "chat",
        "sample",
        "temperature",
        "top_k",
        "top_p",
        "seed",
    ]
    assert all(p["description"] for p in params.values())
    assert params["prompt"]["type"] == "string" and params["chat"]["type"] == "boolean"
    assert params["max_new_tokens"] == {
        "type": "integer",
        "minimum": 1,
        "maximum": 512,
        "description": "number of tokens to generate (stops earlier at EOS); 1 to 512",
        "default": 128,
    }
    assert (params["explorers"]["minimum"], params["explorers"]["maximum"]) == (1, 8)
    assert params["explorers"]["default"] == 3  # the launch's K, as the page's slider starts
    assert params["temperature"]["type"] == "number" and params["seed"]["maximum"] == 2**64 - 1
    assert list(by_name["dex_race"].inputSchema["properties"]) == [
        "prompt",
        "max_new_tokens",
        "explorers",
        "chat",
    ]
    assert list(by_name["dex_analyse"].inputSchema["properties"]) == ["prompt", "max_new_tokens", "chat"]


def test_the_generating_tool_returns_hf_greedys_text_and_bad_input_in_one_line(app_server, tiny_dir, capfd):
    from transformers import AutoModelForCausalLM

    from dex_core import encode_prompt
    from dex_core.runtime.reference import hf_greedy
    from dex_core.testing import tiny_tokenizer

    capfd.readouterr()
    calls = [
        ("dex_generate", {"prompt": PROMPT, "max_new_tokens": 12, "chat": False}),
        ("dex_generate", {"prompt": "   ", "max_new_tokens": 4}),
        ("dex_generate", {"prompt": PROMPT, "max_new_tokens": 513}),
    ]
    _, (good, empty, too_many) = mcp_calls(app_server.url, calls)
    model, tokenizer = AutoModelForCausalLM.from_pretrained(tiny_dir), tiny_tokenizer()
    greedy = hf_greedy(model, encode_prompt(tokenizer, PROMPT, False), 12)
    answer = json.loads(good.content[0].text)
    assert not good.isError and answer["text"] == tokenizer.decode(greedy, skip_special_tokens=True)
    assert answer["tokens"] == 12 and answer["explorers"] == 3 and answer["stopped"] is None
    assert empty.isError and "the prompt is empty" in empty.content[0].text
    assert too_many.isError and "513 is greater than the maximum of 512" in too_many.content[0].text
    log = capfd.readouterr()
    assert "Traceback" not in log.out + log.err


def test_two_mcp_callers_from_different_addresses_are_two_visitors_and_neither_can_name_another(app_server):
    url, flooder = app_server.url, "127.0.0.2"
    with httpx.Client(transport=httpx.HTTPTransport(local_address=flooder), timeout=10) as direct:
        for _ in range(20):  # malformed calls: the gate refuses this visitor's calls for a minute (Calls)
            event = direct.post(f"{url}gradio_api/call/generate", json={"data": [1]}).json()["event_id"]
            answer = direct.get(f"{url}gradio_api/call/generate/{event}").text  # run by the queue: counted
            assert "event: error" in answer and "refused this call" in answer
    call = [("dex_generate", {"prompt": PROMPT, "max_new_tokens": 4, "chat": False})]
    forged = {"X-Forwarded-For": "203.0.113.5", "X-Dex-Mcp-Caller": "0123 203.0.113.6"}
    _, (refused,) = mcp_calls(url, call, source=flooder, headers=forged)  # naming others changes nothing
    assert refused.isError and "429 Too Many Requests" in refused.content[0].text
    proxied = {"X-Forwarded-For": "198.51.100.8"}  # a trusted local proxy names its client: another visitor
    _, (served,) = mcp_calls(url, call, headers=proxied)
    assert not served.isError and json.loads(served.content[0].text)["tokens"] == 4
    assert app_server.demo.runtime.calls.refusal("127.0.0.1") is None  # the loopback was never the visitor


@pytest.mark.parametrize(
    "method, route, body, headers, status",
    [
        ("POST", MCP, b"[" * (4 * 2**20 + 1), JSON, 413),  # past the gate's bound on a body
        ("POST", MCP, b"[" * 40_000 + b"]" * 40_000, JSON, 400),  # the mcp package's parser would recurse
        ("POST", MCP, b'{"jsonrpc": "2.0", "id": 1, "method": "ping"', JSON, 400),  # JSON-RPC's parse error
        ("GET", MCP, b"", {"accept": "text/event-stream"}, 405),  # a stream a stateless server never uses
        ("GET", "gradio_api/mcp/sse", b"", {}, 404),  # the older SSE transport
    ],
)
def test_the_mcp_route_refuses_what_it_does_not_serve_in_one_line(
    app_server, capfd, method, route, body, headers, status
):
    capfd.readouterr()
    answer = httpx.request(method, app_server.url + route, content=body, headers=headers, timeout=30)
    assert answer.status_code == status and len(answer.text) < 200
    log = capfd.readouterr()
    assert "Traceback" not in log.out + log.err


def test_the_setting_is_off_by_default_and_decides_every_launchs_mcp_server():
    from types import SimpleNamespace

    from app.host.server import launch_options
    from app.host.settings import AppSettings
    from app.host.state import Runtime

    assert not AppSettings().mcp_server and AppSettings.from_env({"DEX_MCP_SERVER": "1"}).mcp_server
    for on in (False, True):  # whatever the caller or GRADIO_MCP_SERVER asks for
        blocks = SimpleNamespace(runtime=Runtime(AppSettings(model="m", mcp_server=on)), page_css="")
        assert launch_options(blocks, {"mcp_server": not on})["mcp_server"] is on


def test_a_caller_header_counts_only_with_this_servers_key_and_from_this_machine():
    from app.host.mcp_route import CALLER, Callers

    callers = Callers()
    request = {
        "client": ("192.0.2.9", 5000),
        "headers": [(b"x-forwarded-for", b"10.0.0.1"), (CALLER, b"k 1.2.3.4")],
    }
    vouched = callers.vouch(request)  # what the request brought that names an address is gone
    assert [name for name, _ in vouched["headers"]] == [CALLER]
    back = callers.caller({"client": ("127.0.0.1", 40000), "headers": vouched["headers"]})
    assert back["client"] == ("192.0.2.9", 0) and back["headers"] == []
    for peer, headers in (
        ("127.0.0.1", [(CALLER, b"wrong-key 192.0.2.9")]),  # without this server's key
        ("203.0.113.1", vouched["headers"]),  # the key, but from another machine
        ("127.0.0.1", vouched["headers"] * 2),  # two of them
    ):
        seen = callers.caller({"client": (peer, 1), "headers": headers})
        assert seen["client"] == (peer, 1) and seen["headers"] == []
