"""One ASGI app for the REST API and envd: routes do not collide, envd is routed by E2b-Sandbox-Id."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import hmac
import ipaddress
import logging
import os
import re
import struct
import time
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Message, Receive, Scope, Send

from bench.asgi import ClientGone

from .api import Api, ApiError, error_response, unimplemented
from .box import default_state_root
from .envd import envd_apps, rpc_paths
from .files import Files
from .pool_api import PoolApi
from .ports import PortProxy, paused_error, port_target
from .registry import Registry, Sandbox
from .template import default_cache_dir

log = logging.getLogger("e2b-bench.localbox")

RPC_PREFIXES = ("/process.Process/", "/filesystem.Filesystem/")
RPC_CONTENT_TYPES = (
    "application/json",
    "application/connect+json",
    "application/proto",
    "application/connect+proto",
)
MAX_REST_BODY = 1 << 20
DEBUG_SANDBOX_ID = "debug_sandbox_id"
WATCH_METHODS = {
    f"/filesystem.Filesystem/{name}" for name in ("WatchDir", "CreateWatcher", "GetWatcherEvents", "RemoveWatcher")
}
SERVER_STREAMS = {"/process.Process/Start", "/process.Process/Connect", "/filesystem.Filesystem/WatchDir"}
HOST_ROUTE = re.compile(r"^\d+-([a-z0-9-]+)\.")  # 49983-<sandbox id>.<domain>
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def connect_json_error(status: int, code: str, message: str) -> JSONResponse:
    return JSONResponse({"code": code, "message": message}, status_code=status)


def scope_header(scope: Scope, name: bytes) -> str:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return value.decode("latin-1")
    return ""


class HostPaths:
    """Host paths out of error messages: a path inside a sandbox's root becomes the path the sandbox sees, any
    other path of the endpoint's (state, template cache) becomes `[host path]`."""

    def __init__(self, roots: list[Path]) -> None:
        found = sorted({str(root) for root in roots}, key=len, reverse=True)
        prefix = "|".join(map(re.escape, found))
        self._in_box = re.compile(
            rf"(?:{prefix})/(?:[^\s'\"/]+/)*boxes/[^\s'\"/]+/(?:upper|merged)(?P<rest>/[^\s'\"]*)?"
        )
        self._other = re.compile(rf"(?:{prefix})[^\s'\":,)]*")

    def scrub(self, message: str) -> str:
        message = self._in_box.sub(lambda m: m["rest"] or "/", message)
        return self._other.sub("[host path]", message)


def peer_uid(scope: Scope) -> int | None:
    """The host user owning the client's end of a loopback TCP connection (None when it cannot be told)."""
    client, server = scope.get("client"), scope.get("server")
    if not client or not server:
        return None
    try:
        ends = {_proc_net_address(client[0], client[1]), _proc_net_address(server[0], server[1])}
    except ValueError:
        return None
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as rows:
            next(rows)
            for row in rows:
                fields = row.split()
                if fields[1] == _proc_net_address(client[0], client[1]) and {fields[1], fields[2]} == ends:
                    return int(fields[7])
    return None


def _proc_net_address(host: str, port: int) -> str:
    """An address as /proc/net/tcp{,6} writes it: the address's 32-bit words in host order, then the port."""
    packed = ipaddress.ip_address(host).packed
    words = [packed[i : i + 4] for i in range(0, len(packed), 4)]
    return "".join(struct.pack("=I", int.from_bytes(w, "big")).hex().upper() for w in words) + f":{port:04X}"


def signature(path: str, operation: str, user: str, token: str, expiration: str | None) -> str:
    raw = f"{path}:{operation}:{user}:{token}" + (f":{expiration}" if expiration else "")
    return "v1_" + base64.b64encode(hashlib.sha256(raw.encode()).digest()).decode().rstrip("=")


