"""Recording reverse proxy: runners talk to it, it forwards to the endpoint and logs every exchange.

A runner is given `E2B_API_URL=E2B_SANDBOX_URL=<proxy.url>`, so the unmodified SDK sends both its
control-plane and envd traffic here. Requests for envd (an `E2b-Sandbox-Id` header, or an envd path)
go to the sandbox upstream, everything else to the API upstream. Bodies stream both ways; each
exchange becomes one redacted line of `wire/<runner>.jsonl` (bench/schemas/wire.schema.json).

Every line carries an excerpt of both bodies (their first EXCERPT_BYTES, decoded and redacted as below)
and, for a Connect stream, its first and last frames (each cut to FRAME_BYTES) and their count: the
evidence a failing case shows (bench/triage/evidence.py). With `--wire-bodies`
(E2B_BENCH_WIRE_BODIES=BYTES) each line also carries the first BYTES of both bodies,
decoded (JSON, Connect envelopes, text; other types as a size), redacted, so the command a framework really
sent is in the log. Binary bodies are never copied.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import socket
import ssl
import threading
import time
import zlib
from collections import Counter, deque
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any, BinaryIO, Protocol

import httpx
import uvicorn

from bench.asgi import KEEPALIVE_S, RESET_EXTENSION, ResettableHttp
from bench.differential import capture
from bench.differential.probe import Prober
from bench.remote import capacity, lifetimes
from bench.remote.ledger import SANDBOX_PATH, SandboxLedger, is_create, is_lifecycle
from bench.remote.retry import RATE_LIMITED, TRANSIENT, retryable, wait_before_retry
from bench.remote.slowness import scaled
from bench.remote.tls import verifying

REDACTED = "[REDACTED]"
SECRET_HEADERS = frozenset(
    {
        "x-api-key",
        "x-access-token",
        "e2b-traffic-access-token",
        "authorization",
        "proxy-authorization",
        "cookie",
        "set-cookie",
    }
)
SECRET_QUERY_PARAMS = frozenset({"signature", "access_token", "key"})
# Response members that carry secrets the runner will use later; learnt so no log line shows them.
LEARNT_SECRET_MEMBERS = frozenset({"envdAccessToken", "trafficAccessToken"})
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
        "host",
    }
)
ENVD_PATH_PREFIXES = ("/process.Process/", "/filesystem.Filesystem/", "/files/")
ENVD_PATHS = frozenset({"/files", "/health"})
ENVD_PORT = 49983
CREATE_FINISH_S = 30.0  # a create under way when the proxy stops is let answer this long (quiet host)
START_S = 10.0  # the proxy up (or down), or an upstream connection made, on a quiet host (scaled by slowness)
# Control-plane JSON responses are small; beyond this they are streamed unread.
LEARN_LIMIT_BYTES = 1 << 20
WIRE_BODIES_ENV = "E2B_BENCH_WIRE_BODIES"  # bytes of each body to log; unset or 0: none
DEFAULT_BODY_BYTES = 4096
EXCERPT_BYTES = 512  # of every body, always: enough for a request's JSON or an error's message
FRAME_BYTES = 256  # of each Connect frame kept
FRAMES_KEPT = 4  # first and last frames of a stream kept (each)
LOG_MODE = 0o644  # redacted: nothing secret is left in a wire log
TEXT_TYPES = ("application/json", "application/x-www-form-urlencoded", "application/x-ndjson")
ENVELOPE_HEADER = capture.ENVELOPE  # Connect streaming: flags, then the message length
# Characters `str.splitlines` breaks at that JSON leaves as they are: escaped, so one exchange stays one line
# for every reader (a body excerpt decoded from arbitrary bytes may hold them).
_LINE_BREAKS = str.maketrans({"\x85": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"})
# At a cut, the partial token before it is dropped too: it could be the start of a secret.
_PARTIAL_TOKEN = re.compile(r"[A-Za-z0-9_+/=.-]+$")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


class SecretSink(Protocol):
    """What the proxy needs from bench.redaction.Redactor."""

    def add(self, value: str) -> None: ...

    def redact_text(self, s: str) -> str: ...

    def redact_obj(self, o: Any) -> Any: ...


class WireProxyError(Exception):
    """The proxy could not start."""


class _NoUpstream(Exception):
    """No upstream is known for this request."""


class _ClientGone(Exception):
    """The client disconnected while sending its request body."""


@dataclass
class _Exchange:
    started: float
    ts: str
    method: str
    url: str
    request_headers: dict[str, str]
    status: int | None = None
    response_headers: dict[str, str] = field(default_factory=dict)
    request_bytes: int = 0
    response_bytes: int = 0
    error: str | None = None
    retries: list[dict[str, Any]] = field(default_factory=list)  # answers not handed on, and the wait after each
    logged: bool = False
    request_body: bytearray = field(default_factory=bytearray)
    response_body: bytearray = field(default_factory=bytearray)
    lifecycle_body: bytearray | None = None  # a create/kill/timeout/...: its request, for the ledger
    response_json: Any = None  # a control-plane JSON answer, as learnt
    frames: _Frames | None = None  # a Connect stream's response
    reset: Callable[[], None] | None = None  # resets the client's connection (the server's protocol gives it)
    condition: dict[str, Any] | None = None  # the 429/502/503 handed on, as the step's conditions hold it
    gone: bool = False  # a create whose client disconnected before its answer: finished, never sent again
    upstream: bool = False  # a request is with the upstream, its answer not yet come
    create: bool = False  # a create the ledger counts (`_create`)
    room_message: str | None = None  # while a create refused for capacity waits for room: what the endpoint said
    capture: capture.Capture | None = None  # both bodies as the differential judgement reads them


@dataclass
class _Room:
    """A create's waits for room after capacity refusals, and the last answer's body once read."""

    refusals: int = 0
    waited_s: float = 0.0
    full: bool = False  # no room came within capacity.WAIT_S: the refusal goes to the client
    raw: bytes | None = None


async def _chunks(raw: bytes) -> AsyncIterator[bytes]:
    yield raw


class _Frames:
    """The first and last envelopes of a Connect stream (each cut to FRAME_BYTES), and how many there were,
    read as the bytes pass without holding more than that."""

    def __init__(self) -> None:
        self.count = 0
        self.first: list[tuple[int, int, bytes]] = []  # (flags, length, kept payload)
        self.last: deque[tuple[int, int, bytes]] = deque(maxlen=FRAMES_KEPT)
        self._head = bytearray()
        self._remaining: int | None = None  # payload bytes still to come; None while reading a header
        self._flags = 0
        self._length = 0
        self._payload = bytearray()

    def feed(self, chunk: bytes) -> None:
        index = 0
        while index < len(chunk):
            if self._remaining is None:
                need = ENVELOPE_HEADER.size - len(self._head)
                self._head += chunk[index : index + need]
                index += need
                if len(self._head) == ENVELOPE_HEADER.size:
                    self._flags, self._length = ENVELOPE_HEADER.unpack(bytes(self._head))
                    self._head, self._payload, self._remaining = bytearray(), bytearray(), self._length
                    if self._length == 0:
                        self._close()
                continue
            take = min(self._remaining, len(chunk) - index)
            room = FRAME_BYTES - len(self._payload)
            if room > 0:
                self._payload += chunk[index : index + min(take, room)]
            index += take
            self._remaining -= take
            if self._remaining == 0:
                self._close()

    def _close(self) -> None:
        frame = (self._flags, self._length, bytes(self._payload))
        self.count += 1
        if len(self.first) < FRAMES_KEPT:
            self.first.append(frame)
        else:
            self.last.append(frame)
        self._remaining = None

    def texts(self, redactor: SecretSink) -> list[str]:
        """Each kept frame as one line (`end:` marks the trailer); a gap line says how many are left out."""
        shown = [_frame_text(frame, redactor) for frame in self.first]
        left_out = self.count - len(self.first) - len(self.last)
        if left_out > 0:
            shown.append(f"… {left_out} more frame(s)")
        return shown + [_frame_text(frame, redactor) for frame in self.last]


def _frame_text(frame: tuple[int, int, bytes], redactor: SecretSink) -> str:
    flags, length, payload = frame
    if flags & 1:
        text = f"<{length} bytes, compressed>"
    elif len(payload) < length:
        text = _PARTIAL_TOKEN.sub("", redactor.redact_text(payload.decode("utf-8", "replace")))
        text += f"…[{length - len(payload)} more bytes]"
    else:
        text = _json_or_text(payload.decode("utf-8", "replace"), redactor)
    return f"end: {text}" if flags & 2 else text


class WireProxy:
    """`with WireProxy(api, sandbox, log, runner, redactor) as proxy:` serves on `proxy.url`."""

    def __init__(
        self,
        upstream_api: str,
        upstream_sandbox: str | None,
        log_path: Path,
        runner: str,
        redactor: SecretSink,
        *,
        domain: str | None = None,
        host: str = "127.0.0.1",
        body_bytes: int | None = None,
        ledger: SandboxLedger | None = None,
        suite: str | None = None,
        on_answer: Callable[[str, str, int], None] | None = None,
        on_write_error: Callable[[OSError], None] | None = None,
        probes: bool = False,
    ) -> None:
        self.upstream_api = upstream_api.rstrip("/")
        self.upstream_sandbox = upstream_sandbox.rstrip("/") if upstream_sandbox else None
        self.domain = domain
        self.log_path = log_path
        self.runner = runner
        self.suite = suite  # named on every line: one runner may run two suites at once, into one log
        self.redactor = redactor
        self.host = host
        self.body_bytes = body_bytes_from_env() if body_bytes is None else max(0, body_bytes)
        self.ledger = ledger
        self.on_answer = on_answer  # (method, path, status) of each answer handed on (retries are not)
        self.on_write_error = on_write_error  # a log line that could not be written (a full disk): told, not raised
        self.traced = capture.enabled()  # each line carries `trace` (bench/differential/capture.py)
        self.probes = probes and self.traced  # the second path's looks (bench/differential/probe.py): a run's
        self._prober: Prober | None = None
        self.port: int | None = None
        self._open: dict[int, _Exchange] = {}  # exchanges in progress, for `in_flight`
        self._log: BinaryIO | None = None
        self._client: httpx.AsyncClient | None = None
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._failure: BaseException | None = None
        self._conditions: list[dict[str, Any]] = []  # retries and transient answers since the last take
        self.retried: Counter[int] = Counter()  # status -> how many answers of it were retried, all the proxy's life
        self._conditions_lock = threading.Lock()

    def take_conditions(self) -> list[dict[str, Any]]:
        """The retries made and the transient answers (429, 502, 503) handed on since the last call: what
        the endpoint's conditions did to the step that just ended."""
        with self._conditions_lock:
            taken, self._conditions = self._conditions, []
        return taken

    def _note_expired(self, exchange: _Exchange, status: int) -> None:
        """An answer that a sandbox is gone after the lifetime the wire saw it given ran out: the step takes it
        as the harness's doing (bench/remote/lifetimes.py), not the endpoint's."""
        if self.ledger is None or status not in lifetimes.GONE_STATUSES:
            return
        path = httpx.URL(exchange.url).path
        named = SANDBOX_PATH.match(path)
        sandbox_id = exchange.request_headers.get("e2b-sandbox-id") or (named["id"] if named else None)
        if not isinstance(sandbox_id, str):
            return
        past = self.ledger.past_lifetime(sandbox_id, lifetimes.EXPIRED_SLACK_S)
        if past is not None and lifetimes.chosen_by_the_harness(past[0]):
            condition = lifetimes.expired_condition(sandbox_id, past[0], exchange.method, path, status, past[1])
            with self._conditions_lock:
                self._conditions.append(condition)

    def _condition(self, exchange: _Exchange, status: int, **more: Any) -> dict[str, Any]:
        path = httpx.URL(exchange.url).path
        condition = {"method": exchange.method, "path": path, "status": status, **more}
        with self._conditions_lock:
            if more.get("retried"):
                self.retried[status] += 1
            self._conditions.append(condition)
        return condition

    @property
    def url(self) -> str:
        if self.port is None:
            raise WireProxyError("the wire proxy is not running")
        return f"http://{self.host}:{self.port}"

    # --- lifecycle -------------------------------------------------------------------------------

    def start(self) -> WireProxy:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, LOG_MODE)
        os.fchmod(fd, LOG_MODE)  # whatever the umask
        self._log = os.fdopen(fd, "ab")
        # IPPROTO_TCP explicitly, or asyncio leaves Nagle on for accepted connections (+40 ms).
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((self.host, 0))
        listener.listen(512)
        self.port = listener.getsockname()[1]
        config = uvicorn.Config(
            self._asgi,
            log_level="critical",
            access_log=False,
            interface="asgi3",
            lifespan="off",
            http=ResettableHttp,
            ws="none",
            proxy_headers=False,
            server_header=False,  # the upstream's own Server and Date headers pass through
            date_header=False,
            timeout_graceful_shutdown=2,
            timeout_keep_alive=int(KEEPALIVE_S),  # the SDK's pool closes an idle connection first
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._serve, args=(listener,), name=f"wire-proxy-{self.runner}", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + scaled(START_S)
        while not self._server.started:
            if self._failure is not None or not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise WireProxyError(f"the wire proxy did not start: {self._failure!r}")
            time.sleep(0.005)
        return self

    def stop(self) -> None:
        # A create still with the upstream may make a sandbox: let it answer (bounded), so the ledger knows it and
        # it is killed (`_create`), not found alive by the leak sweep.
        deadline = time.monotonic() + scaled(CREATE_FINISH_S)
        while time.monotonic() < deadline and any(e.upstream and e.create for e in list(self._open.values())):
            time.sleep(0.01)
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=scaled(START_S))
        if self._log is not None:
            try:
                self._log.close()
            except OSError as exc:  # what was still buffered found no room
                self._write_failed(exc)
            self._log = None
        self.port = None

    def __enter__(self) -> WireProxy:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def _serve(self, listener: socket.socket) -> None:
        try:
            asyncio.run(self._main(listener))
        except BaseException as exc:  # surfaced by start()
            self._failure = exc

    async def _main(self, listener: socket.socket) -> None:
        assert self._server is not None
        # Reads have no timeout: a server-streaming RPC may stay silent as long as its command runs.
        self._client = httpx.AsyncClient(
            timeout=httpx.Timeout(connect=scaled(START_S), read=None, write=None, pool=None),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=32),
            follow_redirects=False,
            trust_env=False,
            verify=verifying(),
        )
        try:
            await self._server.serve(sockets=[listener])
        finally:
            await self._client.aclose()

    def wait_logged(self, started_before: float, timeout_s: float) -> None:
        """Wait, at most `timeout_s`, until every exchange that started before `started_before` (on
        `time.monotonic()`'s clock) is in the log: a runner may report a step before the proxy has written the
        last exchange of it (a stream's line is written when it ends), and its evidence is read at once."""
        deadline = time.monotonic() + timeout_s
        while any(e.started < started_before for e in list(self._open.values())) and time.monotonic() < deadline:
            time.sleep(0.01)

    def in_flight(self) -> list[dict[str, Any]]:
        """The exchanges still open now (a stream that never ends is one), oldest first, redacted."""
        now = time.monotonic()
        shown = []
        for e in sorted(list(self._open.values()), key=lambda e: e.started):
            line = {"method": e.method, "url": e.url, "status": e.status, "open_s": round(now - e.started, 1)}
            shown.append(self.redactor.redact_obj({**line, "response_bytes": e.response_bytes}))
        return shown

    # --- routing ---------------------------------------------------------------------------------

    def upstream_for(self, path: str, sandbox_id: str | None) -> str:
        """Base URL of the upstream serving this request."""
        if not _is_envd(path, sandbox_id):
            return self.upstream_api
        if self.upstream_sandbox is not None:
            return self.upstream_sandbox
        if self.domain is not None and sandbox_id:
            return f"https://{ENVD_PORT}-{sandbox_id}.{self.domain}"
        raise _NoUpstream(f"no sandbox upstream for {path}: no E2b-Sandbox-Id header and no sandbox URL")

    # --- one exchange ----------------------------------------------------------------------------

    async def _asgi(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        headers = [(name.decode("latin-1").lower(), value.decode("latin-1")) for name, value in scope["headers"]]
        header_map = dict(headers)
        raw_path: bytes = scope.get("raw_path") or scope["path"].encode()
        query: bytes = scope.get("query_string", b"")
        exchange = _Exchange(
            started=time.monotonic(),
            ts=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
            method=scope["method"],
            url=scope["path"],
            request_headers=_redact_headers(headers),
            reset=scope.get("extensions", {}).get(RESET_EXTENSION),
            capture=capture.Capture(dict(headers)) if self.traced else None,
        )
        followed = False  # a lifecycle call (kill, pause, ...) the ledger must see answered
        try:
            sandbox_id = header_map.get("e2b-sandbox-id")
            url = _join(self.upstream_for(scope["path"], sandbox_id), raw_path, query)
            exchange.url = _redact_query(str(url))
            control_plane = not _is_envd(scope["path"], sandbox_id)
            retry_path = scope["path"] if control_plane and retryable(scope["method"], scope["path"]) else None
            followed = self.ledger is not None and control_plane and is_lifecycle(exchange.method, scope["path"])
            if followed:
                exchange.lifecycle_body = bytearray()
            self._open[id(exchange)] = exchange
            if followed and is_create(exchange.method, scope["path"]):
                followed, exchange.create = False, True  # the create tells the ledger itself
                await self._create(exchange, url, headers, receive, send, retry_path)
            else:
                if self.probes and exchange.capture is not None and self._client is not None:  # the look before
                    with contextlib.suppress(Exception):  # a look that fails is left out
                        exchange.capture.before = await self._prober_of(self._client).before(
                            exchange.method, exchange.url, exchange.capture.headers
                        )
                await self._forward(exchange, url, headers, control_plane, receive, send, retry_path)
        except _NoUpstream as exc:
            await self._reply_502(exchange, send, str(exc))
        finally:
            # Even when the proxy stops while the client is gone (a runner that exits right after its last
            # kill): the ledger must see the kill, or the run reports a sandbox it killed as left by it.
            if followed:
                self._observe(exchange, scope["path"])
            self._write(exchange)  # logged before it stops being open: `wait_logged` relies on that order
            self._open.pop(id(exchange), None)

    async def _create(
        self,
        exchange: _Exchange,
        url: httpx.URL,
        headers: list[tuple[str, str]],
        receive: Receive,
        send: Send,
        retry_path: str | None = None,
    ) -> None:
        """A create waits for a slot under the run's sandbox quota; its answer names the sandbox to count."""
        assert self.ledger is not None
        await self.ledger.admit()
        made = False
        try:
            await self._forward(exchange, url, headers, True, receive, send, retry_path)
            answer = exchange.response_json if isinstance(exchange.response_json, dict) else {}
            sandbox_id = answer.get("sandboxID")
            if exchange.status is not None and exchange.status < 300 and isinstance(sandbox_id, str):
                body = _json_object(exchange.lifecycle_body)
                timeout = body.get("timeout")
                timeout_s = float(timeout) if isinstance(timeout, int | float) else None
                lifecycle = body.get("lifecycle")
                on_timeout = lifecycle.get("onTimeout") if isinstance(lifecycle, dict) else None
                pauses = body.get("autoPause") is True or on_timeout == "pause"
                self.ledger.created(sandbox_id, self.suite or "", self.runner, timeout_s, pauses=pauses)
                made = True
                if exchange.gone:  # nobody will use or kill it
                    await self._kill_unwanted(sandbox_id, headers)
        finally:
            if not made:
                self.ledger.abandon()

    async def _kill_unwanted(self, sandbox_id: str, headers: list[tuple[str, str]]) -> None:
        """Kill a sandbox made for a client that went away, and tell the ledger."""
        assert self._client is not None and self.ledger is not None
        auth = [(name, value) for name, value in headers if name in ("x-api-key", "authorization")]
        path = f"/sandboxes/{sandbox_id}"
        try:
            answer = await self._client.delete(f"{self.upstream_api}{path}", headers=auth)
        except httpx.HTTPError:
            return  # left to the end of the run (its leak sweep)
        self.ledger.observe("DELETE", path, answer.status_code, None)

    def _observe(self, exchange: _Exchange, path: str) -> None:
        if self.ledger is not None and exchange.status is not None:
            body = _json_object(exchange.lifecycle_body)
            self.ledger.observe(exchange.method, path, exchange.status, body, exchange.response_json)

    async def _forward(
        self,
        exchange: _Exchange,
        url: httpx.URL,
        headers: list[tuple[str, str]],
        learn: bool,
        receive: Receive,
        send: Send,
        retry_path: str | None = None,
    ) -> None:
        """`retry_path`: the request may be sent again (bench/remote/retry.py), so its body is read whole first."""
        assert self._client is not None
        body_done = asyncio.Event()
        header_map = dict(headers)
        content: AsyncIterator[bytes] | bytes | None
        if "transfer-encoding" in header_map or header_map.get("content-length", "0") not in ("", "0"):
            content = self._request_body(exchange, receive, body_done)
            if retry_path is not None:
                try:
                    content = b"".join([chunk async for chunk in content])
                except _ClientGone as exc:
                    exchange.error = str(exc)
                    return
        else:
            await receive()  # the empty http.request message
            body_done.set()
            content = b"" if "content-length" in header_map else None
        request = self._client.build_request(
            exchange.method,
            url,
            headers=[(name, value) for name, value in headers if name not in HOP_BY_HOP],
            content=content,
        )
        relay = asyncio.create_task(self._relay(exchange, request, learn, send, retry_path))
        watch = asyncio.create_task(_wait_for_disconnect(receive, body_done))
        await asyncio.wait({relay, watch}, return_when=asyncio.FIRST_COMPLETED)
        if not relay.done() and exchange.upstream and exchange.create:
            # A create whose client went away is let finish (no resend after it): what it made is then known, and
            # killed (`_create`), not left holding the endpoint's room until its timeout.
            exchange.gone = True
            exchange.error = "client disconnected before the create's answer"
            with contextlib.suppress(Exception):
                await relay
        elif not relay.done():
            # The client went away: cancelling the relay closes the upstream stream too.
            relay.cancel()
            exchange.error = f"client disconnected after {exchange.response_bytes} response bytes"
            if exchange.room_message is not None:  # it gave up waiting for room: the endpoint's capacity, handed on
                exchange.error = "client gave up while its create waited for room under the endpoint's limit"
                self._condition(exchange, RATE_LIMITED, retried=False, capacity=True, message=exchange.room_message)
        watch.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await relay
        with contextlib.suppress(asyncio.CancelledError):
            await watch

    async def _request_body(
        self, exchange: _Exchange, receive: Receive, body_done: asyncio.Event
    ) -> AsyncIterator[bytes]:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise _ClientGone("client disconnected while sending the request body")
            chunk = message.get("body", b"")
            exchange.request_bytes += len(chunk)
            self._keep(exchange.request_body, chunk)
            if exchange.capture is not None:
                exchange.capture.request.feed(chunk)
            if exchange.lifecycle_body is not None and len(exchange.lifecycle_body) < LEARN_LIMIT_BYTES:
                exchange.lifecycle_body += chunk
            if chunk:
                yield chunk
            if not message.get("more_body", False):
                break
        body_done.set()

    async def _relay(
        self, exchange: _Exchange, request: httpx.Request, learn: bool, send: Send, retry_path: str | None = None
    ) -> None:
        assert self._client is not None
        waited = 0.0
        room = _Room()  # a create refused for capacity: its waits for room (bench/remote/capacity.py)
        while True:
            exchange.upstream = True
            try:
                response = await self._client.send(request, stream=True)
            except _ClientGone as exc:
                exchange.error = str(exc)
                return
            except (httpx.HTTPError, OSError) as exc:
                message = f"e2b-bench wire proxy: upstream {request.url} unreachable: {_reason(exc)}"
                await self._reply_502(exchange, send, message)
                return
            status, attempt = response.status_code, len(exchange.retries) + 1
            room.raw = None
            create = retry_path is not None and is_create(exchange.method, retry_path)
            exchange.upstream = False  # answered: what follows is a wait, a send again, or the answer relayed
            if status == RATE_LIMITED and create and await self._wait_for_room(exchange, response, room):
                continue
            wait = None
            if retry_path is not None and not room.full:
                wait = wait_before_retry(exchange.method, retry_path, status, response.headers, attempt, waited)
            if wait is None:
                break
            if room.raw is None:
                await response.aread()  # an error answer the runner never sees: small, read to free the connection
            await response.aclose()
            exchange.retries.append({"status": status, "wait_ms": round(wait * 1000)})
            self._condition(exchange, status, retried=True, wait_ms=round(wait * 1000))
            await asyncio.sleep(wait)
            waited += wait
        if response.status_code in TRANSIENT or response.status_code == RATE_LIMITED:
            capacity = {"capacity": True} if room.full else {}
            exchange.condition = self._condition(exchange, response.status_code, retried=False, **capacity)
        self._note_expired(exchange, response.status_code)
        if self.on_answer is not None:
            self.on_answer(exchange.method, httpx.URL(exchange.url).path, response.status_code)
        try:
            exchange.status = response.status_code
            exchange.response_headers = _redact_headers(
                [(k.decode("latin-1").lower(), v.decode("latin-1")) for k, v in response.headers.raw]
            )
            # A client is done at the last byte it expects, so the line is written just before it.
            expected = _content_length(response, exchange.method)
            if expected == 0:
                await self._probe(exchange)
                self._write(exchange)
            await send(
                {
                    "type": "http.response.start",
                    "status": response.status_code,
                    "headers": [(k, v) for k, v in response.headers.raw if k.lower().decode() not in HOP_BY_HOP],
                }
            )
            media_type = response.headers.get("content-type", "").split(";")[0].strip().lower()
            if media_type.startswith("application/connect+") and not response.headers.get("content-encoding"):
                exchange.frames = _Frames()
            learning = learn and media_type == "application/json"
            held: list[bytes] = []
            try:
                async for chunk in response.aiter_raw() if room.raw is None else _chunks(room.raw):
                    exchange.response_bytes += len(chunk)
                    self._keep(exchange.response_body, chunk)
                    if exchange.capture is not None:
                        exchange.capture.response.feed(chunk)
                    if exchange.frames is not None:
                        exchange.frames.feed(chunk)
                    if learning:
                        held.append(chunk)
                        if exchange.response_bytes <= LEARN_LIMIT_BYTES:
                            continue
                        learning, chunk = False, b"".join(held)
                    if expected is not None and exchange.response_bytes >= expected:
                        await self._probe(exchange)
                        self._write(exchange)
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
            except httpx.HTTPError as exc:
                exchange.error = f"upstream stream broken: {_reason(exc)}"
                if isinstance(exc, httpx.ReadError) and exchange.reset is not None:
                    exchange.reset()  # the upstream reset the stream (a stopped sandbox's): so is the client's
                    return
                raise
            if learning:
                exchange.response_json = self._learn(b"".join(held), response.headers.get("content-encoding", ""))
            await self._probe(exchange)
            self._write(exchange)
            await send({"type": "http.response.body", "body": b"".join(held) if learning else b""})
        finally:
            await response.aclose()

    async def _wait_for_room(self, exchange: _Exchange, response: httpx.Response, room: _Room) -> bool:
        """A create answered 429: when it is a capacity refusal (bench/remote/capacity.py) the ledger learns the
        limit and the create waits for room under it, then is sent again (True); past `capacity.WAIT_S` of such
        waits `room.full` is set and the answer goes to the client. The answer's body is read (`room.raw`)."""
        room.raw = b"".join([chunk async for chunk in response.aiter_raw()])
        if self.ledger is None or exchange.gone:
            return False
        headers = {k.lower(): v for k, v in response.headers.items()}
        message = answer_message(room.raw[:EXCERPT_BYTES], headers, self.redactor)
        refusals = sum(1 for retry in exchange.retries if retry["status"] == RATE_LIMITED)
        if not capacity.is_capacity(response.status_code, headers, message, refusals):
            return False
        if self.ledger.refused_for_capacity(message) is None:  # the run holds no sandbox: not its capacity
            return False
        room.refusals += 1
        left = capacity.WAIT_S - room.waited_s
        if left <= 0:
            room.full = True
            return False
        await response.aclose()
        started = time.monotonic()
        self.ledger.waiting(+1)
        exchange.room_message = message
        try:
            await self.ledger.readmit(left)
            await asyncio.sleep(capacity.backoff_s(room.refusals))
        finally:
            self.ledger.waiting(-1)
            exchange.room_message = None
        if exchange.gone:  # its client went away meanwhile: not sent again
            return False
        waited = time.monotonic() - started
        room.waited_s += waited
        exchange.retries.append({"status": RATE_LIMITED, "wait_ms": round(waited * 1000), "capacity": True})
        self._condition(exchange, RATE_LIMITED, retried=True, wait_ms=round(waited * 1000), capacity=True)
        return True

    async def _reply_502(self, exchange: _Exchange, send: Send, message: str) -> None:
        body = json.dumps({"code": 502, "message": message}).encode()
        exchange.error = message
        exchange.response_headers = {"content-type": "application/json", "content-length": str(len(body))}
        await send(
            {
                "type": "http.response.start",
                "status": 502,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
            }
        )
        self._write(exchange)
        await send({"type": "http.response.body", "body": body, "more_body": False})

    def _prober_of(self, client: httpx.AsyncClient) -> Prober:
        if self._prober is None:
            self._prober = Prober(client, self.upstream_api, self.upstream_for)
        return self._prober

    async def _probe(self, exchange: _Exchange) -> None:
        """The second path's look after the exchange (bench/differential/probe.py), before its client has the end."""
        if not self.probes or exchange.capture is None or exchange.logged or self._client is None:
            return
        try:
            exchange.capture.probe = await self._prober_of(self._client).probe(
                exchange.method,
                exchange.url,
                exchange.status,
                exchange.capture.headers,
                bytes(exchange.capture.request.kept),
                exchange.response_json,
                exchange.capture.before,
                datetime.fromisoformat(exchange.ts.replace("Z", "+00:00")),
            )
        except Exception:
            exchange.capture.probe = None

    def _learn(self, body: bytes, encoding: str) -> Any:
        """Teach the redactor the secrets of a JSON answer; returns the answer (None: not JSON)."""
        try:
            if encoding.strip().lower() in ("gzip", "deflate"):
                body = zlib.decompress(body, zlib.MAX_WBITS | 32)
            document = json.loads(body)
        except (ValueError, zlib.error):
            return None
        for value in _members(document, LEARNT_SECRET_MEMBERS):
            self.redactor.add(value)
        return document

    def _write(self, exchange: _Exchange) -> None:
        """Append the exchange's line, once; called before the client sees the end of the response."""
        if exchange.logged:
            return
        exchange.logged = True
        if exchange.condition is not None:  # what the endpoint said with its 429/502/503, before the client has it
            exchange.condition["message"] = answer_message(
                bytes(exchange.response_body[:EXCERPT_BYTES]), exchange.response_headers, self.redactor
            )
        record: dict[str, Any] = {
            "ts": exchange.ts,
            "runner": self.runner,
            "method": exchange.method,
            "url": exchange.url,
            "status": exchange.status,
            "duration_ms": round((time.monotonic() - exchange.started) * 1000, 3),
            "request_headers": exchange.request_headers,
            "response_headers": exchange.response_headers,
            "request_bytes": exchange.request_bytes,
            "response_bytes": exchange.response_bytes,
        }
        if self.suite is not None:
            record["suite"] = self.suite
        if exchange.error is not None:
            record["error"] = exchange.error
        for part, headers, kept, total in (
            ("request_excerpt", exchange.request_headers, exchange.request_body, exchange.request_bytes),
            ("response_excerpt", exchange.response_headers, exchange.response_body, exchange.response_bytes),
        ):
            if total and not (part == "response_excerpt" and exchange.frames is not None):
                record[part] = body_text(bytes(kept[:EXCERPT_BYTES]), total, headers, self.redactor)
        if exchange.frames is not None:
            record["frame_count"] = exchange.frames.count
            record["frames"] = exchange.frames.texts(self.redactor)
        if exchange.retries:
            record["retries"] = exchange.retries
        if exchange.capture is not None:
            record["trace"] = exchange.capture.summary(
                exchange.request_headers, exchange.response_headers, self.redactor
            )
        if self.body_bytes:
            for part, headers, kept, total in (
                ("request_body", exchange.request_headers, exchange.request_body, exchange.request_bytes),
                ("response_body", exchange.response_headers, exchange.response_body, exchange.response_bytes),
            ):
                if total:
                    record[part] = body_text(bytes(kept[: self.body_bytes]), total, headers, self.redactor)
        line = json.dumps(self.redactor.redact_obj(record), ensure_ascii=False).translate(_LINE_BREAKS) + "\n"
        if self._log is not None:
            try:
                self._log.write(line.encode())
                self._log.flush()
            except OSError as exc:
                self._write_failed(exc)

    def _write_failed(self, exc: OSError) -> None:
        if exc.filename is None:
            exc.filename = str(self.log_path)
        if self.on_write_error is None:
            raise exc
        self.on_write_error(exc)

    def _keep(self, kept: bytearray, chunk: bytes) -> None:
        limit = max(self.body_bytes, EXCERPT_BYTES)
        if len(kept) < limit:
            kept += chunk[: limit - len(kept)]


def last_exchange(log_path: Path) -> dict[str, Any] | None:
    """The last line a wire log holds (already redacted), or None."""
    try:
        with log_path.open("rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(handle.tell() - LEARN_LIMIT_BYTES, 0))
            lines = handle.read().split(b"\n")
    except OSError:
        return None
    for line in reversed(lines):
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        keep = ("ts", "method", "url", "status", "duration_ms", "error")
        return {key: entry[key] for key in keep if key in entry} if isinstance(entry, dict) else None
    return None


def answer_message(kept: bytes, headers: dict[str, str], redactor: SecretSink) -> str:
    """What an error answer says in words: its JSON `message` (E2B's and Connect's error shape), else its text."""
    text = body_text(kept, len(kept), headers, redactor) if kept else ""
    try:
        document = json.loads(text.removeprefix("end: "))
    except ValueError:
        return " ".join(text.split())[:EXCERPT_BYTES] if not text.startswith("<") else ""
    message = document.get("message") if isinstance(document, dict) else None
    return " ".join(str(message).split()) if message is not None else ""


def body_bytes_from_env(environ: MutableMapping[str, str] | None = None) -> int:
    """How many bytes of each body to log, from E2B_BENCH_WIRE_BODIES (0 when unset or not a number)."""
    value = (os.environ if environ is None else environ).get(WIRE_BODIES_ENV, "")
    return int(value) if value.isdigit() else 0


def body_text(kept: bytes, total: int, headers: dict[str, str], redactor: SecretSink) -> str:
    """A logged body: decoded and redacted when it is JSON, Connect JSON or text; else its size and type."""
    media = headers.get("content-type", "").split(";")[0].strip().lower()
    encoding = headers.get("content-encoding", "").strip().lower()
    complete = len(kept) >= total
    if encoding in ("gzip", "deflate"):
        if not complete:
            return f"<{total} bytes, {encoding}>"
        try:
            kept = zlib.decompress(kept, zlib.MAX_WBITS | 32)
        except zlib.error:
            return f"<{total} bytes, {encoding}, not decodable>"
    if media.startswith("application/connect+json"):
        text = "\n".join(_envelopes(kept, redactor))
    elif media in TEXT_TYPES or media.startswith("text/") or media.endswith("+json"):
        text = _json_or_text(kept.decode("utf-8", "replace"), redactor)
    else:
        return f"<{total} bytes of {media or 'unknown type'}>"
    if not complete:
        text = _PARTIAL_TOKEN.sub("", text) + f"…[{total - len(kept)} more bytes]"
    return text


def _json_or_text(text: str, redactor: SecretSink) -> str:
    try:
        return json.dumps(redactor.redact_obj(json.loads(text)), ensure_ascii=False)
    except ValueError:
        return redactor.redact_text(text)


def _envelopes(data: bytes, redactor: SecretSink) -> list[str]:
    """Each complete Connect envelope as one JSON line (`end:` marks the end-of-stream trailer)."""
    messages = []
    for flags, payload in capture.envelopes(data):
        text = _json_or_text(payload.decode("utf-8", "replace"), redactor)
        messages.append(f"end: {text}" if flags & 2 else text)
    return messages


def _json_object(body: bytearray | None) -> dict[str, Any]:
    try:
        document = json.loads(bytes(body or b"{}") or b"{}")
    except ValueError:
        return {}
    return document if isinstance(document, dict) else {}


def _is_envd(path: str, sandbox_id: str | None) -> bool:
    return sandbox_id is not None or path in ENVD_PATHS or path.startswith(ENVD_PATH_PREFIXES)


async def _wait_for_disconnect(receive: Receive, body_done: asyncio.Event) -> None:
    await body_done.wait()
    while (await receive())["type"] != "http.disconnect":
        pass


def _content_length(response: httpx.Response, method: str) -> int | None:
    """How many body bytes the client waits for; None when the end is marked by the framing."""
    if method == "HEAD" or response.status_code in (204, 304) or response.status_code < 200:
        return 0
    try:
        return int(response.headers["content-length"])
    except (KeyError, ValueError):
        return None


def _join(base: str, raw_path: bytes, query: bytes) -> httpx.URL:
    # raw_path keeps the client's percent-encoding byte for byte (list metadata is double-encoded).
    upstream = httpx.URL(base)
    path = upstream.raw_path.split(b"?")[0].rstrip(b"/") + raw_path
    return upstream.copy_with(raw_path=path + (b"?" + query if query else b""))


def _redact_headers(headers: list[tuple[str, str]]) -> dict[str, str]:
    redacted: dict[str, str] = {}
    for name, value in headers:
        shown = REDACTED if name in SECRET_HEADERS else value
        redacted[name] = f"{redacted[name]}, {shown}" if name in redacted else shown
    return redacted


_QUERY_SECRET = re.compile(r"(?P<head>[?&](?:" + "|".join(sorted(SECRET_QUERY_PARAMS)) + r")=)[^&#]*")


def _redact_query(url: str) -> str:
    return _QUERY_SECRET.sub(lambda match: match["head"] + REDACTED, url)


def _members(document: Any, names: frozenset[str]) -> list[str]:
    found: list[str] = []
    if isinstance(document, dict):
        for key, value in document.items():
            if key in names and isinstance(value, str) and value:
                found.append(value)
            else:
                found.extend(_members(value, names))
    elif isinstance(document, list):
        for item in document:
            found.extend(_members(item, names))
    return found


def _reason(exc: BaseException) -> str:
    """The most specific cause: the operating system's words when there are some."""
    chain: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in chain:
        chain.append(current)
        current = current.__cause__ or current.__context__
    for item in reversed(chain):
        if isinstance(item, ssl.SSLError):
            return str(item)
        if isinstance(item, socket.gaierror) and item.strerror:
            return item.strerror
        if isinstance(item, OSError) and item.errno:
            return os.strerror(item.errno)
    return next((str(item) for item in chain if str(item)), type(exc).__name__)
