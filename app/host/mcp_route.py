"""The app as an MCP server (``AppSettings.mcp_server``, ``DEX_MCP_SERVER=1``; off by default): what the host adds to
Gradio's. Gradio serves MCP's streamable HTTP transport at ``/gradio_api/mcp/`` and runs a tool call by calling its
own queue back over loopback with the MCP request's headers (``gradio.mcp``). Left alone, every MCP caller would
reach the gate as 127.0.0.1, one visitor, and a caller's own ``X-Forwarded-For`` would ride along to a server that
trusts 127.0.0.1 (uvicorn's default), so any caller could claim any address.

``Callers`` vouches for the caller instead. The gate takes an MCP request's client address as uvicorn resolved it
(its peer, or the address a trusted proxy names: docs/HOSTING.md, Visitors), removes every ``X-Forwarded-For`` and
``CALLER`` header the request brought and adds its own, ``CALLER: KEY ADDRESS``, KEY a random secret of this server
process. Gradio's loopback call carries it back; the gate takes ADDRESS as that call's client and removes the header,
so the queue, ``Calls`` and the handler's ``gr.Request`` see the MCP caller. A ``CALLER`` header without the key, or
from a peer that is not this machine, is removed and changes nothing: no client can name an address.

The tools are the page's (``SessionBlocks.tools``, ``keep_tools``): Gradio would offer every named endpoint, whose
outputs are the page's HTML and figures. Gradio's older SSE transport (``/gradio_api/mcp/sse``, ``/messages/``) and
the streamable transport's GET stream, which a stateless server never sends on, are refused: each would hold a
connection open for as long as its client liked. A body nested deeper than ``DEPTH`` is refused before the ``mcp``
package parses it (its parser's RecursionError is a 500 and a traceback in the log); the gate bounds its size as any
other body of Gradio's.
"""

from __future__ import annotations

import hmac
import ipaddress
import re
import secrets
from array import array
from itertools import accumulate

from .uploads import visitor

ROUTE = re.compile(r"/gradio_api/mcp(?:/|$)")
OLD_TRANSPORT = re.compile(r"/gradio_api/mcp/(?:sse|messages)(?:/|$)")
CALLER = b"x-dex-mcp-caller"
FORWARDED = b"x-forwarded-for"
DEPTH = 32  # JSON nesting an MCP request may have (a tool call's arguments here are flat: about 5)
STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')
NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
STEPS = bytes.maketrans(b"[]{}", bytes([1, 255, 1, 255]))  # 255: -1 as a signed byte


def _loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def refusal(scope) -> tuple[int, str] | None:
    """(HTTP status, text) for a request to the MCP route that the app does not serve; None for the others."""
    route, method = scope["path"], scope["method"]
    if not ROUTE.match(route):
        return None
    if OLD_TRANSPORT.match(route):
        return 404, "This server speaks MCP's streamable HTTP transport only: POST to /gradio_api/mcp/."
    accept = dict(scope.get("headers") or []).get(b"accept", b"")
    if method == "GET" and b"text/event-stream" in accept:
        return (
            405,
            "This MCP server is stateless and sends nothing unasked: POST each request to /gradio_api/mcp/.",
        )
    return None


def too_deep(body: bytes) -> bool:
    """Whether the JSON ``body`` nests deeper than ``DEPTH``: strings out, each bracket a step of +1 or -1, the
    deepest running sum (in C: about a quarter of a second for 4 MiB, which the gate spends in a worker thread)."""
    steps = STRING.sub(b"", body).translate(None, NOT_BRACKETS).translate(STEPS)
    return max(accumulate(array("b", steps)), default=0) > DEPTH


class Callers:
    """Who an MCP tool call is for: ``vouch`` on the MCP request, ``caller`` on the call Gradio makes back."""

    def __init__(self):
        self._key = secrets.token_hex(16)

    def vouch(self, scope) -> dict:
        """The MCP request's scope with its client's address vouched for, and nothing else naming an address."""
        headers = [(k, v) for k, v in scope.get("headers") or [] if k not in (FORWARDED, CALLER)]
        headers.append((CALLER, f"{self._key} {visitor(scope)}".encode("latin-1")))
        return {**scope, "headers": headers}

    def caller(self, scope) -> dict:
        """The scope with the client that this server vouched for (a tool call made back over loopback); any
        ``CALLER`` header removed, honoured only with the key and from this machine."""
        headers = scope.get("headers") or []
        sent = [v for k, v in headers if k == CALLER]
        if not sent:
            return scope
        scope = {**scope, "headers": [(k, v) for k, v in headers if k != CALLER]}
        key, _, address = sent[-1].partition(b" ")
        if len(sent) == 1 and hmac.compare_digest(key, self._key.encode()) and _loopback(visitor(scope)):
            scope["client"] = (address.decode("latin-1"), 0)
        return scope


def keep_tools(blocks) -> None:
    """Gradio's MCP server (once the app launched with it) offers only the tools the page registered
    (``blocks.tools``: their API names), not the page's own endpoints."""
    server = getattr(blocks, "mcp_server_obj", None)
    if server is not None:
        wanted = {f"/{name}" for name in getattr(blocks, "tools", ())}
        server.tool_to_endpoint = {t: e for t, e in server.tool_to_endpoint.items() if e in wanted}