class LocalboxApp:
    """Dispatches each request to the REST API, the envd Connect apps, or envd's HTTP routes."""

    def __init__(self, registry: Registry, debug: bool = False) -> None:
        self.registry = registry
        self.debug = debug
        config = registry.config
        self.host_paths = HostPaths(
            [
                default_state_root(),
                config.state_dir,
                config.template_root.parent,
                config.cache_dir or default_cache_dir(),
            ]
        )
        self._debug_lock = asyncio.Lock()
        self.rest = Starlette(
            routes=[*Api(registry).routes(), *PoolApi(registry).routes()],
            exception_handlers={
                ApiError: self._api_error,
                HTTPException: self._http_error,
                Exception: self._crash,
            },
        )
        self.ports = PortProxy(registry)
        self.rpc: dict[str, ASGIApp] = {app.path + "/": app for app in envd_apps(registry)}
        self.rpc_paths = rpc_paths()
        files = Files(self._authorized_sandbox)
        self.envd_http = Starlette(
            routes=[
                Route("/files", files.download, methods=["GET"]),
                Route("/files", files.upload, methods=["POST"]),
                Route("/health", self.health, methods=["GET"]),
                Route("/files/compose", self.compose, methods=["POST"]),
            ],
            exception_handlers={
                ApiError: self._api_error,
                HTTPException: self._http_error,
                ClientGone: self._client_gone,
                ClientDisconnect: self._client_gone,
                Exception: self._crash,
            },
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] in ("http", "websocket") and (target := port_target(scope)) is not None:
            await self.ports(scope, receive, send, *target)
            return
        if scope["type"] != "http":
            return
        path: str = scope["path"]
        if path.startswith(RPC_PREFIXES):
            await self._rpc(scope, receive, send)
        elif path in ("/files", "/health", "/files/compose") or (
            scope_header(scope, b"e2b-sandbox-id") and not scope_header(scope, b"x-api-key")
        ):  # envd's other routes (e.g. /envs, /init) answer 501 from envd, not an API key refusal
            await self._envd_http(scope, receive, send)
        else:
            await self._rest(scope, receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await self.registry.start()
                except Exception as exc:
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.registry.shutdown()
                await send({"type": "lifespan.shutdown.complete"})
                return

    # --- REST ----------------------------------------------------------------------------------
    async def _rest(self, scope: Scope, receive: Receive, send: Send) -> None:
        key = scope_header(scope, b"x-api-key")
        bearer = scope_header(scope, b"authorization")
        if bearer.lower().startswith("bearer "):
            key = key or bearer[7:].strip()
        if not key or not hmac.compare_digest(key.encode(), self.registry.config.api_key.encode()):
            await error_response(401, "Invalid API key")(scope, receive, send)
            return
        length = scope_header(scope, b"content-length")
        if length.isdigit() and int(length) > MAX_REST_BODY:
            await error_response(413, f"request body larger than {MAX_REST_BODY} bytes")(scope, receive, send)
            return
        content_type = scope_header(scope, b"content-type").split(";")[0].strip().lower()
        if scope["method"] in ("POST", "PUT", "PATCH") and content_type not in ("", "application/json"):
            await error_response(415, f"Content-Type must be application/json, not '{content_type}'")(
                scope, receive, send
            )
            return
        await self.rest(scope, _limited(receive, MAX_REST_BODY), send)

    # --- envd ----------------------------------------------------------------------------------
    async def _gate(self, scope: Scope, query: dict[str, str] | None = None) -> Sandbox | str:
        """The sandbox a request may use, or why not (envd's message; every other refusal looks the same)."""
        quirks = self.registry.quirks
        refused = quirks.token_error
        sandbox_id = scope_header(scope, b"e2b-sandbox-id")
        if self.debug and sandbox_id in (DEBUG_SANDBOX_ID, ""):
            # E2B_DEBUG clients send no token: the shared sandbox is for processes of this server's own user.
            if peer_uid(scope) != os.getuid():
                return refused
            return await self._debug_sandbox()
        if not sandbox_id and (match := HOST_ROUTE.match(scope_header(scope, b"host"))):
            sandbox_id = match.group(1)
        if not sandbox_id and (token := scope_header(scope, b"x-access-token")):
            # Behind one sandbox URL an old SDK's `Sandbox.connect` (e2b < 2.2x) loses the id header that the
            # host name carries on E2B: its access token names the sandbox instead.
            sandbox_id = next((s.id for s in self.registry.sandboxes.values() if s.token_valid(token)), "")
        signed = bool(query and query.get("signature"))
        if not sandbox_id and signed:
            # A signed URL made with E2B_SANDBOX_URL carries no sandbox id: its signature names the sandbox.
            sandbox_id = next((s.id for s in self.registry.sandboxes.values() if self._signed_by(s, scope, query)), "")
            if not sandbox_id and not (quirks.refuse_signed_urls or quirks.signed_url_generic_error):
                return "invalid signature"
        sandbox = self.registry.get(sandbox_id)
        if sandbox is None:
            return refused
        if not scope_header(scope, b"e2b-sandbox-id"):  # envd's handlers find the sandbox by this header
            scope["headers"] = [*scope["headers"], (b"e2b-sandbox-id", sandbox.id.encode())]
        if sandbox.token_valid(scope_header(scope, b"x-access-token")):
            return sandbox
        if not signed or sandbox.quirks.refuse_signed_urls:
            return refused
        refusal = self._signature_refusal(sandbox, scope, query)  # type: ignore[arg-type]
        if refusal is None:
            return sandbox
        return refused if sandbox.quirks.signed_url_generic_error else refusal

    def _signature_refusal(self, sandbox: Sandbox, scope: Scope, query: dict[str, str]) -> str | None:
        """envd's order: the signature first, so a forger never learns whether the expiration was wrong."""
        expiration = query.get("signature_expiration")
        if expiration and not expiration.isdigit():
            return "invalid signature_expiration"
        if not self._signed_by(sandbox, scope, query):
            return "invalid signature"
        if expiration and int(expiration) < time.time():
            return "signature is already expired"
        return None

    @staticmethod
    def _signed_by(sandbox: Sandbox, scope: Scope, query: dict[str, str] | None) -> bool:
        query = query or {}
        expiration = query.get("signature_expiration")
        operation = "read" if scope["method"] == "GET" else "write"
        path = query.get("path", "")
        user = query.get("username", "")
        return any(
            hmac.compare_digest(query.get("signature", ""), signature(path, operation, user, token, expiration))
            for token in sandbox.live_tokens()
        )

    @staticmethod
    def _unauthorized(message: str, rpc: bool) -> Response:
        if rpc:
            return connect_json_error(401, "unauthenticated", message)
        return error_response(401, message)

    async def _rpc(self, scope: Scope, receive: Receive, send: Send) -> None:
        path: str = scope["path"]
        app = next((a for prefix, a in self.rpc.items() if path.startswith(prefix)), None)
        response: Response
        if path not in self.rpc_paths:
            response = connect_json_error(404, "unimplemented", f"no such method: {path}")
        elif self.registry.quirks.watch_dir_404 and path in WATCH_METHODS:
            # Such an endpoint has no watch routes at all: its proxy answers in E2B's REST error shape.
            response = error_response(404, f"{path} is not supported by this endpoint")
        elif scope["method"] != "POST":
            response = connect_json_error(405, "unimplemented", f"{scope['method']} is not allowed on {path}")
        elif scope_header(scope, b"content-type").split(";")[0].strip().lower() not in RPC_CONTENT_TYPES:
            response = connect_json_error(
                415, "invalid_argument", f"unsupported Content-Type '{scope_header(scope, b'content-type')}'"
            )
        elif isinstance(sandbox := await self._gate(scope), str):
            response = self._unauthorized(sandbox, rpc=True)
        elif not await self.registry.wake(sandbox):
            response = paused_error(sandbox.id)
        elif path in SERVER_STREAMS and not sandbox.quirks.streams_outlive_clients:
            await sandbox.in_flight.serve(partial(_cancelled_on_disconnect, app), scope, receive, send)  # type: ignore[arg-type]
            return
        else:
            await sandbox.in_flight.serve(app, scope, receive, send)  # type: ignore[arg-type]
            return
        await response(scope, receive, send)

    async def _envd_http(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["path"] == "/health":
            await self.envd_http(scope, receive, send)
            return
        query = dict(Request(scope).query_params)
        sandbox = await self._gate(scope, query)
        if isinstance(sandbox, str):
            await self._unauthorized(sandbox, rpc=False)(scope, receive, send)
            return
        if not await self.registry.wake(sandbox):
            await paused_error(sandbox.id)(scope, receive, send)
            return
        scope.setdefault("state", {})["sandbox"] = sandbox
        await sandbox.in_flight.serve(self.envd_http, scope, receive, send)

    async def _debug_sandbox(self) -> Sandbox:
        """Clients with E2B_DEBUG=true never call the API: they all share one sandbox."""
        async with self._debug_lock:
            sandbox = self.registry.get(DEBUG_SANDBOX_ID)
            if sandbox is None:
                sandbox, _ = await self.registry.create(
                    template_id="base", alias=None, timeout_s=24 * 3600, metadata={"e2b-bench": "debug"},
                    env_vars={}, internet=True, auto_pause=False, auto_resume=False, sandbox_id=DEBUG_SANDBOX_ID,
                )  # fmt: skip
            return sandbox

    @staticmethod
    def _authorized_sandbox(request: Request) -> Sandbox:
        return request.scope["state"]["sandbox"]

    async def health(self, request: Request) -> Response:
        sandbox_id = request.headers.get("e2b-sandbox-id", "")
        sandbox = await self._debug_sandbox() if self.debug and sandbox_id == DEBUG_SANDBOX_ID else None
        sandbox = sandbox or self.registry.get(sandbox_id)
        if sandbox is not None:
            await self.registry.wake(sandbox)  # a paused sandbox left paused answers 502: is_running() is False
        if sandbox is None or sandbox.state != "running" or not sandbox.box.running:
            body = {
                "code": 502,
                "message": f"The sandbox {sandbox_id} was not found",
                "sandboxId": sandbox_id,
            }
            return JSONResponse(body, status_code=502)
        return Response(status_code=204)

    @staticmethod
    async def compose(request: Request) -> Response:
        raise ApiError(501, "composing files (POST /files/compose) is not implemented by this endpoint")

    # --- errors --------------------------------------------------------------------------------
    async def _api_error(self, request: Request, exc: Exception) -> Response:
        assert isinstance(exc, ApiError)
        return error_response(exc.status, self.host_paths.scrub(exc.message), exc.error_code, exc.headers)

    async def _http_error(self, request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        if exc.status_code == 404 and not self.registry.quirks.unknown_route_404:
            error = unimplemented(request.method, request.url.path)
            return error_response(error.status, error.message, error.error_code)
        message = {404: f"route {request.method} {request.url.path} not found"}.get(exc.status_code, exc.detail)
        return error_response(exc.status_code, str(message))

    @staticmethod
    async def _client_gone(request: Request, exc: Exception) -> Response:
        """A client that left mid-body is no fault of the server's: nothing is logged, the answer goes nowhere."""
        return error_response(400, "the client closed the connection before the request body ended")

    async def _crash(self, request: Request, exc: Exception) -> Response:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return error_response(500, self.host_paths.scrub(f"internal error: {type(exc).__name__}: {exc}"))


def _limited(receive: Receive, limit: int) -> Receive:
    """Stop reading a body that grows past the limit (chunked bodies have no Content-Length)."""
    seen = 0

    async def wrapped() -> Message:
        nonlocal seen
        message = await receive()
        if message["type"] == "http.request":
            seen += len(message.get("body", b""))
            if seen > limit:
                raise ApiError(413, f"request body larger than {limit} bytes")
        return message

    return wrapped


async def _cancelled_on_disconnect(app: ASGIApp, scope: Scope, receive: Receive, send: Send) -> None:
    """Run a streaming handler until it ends or its client goes away, as envd cancels a handler's context."""
    body_read = asyncio.Event()
    finished = False

    async def receive_body() -> Message:
        message = await receive()
        if message["type"] == "http.disconnect" or not message.get("more_body"):
            body_read.set()
        return message

    async def send_tracked(message: Message) -> None:
        nonlocal finished
        if message["type"] == "http.response.body" and not message.get("more_body"):
            finished = True
        await send(message)

    async def watch() -> bool:
        await body_read.wait()
        while (await receive())["type"] != "http.disconnect":
            pass
        if finished:
            return False
        handler.cancel()
        return True

    handler = asyncio.ensure_future(app(scope, receive_body, send_tracked))
    watcher = asyncio.ensure_future(watch())
    try:
        await asyncio.wait([handler])
    finally:
        watcher.cancel()
        if not handler.done():  # this request was cut (inflight.py): what the handler ends with is moot
            handler.add_done_callback(lambda done: done.cancelled() or done.exception())
            handler.cancel()
    client_left = watcher.done() and not watcher.cancelled() and watcher.result()
    if handler.cancelled():
        return
    if client_left:
        handler.exception()  # how the cancel ended it (e.g. connect's CANCELED): there is nobody left to tell
        return
    handler.result()  # the handler's own failure
