"""Sandbox ports: a request for port N of a sandbox is proxied to N on the sandbox's own loopback.

As E2B's sandbox proxy: the port comes from `E2b-Sandbox-Port` (with `E2b-Sandbox-Id`) or from a
`<port>-<sandbox id>.` host name; HTTP bodies stream both ways and WebSocket upgrades are relayed message by
message. The connection is made inside the sandbox by its agent, so it reaches the sandbox's network stack.
A sandbox created with `allowPublicTraffic: false` is reached only with its traffic access token; with
`maskRequestHost` its servers see that Host (`${PORT}` filled in) and the caller's in X-Forwarded-Host; a paused
sandbox created with autoResume is resumed by the request, which then goes on (else E2B's 409); and the
credentials of this endpoint (API key, envd and traffic tokens, `Authorization`) never reach the sandbox.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
from collections.abc import Awaitable, Callable

import h11
from starlette.responses import JSONResponse
from starlette.types import Message, Receive, Scope, Send
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidURI

from .agentlink import AgentError
from .network import TRAFFIC_TOKEN_HEADER
from .registry import Registry, Sandbox

ENVD_PORT = 49983
PORT_HOST = re.compile(r"^(\d+)-([a-z0-9-]+)\.")  # <port>-<sandbox id>.<domain>
# Headers of one hop (RFC 9110 7.6.1) and the routing headers of this endpoint: never passed on.
HOP_HEADERS = {
    b"connection", b"keep-alive", b"proxy-connection", b"te", b"trailer", b"transfer-encoding", b"upgrade",
    b"proxy-authorization", b"proxy-authenticate", b"e2b-sandbox-id", b"e2b-sandbox-port",
}  # fmt: skip
# The endpoint's own credentials: what the sandbox's server would learn from them is the caller's account.
CREDENTIAL_HEADERS = {b"x-api-key", b"authorization", b"x-access-token", TRAFFIC_TOKEN_HEADER.encode()}
NOT_PASSED = HOP_HEADERS | CREDENTIAL_HEADERS
READ_CHUNK = 1 << 16
WS_MAX_MESSAGE = 16 << 20
# Frames of the sandbox's server read ahead of a client that does not take them: past this the relay stops reading
# the sandbox's socket (its sends then wait, as through a byte-copying proxy). With the message the relay holds and
# the one the client's transport holds and one partly read, a WebSocket keeps at most about 4 messages in the server.
WS_READ_AHEAD = 1


def _header(scope: Scope, name: bytes) -> str:
    return next((v.decode("latin-1") for k, v in scope.get("headers", ()) if k.lower() == name), "")


def port_target(scope: Scope) -> tuple[str, int] | None:
    """(sandbox id, port) when the request is for a sandbox port other than envd's."""
    port, sandbox_id = _header(scope, b"e2b-sandbox-port"), _header(scope, b"e2b-sandbox-id")
    if not port and (match := PORT_HOST.match(_header(scope, b"host"))):
        port, sandbox_id = match.group(1), sandbox_id or match.group(2)
    if not port.isdigit() or int(port) == ENVD_PORT:
        return None
    return sandbox_id, int(port)


def proxy_error(status: int, message: str, sandbox_id: str, port: int) -> JSONResponse:
    return JSONResponse({"code": status, "message": message, "sandboxId": sandbox_id, "port": port}, status)


def paused_error(sandbox_id: str) -> JSONResponse:
    """E2B's proxy's answer for traffic to a paused sandbox it does not resume (no autoResume)."""
    body = {"sandboxId": sandbox_id, "message": "The sandbox is paused", "code": 409, "canAutoResume": False}
    return JSONResponse(body, 409)


