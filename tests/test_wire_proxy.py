"""WireProxy between a real httpx client and real Starlette upstreams on loopback."""

from __future__ import annotations

import asyncio
import json
import stat
import struct
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest
from loopback import closed_port, serving, two_requests_idle_between
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from bench.asgi import KEEPALIVE_S
from bench.redaction import Redactor
from bench.wire import WIRE_BODIES_ENV, WireProxy, body_bytes_from_env

SCHEMA = json.loads((Path(__file__).parents[1] / "bench" / "schemas" / "wire.schema.json").read_text())
ENVD_TOKEN = "envd-token-5d41402abc4b2a76b9719d911017c592"
TRAFFIC_TOKEN = "traffic-token-7b52009b64fd0a2a49e6d8a939753077"
API_KEY = "e2b_0123456789abcdef0123456789abcdef01234567"


def envelope(flags: int, message: dict[str, Any]) -> bytes:
    payload = json.dumps(message).encode()
    return struct.pack(">BI", flags, len(payload)) + payload


FIRST = envelope(0, {"event": {"start": {"pid": 42}}})
REST = envelope(0, {"event": {"end": {"exited": True, "status": "exit status 0"}}}) + envelope(2, {})


class Upstream:
    """A fake endpoint side: records what it saw, can hold a stream open until released."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.release = threading.Event()
        self.stream_closed = threading.Event()
        self.seen: list[dict[str, Any]] = []
        self.app = Starlette(
            routes=[
                Route("/v2/sandboxes", self.sandboxes, methods=["GET", "POST"]),
                Route("/process.Process/Start", self.start, methods=["POST"]),
                Route("/files", self.upload, methods=["GET", "POST"]),
                Route("/health", self.health, methods=["GET"]),
            ]
        )

    def _see(self, request: Request, **extra: Any) -> None:
        raw_query = request.scope["query_string"].decode()
        self.seen.append({"path": request.url.path, "query": raw_query, "headers": dict(request.headers), **extra})

    async def sandboxes(self, request: Request) -> Response:
        self._see(request)
        if request.method == "POST":
            sandbox = {
                "sandboxID": "sbx1",
                "templateID": "base",
                "clientID": "c",
                "envdVersion": "0.5.7",
                "envdAccessToken": ENVD_TOKEN,
                "trafficAccessToken": TRAFFIC_TOKEN,
            }
            return JSONResponse(sandbox, status_code=201)
        return JSONResponse([], headers={"x-upstream": self.name})

    async def start(self, request: Request) -> Response:
        self._see(request, body=await request.body())

        async def events() -> AsyncIterator[bytes]:
            try:
                yield FIRST
                for _ in range(1000):
                    if self.release.is_set():
                        break
                    await asyncio.sleep(0.01)
                yield REST
            finally:
                self.stream_closed.set()

        return StreamingResponse(events(), media_type="application/connect+json")

    async def upload(self, request: Request) -> Response:
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
        self._see(request, size=size)
        return JSONResponse([{"name": "f", "type": "file", "path": "/f"}], headers={"x-upstream": self.name})

    async def health(self, request: Request) -> Response:
        self._see(request)
        return Response(status_code=204, headers={"x-upstream": self.name})


@pytest.fixture
def api() -> Upstream:
    return Upstream("api")


@pytest.fixture
def envd() -> Upstream:
    return Upstream("envd")


@pytest.fixture
def proxy(tmp_path: Path, api: Upstream, envd: Upstream) -> Iterator[WireProxy]:
    with (
        serving(api.app) as api_url,
        serving(envd.app) as envd_url,
        WireProxy(api_url, envd_url, tmp_path / "wire" / "py.jsonl", "py-e2b-2.63.0", Redactor()) as running,
    ):
        yield running


def log_lines(proxy: WireProxy) -> list[dict[str, Any]]:
    lines = [json.loads(line) for line in proxy.log_path.read_text().splitlines()]
    for line in lines:
        jsonschema.validate(line, SCHEMA)
    return lines


def test_unary_request_is_forwarded_verbatim_and_logged_with_secret_headers_redacted(
    proxy: WireProxy, api: Upstream
) -> None:
    query = "metadata=e2b-bench-run%3Dr%25201&state=running%2Cpaused&limit=1"

    response = httpx.get(
        f"{proxy.url}/v2/sandboxes?{query}",
        headers={"X-API-KEY": API_KEY, "Authorization": "Basic cm9vdDo=", "lang": "python"},
    )

    assert (response.status_code, response.json(), response.headers["x-upstream"]) == (200, [], "api")
    assert api.seen[0]["query"] == query
    assert api.seen[0]["headers"]["x-api-key"] == API_KEY
    [line] = log_lines(proxy)
    assert line["method"] == "GET"
    assert line["url"].endswith(f"/v2/sandboxes?{query}")
    assert (line["status"], line["runner"], line["response_bytes"]) == (200, "py-e2b-2.63.0", 2)
    assert line["request_headers"]["x-api-key"] == "[REDACTED]"
    assert line["request_headers"]["authorization"] == "[REDACTED]"
    assert line["request_headers"]["lang"] == "python"
    assert "error" not in line


def test_envd_requests_are_routed_to_the_sandbox_upstream(proxy: WireProxy, api: Upstream, envd: Upstream) -> None:
    by_header = httpx.post(f"{proxy.url}/files?path=/f", content=b"x", headers={"E2b-Sandbox-Id": "sbx1"})
    by_path = httpx.get(f"{proxy.url}/health")

    assert [by_header.headers["x-upstream"], by_path.headers["x-upstream"]] == ["envd", "envd"]
    assert [seen["path"] for seen in envd.seen] == ["/files", "/health"]
    assert api.seen == []


def test_without_a_sandbox_url_envd_goes_to_the_per_sandbox_host_of_the_domain(tmp_path: Path) -> None:
    proxy = WireProxy("https://api.example.test", None, tmp_path / "w.jsonl", "r", Redactor(), domain="example.test")

    assert proxy.upstream_for("/process.Process/Start", "sbx1") == "https://49983-sbx1.example.test"
    assert proxy.upstream_for("/sandboxes/sbx1", None) == "https://api.example.test"


def test_server_streaming_envelopes_reach_the_client_before_the_upstream_finishes(
    proxy: WireProxy, envd: Upstream
) -> None:
    assert_streams_incrementally(proxy, envd)


def test_streams_are_not_held_when_api_and_sandbox_share_one_upstream(tmp_path: Path) -> None:
    # The embedded endpoint serves both on one port; envd responses must still not be buffered.
    both = Upstream("both")
    with serving(both.app) as url, WireProxy(url, url, tmp_path / "w.jsonl", "r", Redactor()) as proxy:
        assert_streams_incrementally(proxy, both)


def assert_streams_incrementally(proxy: WireProxy, envd: Upstream) -> None:
    body = envelope(0, {"process": {"cmd": "/bin/bash", "args": ["-l", "-c", "sleep 1"]}})
    received = b""

    with httpx.stream(
        "POST",
        f"{proxy.url}/process.Process/Start",
        content=iter([body]),
        headers={"content-type": "application/connect+json", "e2b-sandbox-id": "sbx1"},
    ) as response:
        chunks = response.iter_raw()
        while len(received) < len(FIRST):
            received += next(chunks)
        upstream_still_open = not envd.stream_closed.is_set()
        envd.release.set()
        received += b"".join(chunks)

    assert upstream_still_open
    assert received == FIRST + REST
    assert envd.seen[0]["body"] == body
    assert envd.seen[0]["headers"]["transfer-encoding"] == "chunked"


def test_client_disconnect_closes_the_upstream_stream(proxy: WireProxy, envd: Upstream) -> None:
    with httpx.stream(
        "POST", f"{proxy.url}/process.Process/Start", content=b"{}", headers={"e2b-sandbox-id": "sbx1"}
    ) as response:
        first = next(response.iter_raw())

    assert first == FIRST
    assert envd.stream_closed.wait(5)
    assert not envd.release.is_set()
    proxy.stop()  # the exchange's line is written once the proxy has seen the disconnect
    [line] = log_lines(proxy)
    assert (line["status"], line["error"]) == (200, f"client disconnected after {len(FIRST)} response bytes")


def test_chunked_upload_is_streamed_and_counted(proxy: WireProxy, envd: Upstream) -> None:
    chunks = [bytes([n]) * 65536 for n in range(3)]

    response = httpx.post(
        f"{proxy.url}/files?path=/home/user/big.bin", content=iter(chunks), headers={"e2b-sandbox-id": "s"}
    )

    assert response.status_code == 200
    assert envd.seen[0]["size"] == 3 * 65536
    assert envd.seen[0]["headers"]["transfer-encoding"] == "chunked"
    [line] = log_lines(proxy)
    assert (line["request_bytes"], line["request_headers"]["transfer-encoding"]) == (3 * 65536, "chunked")


def test_query_secrets_are_redacted_in_the_logged_url(proxy: WireProxy) -> None:
    httpx.get(f"{proxy.url}/files?path=%2Fa&signature=v1_abcdefgh&signature_expiration=9&username=user")

    [line] = log_lines(proxy)
    assert line["url"].endswith("/files?path=%2Fa&signature=[REDACTED]&signature_expiration=9&username=user")


def test_access_tokens_from_create_are_learnt_and_never_logged(proxy: WireProxy) -> None:
    created = httpx.post(f"{proxy.url}/v2/sandboxes", json={"templateID": "base"}, headers={"X-API-KEY": API_KEY})
    httpx.get(
        f"{proxy.url}/health",
        headers={"x-access-token": ENVD_TOKEN, "x-debug": f"token={ENVD_TOKEN}", "x-other": TRAFFIC_TOKEN},
    )

    assert created.status_code == 201
    assert created.json()["envdAccessToken"] == ENVD_TOKEN
    assert proxy.redactor.redact_text(ENVD_TOKEN) == "[REDACTED]"
    log = proxy.log_path.read_text()
    assert ENVD_TOKEN not in log
    assert TRAFFIC_TOKEN not in log
    assert API_KEY not in log
    assert log_lines(proxy)[1]["request_headers"]["x-debug"] == "token=[REDACTED]"


def test_a_traffic_token_header_is_never_logged_even_when_not_learnt(proxy: WireProxy) -> None:
    httpx.get(f"{proxy.url}/health", headers={"e2b-traffic-access-token": "never-seen-before-token"})

    [line] = log_lines(proxy)
    assert line["request_headers"]["e2b-traffic-access-token"] == "[REDACTED]"
    assert "never-seen-before-token" not in proxy.log_path.read_text()


def test_unreachable_upstream_gives_a_502_json_error_and_a_logged_line(tmp_path: Path) -> None:
    upstream = f"http://127.0.0.1:{closed_port()}"

    with WireProxy(upstream, upstream, tmp_path / "w.jsonl", "r", Redactor()) as proxy:
        response = httpx.get(f"{proxy.url}/v2/sandboxes?limit=1")
        [line] = log_lines(proxy)

    prefix = f"e2b-bench wire proxy: upstream {upstream}/v2/sandboxes?limit=1 unreachable: "
    assert response.status_code == 502
    assert response.json()["code"] == 502
    assert response.json()["message"].startswith(prefix)
    assert "refused" in response.json()["message"].lower()
    assert line["status"] is None
    assert line["error"] == response.json()["message"]


@pytest.fixture
def body_proxy(tmp_path: Path, api: Upstream, envd: Upstream) -> Iterator[WireProxy]:
    with (
        serving(api.app) as api_url,
        serving(envd.app) as envd_url,
        WireProxy(api_url, envd_url, tmp_path / "wire" / "b.jsonl", "r", Redactor([API_KEY]), body_bytes=4096) as p,
    ):
        yield p


def test_bodies_are_not_logged_unless_asked(proxy: WireProxy) -> None:
    httpx.post(f"{proxy.url}/v2/sandboxes", json={"templateID": "base"})

    [line] = log_lines(proxy)
    assert ("request_body" in line, "response_body" in line) == (False, False)


def test_json_bodies_are_logged_decoded_and_redacted(body_proxy: WireProxy) -> None:
    sent = {"templateID": "base", "envVars": {"OPENAI_API_KEY": "sk-proj-abcdefgh"}, "note": API_KEY}

    httpx.post(f"{body_proxy.url}/v2/sandboxes", json=sent, headers={"X-API-KEY": API_KEY})

    [line] = log_lines(body_proxy)
    assert json.loads(line["request_body"]) == {
        "templateID": "base",
        "envVars": {"OPENAI_API_KEY": "[REDACTED]"},
        "note": "[REDACTED]",
    }
    assert json.loads(line["response_body"]) == {
        "sandboxID": "sbx1",
        "templateID": "base",
        "clientID": "c",
        "envdVersion": "0.5.7",
        "envdAccessToken": "[REDACTED]",
        "trafficAccessToken": "[REDACTED]",
    }
    assert ENVD_TOKEN not in body_proxy.log_path.read_text()


def test_the_command_a_client_started_is_in_the_log(body_proxy: WireProxy, envd: Upstream) -> None:
    envd.release.set()
    start = {"process": {"cmd": "/bin/bash", "args": ["-l", "-c", "uname -a"]}}

    httpx.post(
        f"{body_proxy.url}/process.Process/Start",
        content=envelope(0, start),
        headers={"content-type": "application/connect+json", "e2b-sandbox-id": "sbx1"},
    )

    [line] = log_lines(body_proxy)
    assert line["request_body"] == json.dumps(start)
    assert line["response_body"].splitlines() == [
        '{"event": {"start": {"pid": 42}}}',
        '{"event": {"end": {"exited": true, "status": "exit status 0"}}}',
        "end: {}",
    ]


def test_a_long_body_is_cut_before_its_last_partial_token(tmp_path: Path, api: Upstream) -> None:
    body = json.dumps({"command": "x" * 200})  # 215 bytes; the first 64 end inside the x's

    with serving(api.app) as url, WireProxy(url, url, tmp_path / "w.jsonl", "r", Redactor(), body_bytes=64) as proxy:
        httpx.post(f"{proxy.url}/v2/sandboxes", content=body, headers={"content-type": "application/json"})
        [line] = log_lines(proxy)

    assert line["request_body"] == '{"command": "…[151 more bytes]'


def test_binary_bodies_are_logged_as_their_size_only(body_proxy: WireProxy) -> None:
    httpx.post(
        f"{body_proxy.url}/files?path=/f",
        content=b"\x00\x01" * 1000,
        headers={"e2b-sandbox-id": "s", "content-type": "application/octet-stream"},
    )

    [line] = log_lines(body_proxy)
    assert line["request_body"] == "<2000 bytes of application/octet-stream>"


@pytest.mark.parametrize(("value", "expected"), [("512", 512), ("", 0), ("lots", 0), ("-1", 0)])
def test_body_bytes_come_from_the_environment(value: str, expected: int) -> None:
    assert body_bytes_from_env({WIRE_BODIES_ENV: value}) == expected


def test_the_wire_log_is_readable_by_group_and_others(proxy: WireProxy) -> None:
    httpx.get(f"{proxy.url}/health")

    assert stat.S_IMODE(proxy.log_path.stat().st_mode) == 0o644


CANARY = "canary-secret-0f1e2d3c4b5a69788796a5b4c3d2e1f0"


def stream_app(frames: list[bytes]) -> Starlette:
    async def start(request: Request) -> Response:
        await request.body()

        async def events() -> AsyncIterator[bytes]:
            for frame in frames:
                yield frame[:3]  # split across chunks: the frame reader must join them
                yield frame[3:]

        return StreamingResponse(events(), media_type="application/connect+json")

    return Starlette(routes=[Route("/process.Process/Start", start, methods=["POST"])])


def test_every_exchange_carries_a_bounded_redacted_excerpt_of_its_bodies(tmp_path: Path, api: Upstream) -> None:
    sent = {"note": CANARY, "padding": "p " * 1000}

    with (
        serving(api.app) as url,
        WireProxy(url, url, tmp_path / "w.jsonl", "r", Redactor([CANARY]), suite="probes") as proxy,
    ):
        httpx.post(f"{proxy.url}/v2/sandboxes", json=sent)
        [line] = log_lines(proxy)

    assert line["suite"] == "probes"
    assert line["request_excerpt"].startswith('{"note":"[REDACTED]","padding":"p p p')
    assert line["request_excerpt"].endswith(f"…[{line['request_bytes'] - 512} more bytes]")
    assert json.loads(line["response_excerpt"])["envdAccessToken"] == "[REDACTED]"
    assert "request_body" not in line  # whole bodies only with --wire-bodies
    assert CANARY not in (tmp_path / "w.jsonl").read_text()


def test_a_stream_keeps_its_first_and_last_frames_their_count_and_no_secret(tmp_path: Path) -> None:
    data = [envelope(0, {"event": {"data": {"n": n}}}) for n in range(18)]
    long = envelope(0, {"event": {"data": {"stdout": "x " * 500}}})
    secret = envelope(0, {"event": {"data": {"stdout": f"token={CANARY}"}}})
    frames = [*data, long, secret, envelope(2, {})]

    with (
        serving(stream_app(frames)) as url,
        WireProxy(url, url, tmp_path / "w.jsonl", "r", Redactor([CANARY])) as proxy,
    ):
        httpx.post(
            f"{proxy.url}/process.Process/Start",
            content=envelope(0, {"process": {"cmd": "/bin/true"}}),
            headers={"content-type": "application/connect+json", "e2b-sandbox-id": "s"},
        )
        [line] = log_lines(proxy)

    assert line["frame_count"] == 21
    shown = line["frames"]
    assert shown[:4] == [json.dumps({"event": {"data": {"n": n}}}) for n in range(4)]
    assert shown[4] == "… 13 more frame(s)"
    assert shown[5] == json.dumps({"event": {"data": {"n": 17}}})
    assert shown[6].startswith('{"event": {"data": {"stdout": "x x x') and shown[6].endswith("more bytes]")
    assert len(shown[6]) < 300
    assert shown[7:] == [json.dumps({"event": {"data": {"stdout": "token=[REDACTED]"}}}), "end: {}"]
    assert "response_excerpt" not in line
    assert CANARY not in (tmp_path / "w.jsonl").read_text()


def test_an_excerpt_with_unicode_line_breaks_stays_one_line(tmp_path: Path) -> None:
    async def text(request: Request) -> Response:
        return Response("before\u2028middle\x85after\u2029end", media_type="text/plain")

    app = Starlette(routes=[Route("/v2/sandboxes", text, methods=["GET"])])
    with serving(app) as url, WireProxy(url, url, tmp_path / "w.jsonl", "r", Redactor()) as proxy:
        httpx.get(f"{proxy.url}/v2/sandboxes")
        written = proxy.log_path.read_text()

    [line] = written.splitlines()  # what every reader of the log does
    assert json.loads(line)["response_excerpt"] == "before\u2028middle\x85after\u2029end"


def test_the_proxy_keeps_an_idle_connection_longer_than_the_sdks_pool_does() -> None:
    from e2b.api import pool_idle_timeout  # the SDK's pooled-connection expiry (E2B_KEEPALIVE_EXPIRY)

    assert pool_idle_timeout < KEEPALIVE_S


def test_a_connection_idle_past_uvicorns_default_keep_alive_serves_its_next_request(proxy: WireProxy) -> None:
    # The proxy closed connections idle for 5 s (uvicorn's default) that the SDK's pool still held: under load
    # a pooled connection's next request met the close and failed with `Connection reset by peer`.
    assert proxy.port is not None
    first, second = two_requests_idle_between(proxy.port, b"GET /v2/sandboxes HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")

    assert first.startswith(b"HTTP/1.1 200 ") and first.endswith(b"\r\n\r\n[]")
    assert second.startswith(b"HTTP/1.1 200 ") and second.endswith(b"\r\n\r\n[]")