class PortProxy:
    def __init__(self, registry: Registry) -> None:
        self.registry = registry

    async def __call__(self, scope: Scope, receive: Receive, send: Send, sandbox_id: str, port: int) -> None:
        sandbox = self.registry.get(sandbox_id)
        refusal = None
        if not 0 < port < 65536:
            refusal = proxy_error(400, f"invalid port {port}", sandbox_id, port)
        elif sandbox is None or not sandbox.box.running:
            refusal = proxy_error(502, f"The sandbox {sandbox_id} was not found", sandbox_id, port)
        elif not await self.registry.wake(sandbox):  # as E2B's: the wake comes first, the token is checked after
            refusal = paused_error(sandbox_id)
        elif (denied := sandbox.ingress.refusal(_header(scope, TRAFFIC_TOKEN_HEADER.encode()))) is not None:
            refusal = JSONResponse({"sandboxId": sandbox_id, "message": denied, "code": 403}, 403)
        if refusal is not None or sandbox is None:
            await _refuse(scope, receive, send, refusal)
            return
        try:
            sock = await sandbox.box.connect(port)
        except (AgentError, TimeoutError):
            closed = f"The sandbox {sandbox_id} is running but port {port} is not open"
            await _refuse(scope, receive, send, proxy_error(502, closed, sandbox_id, port))
            return
        running = sandbox

        async def relay(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] == "websocket":
                await _relay_websocket(scope, receive, send, sock, running, port)
            else:
                await _proxy_http(scope, receive, send, sock, running.ingress.request_host(port))

        await sandbox.in_flight.serve(relay, scope, receive, send)  # the sandbox's stop cuts the connection


async def _refuse(scope: Scope, receive: Receive, send: Send, response: JSONResponse | None) -> None:
    if scope["type"] == "websocket":
        await receive()  # websocket.connect
        await send({"type": "websocket.close", "code": 1011, "reason": "port not reachable"})
    elif response is not None:
        await response(scope, receive, send)


def _request_head(scope: Scope, mask_host: str | None = None) -> tuple[h11.Request, bool]:
    """The request as it goes on to the sandbox (with `mask_host` as its Host, the caller's then in
    X-Forwarded-Host), and whether a body follows."""
    original = {k.lower(): v for k, v in scope["headers"]}
    headers = [(k, v) for k, v in scope["headers"] if k.lower() not in NOT_PASSED]
    if mask_host is not None:
        headers = [(k, v) for k, v in headers if k.lower() not in (b"host", b"x-forwarded-host")]
        headers = [(b"host", mask_host.encode()), *headers, (b"x-forwarded-host", original.get(b"host", b""))]
    chunked = b"chunked" in original.get(b"transfer-encoding", b"").lower()
    if chunked:
        headers.append((b"transfer-encoding", b"chunked"))
    headers.append((b"connection", b"close"))
    target = scope.get("raw_path") or scope["path"].encode()
    if scope.get("query_string"):
        target += b"?" + scope["query_string"]
    has_body = chunked or int(original.get(b"content-length", b"0") or 0) > 0
    return h11.Request(method=scope["method"], target=target, headers=headers), has_body


async def _proxy_http(
    scope: Scope, receive: Receive, send: Send, sock: socket.socket, mask_host: str | None = None
) -> None:
    reader, writer = await asyncio.open_connection(sock=sock)
    conn = h11.Connection(h11.CLIENT)
    request, has_body = _request_head(scope, mask_host)
    writer.write(conn.send(request) or b"")

    async def pump_body() -> None:
        message: Message = {"type": "http.request", "more_body": has_body}
        while message["type"] == "http.request" and message.get("more_body"):
            message = await receive()
            if message["type"] == "http.request" and message.get("body"):
                writer.write(conn.send(h11.Data(data=message["body"])) or b"")
                await writer.drain()
        if message["type"] == "http.request":
            writer.write(conn.send(h11.EndOfMessage()) or b"")
            await writer.drain()
            while (await receive())["type"] != "http.disconnect":
                pass
        # A client that goes away (mid-body too) closes the connection to the sandbox's server, which
        # sees it (a code interpreter interrupts the cell) even while it sends nothing or waits for a body.
        client_gone.set()
        writer.transport.abort()

    client_gone = asyncio.Event()
    pumping = asyncio.ensure_future(pump_body())
    started = False
    try:
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                data = await reader.read(READ_CHUNK)
                if not data and not started:
                    raise h11.RemoteProtocolError("the sandbox's server closed the connection without an answer")
                conn.receive_data(data)
                continue
            if isinstance(event, h11.Response):
                headers = [(k, v) for k, v in event.headers if k.lower() not in HOP_HEADERS]
                await send({"type": "http.response.start", "status": event.status_code, "headers": headers})
                started = True
            elif isinstance(event, h11.Data):
                await send({"type": "http.response.body", "body": bytes(event.data), "more_body": True})
            elif isinstance(event, h11.EndOfMessage | h11.ConnectionClosed):
                await send({"type": "http.response.body", "body": b"", "more_body": False})
                return
    except (h11.RemoteProtocolError, ConnectionError) as exc:
        if client_gone.is_set():
            return
        if started:
            raise  # the answer is cut: the client sees the connection end
        await JSONResponse({"code": 502, "message": f"bad answer from the sandbox's server: {exc}"}, 502)(
            scope, receive, send
        )
    finally:
        pumping.cancel()
        with contextlib.suppress(Exception, asyncio.CancelledError):
            await pumping  # a client that left mid-body is not an error of this request
        writer.close()


async def _relay_websocket(
    scope: Scope, receive: Receive, send: Send, sock: socket.socket, sandbox: Sandbox, port: int
) -> None:
    await receive()  # websocket.connect
    path = scope.get("raw_path") or scope["path"].encode()
    query = b"?" + scope["query_string"] if scope.get("query_string") else b""
    headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in scope["headers"] if k.lower() in PASSED_WS]
    # The socket is connected already: the URI's authority is only the Host the sandbox's server sees.
    authority = sandbox.ingress.request_host(port)
    if authority is not None:
        headers.append(
            ("X-Forwarded-Host", next((v.decode("latin-1") for k, v in scope["headers"] if k == b"host"), ""))
        )
    sock.setblocking(True)  # websockets takes a blocking socket and makes it its own
    try:
        upstream = await connect(
            f"ws://{authority or f'127.0.0.1:{port}'}{(path + query).decode('latin-1')}",
            sock=sock,
            additional_headers=headers,
            subprotocols=scope.get("subprotocols") or None,  # type: ignore[arg-type]
            ping_interval=None,
            max_size=WS_MAX_MESSAGE,
            max_queue=WS_READ_AHEAD,
            open_timeout=10,
        )
    except (InvalidHandshake, InvalidURI, OSError, TimeoutError) as exc:
        await send({"type": "websocket.close", "code": 1011, "reason": f"the sandbox refused: {exc}"[:120]})
        return
    await send({"type": "websocket.accept", "subprotocol": upstream.subprotocol})
    async with upstream:
        await _first_to_end(_client_to_sandbox(receive, upstream), _sandbox_to_client(upstream, send))


PASSED_WS = {b"cookie", b"origin", b"user-agent"}


async def _first_to_end(*relays: Awaitable[None]) -> None:
    tasks = [asyncio.ensure_future(r) for r in relays]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _client_to_sandbox(receive: Receive, upstream: ClientConnection) -> None:
    while True:
        message = await receive()
        if message["type"] == "websocket.disconnect":
            await upstream.close(message.get("code", 1000))
            return
        data = message.get("bytes") if message.get("bytes") is not None else message.get("text")
        if data is not None:
            with contextlib.suppress(ConnectionClosed):
                await upstream.send(data)


async def _sandbox_to_client(upstream: ClientConnection, send: Callable[..., Awaitable[None]]) -> None:
    try:
        async for data in upstream:
            key = "bytes" if isinstance(data, bytes) else "text"
            await send({"type": "websocket.send", key: data})
    except ConnectionClosed:
        pass
    code = upstream.close_code or 1000
    with contextlib.suppress(Exception):
        await send({"type": "websocket.close", "code": code if code != 1006 else 1011})
