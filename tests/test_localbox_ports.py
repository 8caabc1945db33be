"""Sandbox ports (#13 item 14): requests for port N of a sandbox reach a server listening on N inside it.

Routed as E2B's sandbox proxy routes them: `E2b-Sandbox-Id` + `E2b-Sandbox-Port`, or the host `get_host` gives.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from e2b import AsyncSandbox, Sandbox
from websockets.sync.client import connect as ws_connect

from bench.localbox.server import LocalEndpoint

SERVER = (Path(__file__).parent / "fixtures" / "port_server.py").read_text()
PORT = 8123


@pytest.fixture(scope="module")
def served(endpoint: LocalEndpoint) -> Iterator[Sandbox]:
    """A sandbox with the fixture server on PORT of its loopback."""
    sbx = Sandbox.create(timeout=300)
    try:
        sbx.files.write("/home/user/port_server.py", SERVER)
        sbx.commands.run(f"python3 /home/user/port_server.py {PORT} >/tmp/server.log 2>&1 &")
        sbx.commands.run(f"for i in $(seq 100); do curl -s -o /dev/null localhost:{PORT} && exit 0; sleep 0.1; done")
        yield sbx
    finally:
        sbx.kill()


def routed(sbx: Sandbox, port: int = PORT) -> dict[str, str]:
    return {"E2b-Sandbox-Id": sbx.sandbox_id, "E2b-Sandbox-Port": str(port)}


def test_a_get_reaches_the_server_in_the_sandbox_by_headers_and_by_host(
    served: Sandbox, endpoint: LocalEndpoint
) -> None:
    by_headers = httpx.get(f"{endpoint.sandbox_url}/a?b=c", headers={**routed(served), "X-Probe": "p"})
    by_host = httpx.get(f"{endpoint.sandbox_url}/h", headers={"Host": served.get_host(PORT)})
    in_sandbox = served.commands.run(f"curl -s localhost:{PORT}/a?b=c -H 'X-Probe: p'").stdout

    assert (by_headers.status_code, by_headers.text) == (200, "line 0 /a?b=c p\nline 1 /a?b=c p\nline 2 /a?b=c p\n")
    assert by_headers.text == in_sandbox
    assert by_host.text.startswith("line 0 /h ")
    assert served.get_host(PORT).startswith(f"{PORT}-{served.sandbox_id}.")


def test_request_bodies_stream_to_the_server_fixed_and_chunked(served: Sandbox, endpoint: LocalEndpoint) -> None:
    def chunks() -> Iterator[bytes]:
        yield b"abc"
        yield b"def"

    fixed = httpx.post(endpoint.sandbox_url, headers=routed(served), content=b"x" * 300_000 + b"end")
    chunked = httpx.post(endpoint.sandbox_url, headers=routed(served), content=chunks())

    assert (fixed.status_code, fixed.content) == (201, b"dne" + b"x" * 300_000)
    assert (chunked.status_code, chunked.content) == (201, b"fedcba")


def test_a_response_streams_as_the_server_writes_it(served: Sandbox, endpoint: LocalEndpoint) -> None:
    with httpx.stream("GET", f"{endpoint.sandbox_url}/stream", headers=routed(served)) as answer:
        chunks = answer.iter_bytes()
        first = next(chunks)  # arrives while the server still waits for /tmp/go
        served.commands.run("touch /tmp/go")
        rest = b"".join(chunks)

    assert (first, rest) == (b"first\n", b"second\n")


def test_a_websocket_is_relayed_both_ways(served: Sandbox, endpoint: LocalEndpoint) -> None:
    url = endpoint.sandbox_url.replace("http://", "ws://") + "/ws"
    with ws_connect(url, additional_headers=routed(served)) as ws:
        ws.send("hello")
        text = ws.recv(timeout=10)
        ws.send(b"\x00\x01")
        binary = ws.recv(timeout=10)

    assert (text, binary) == ("echo:hello", b"echo:\x00\x01")


def test_a_closed_port_and_an_unknown_sandbox_answer_as_e2bs_proxy(served: Sandbox, endpoint: LocalEndpoint) -> None:
    closed = httpx.get(endpoint.sandbox_url, headers=routed(served, 8124))
    unknown = httpx.get(endpoint.sandbox_url, headers={"E2b-Sandbox-Id": "nope", "E2b-Sandbox-Port": "8123"})

    assert closed.status_code == 502 and "port 8124 is not open" in closed.json()["message"]
    assert unknown.status_code == 502 and unknown.json()["message"] == "The sandbox nope was not found"


def test_the_async_sdk_gives_the_same_host(served: Sandbox, endpoint: LocalEndpoint) -> None:
    async def host() -> str:
        return (await AsyncSandbox.connect(served.sandbox_id)).get_host(PORT)

    found = asyncio.run(host())
    answer = httpx.get(f"{endpoint.sandbox_url}/async", headers={"Host": found})

    assert found == served.get_host(PORT) and answer.text.startswith("line 0 /async ")


# --- traffic access tokens and credentials (#25 item 4) ---------------------------------------------------

HEADER_LOG = """
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer

class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        with open("/tmp/seen-headers", "a") as log:
            log.write("".join(f"{name.lower()}\\n" for name in self.headers) + "--\\n")
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

HTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
"""
CREDENTIALS = ("x-api-key", "authorization", "x-access-token", "e2b-traffic-access-token")


def serve_header_log(sbx: Sandbox, port: int = PORT) -> None:
    sbx.files.write("/home/user/header_log.py", HEADER_LOG)
    sbx.commands.run(f"python3 /home/user/header_log.py {port} >/dev/null 2>&1 &")
    sbx.commands.run(f"for i in $(seq 100); do curl -s -o /dev/null localhost:{port} && exit 0; sleep 0.1; done")
    sbx.commands.run("rm -f /tmp/seen-headers")


def seen_headers(sbx: Sandbox) -> list[set[str]]:
    log = sbx.commands.run("cat /tmp/seen-headers").stdout
    return [set(block.split()) for block in log.split("--\n") if block.strip()]


@pytest.fixture
def secured(endpoint: LocalEndpoint) -> Iterator[Sandbox]:
    sbx = Sandbox.create(timeout=120, network={"allow_public_traffic": False})
    try:
        serve_header_log(sbx)
        yield sbx
    finally:
        sbx.kill()


def test_a_sandbox_without_public_traffic_is_reached_only_with_its_traffic_token(
    secured: Sandbox, endpoint: LocalEndpoint
) -> None:
    token = secured.traffic_access_token
    assert token
    missing = httpx.get(endpoint.sandbox_url, headers=routed(secured))
    wrong = httpx.get(endpoint.sandbox_url, headers={**routed(secured), "e2b-traffic-access-token": token[:-2] + "xx"})
    by_host = httpx.get(endpoint.sandbox_url, headers={"Host": secured.get_host(PORT)})
    passed = httpx.get(endpoint.sandbox_url, headers={**routed(secured), "e2b-traffic-access-token": token})
    info = httpx.get(f"{endpoint.api_url}/sandboxes/{secured.sandbox_id}", headers={"X-API-Key": endpoint.api_key})
    reconnected = Sandbox.connect(secured.sandbox_id).traffic_access_token

    assert (missing.status_code, missing.json()) == (
        403,
        {
            "sandboxId": secured.sandbox_id,
            "message": (
                "Sandbox is secured with traffic access token. Token header 'e2b-traffic-access-token' is missing"
            ),
            "code": 403,
        },
    )
    assert (wrong.status_code, wrong.json()["message"]) == (
        403,
        "Sandbox is secured with traffic access token. Provided token is invalid.",
    )
    assert by_host.status_code == 403
    assert (passed.status_code, passed.text) == (200, "ok")
    assert len(seen_headers(secured)) == 1  # only the request with the token reached the sandbox
    assert info.json()["network"] == {"allowPublicTraffic": False}
    assert reconnected == token
    assert secured.commands.run("echo envd").stdout == "envd\n"  # envd's port keeps its own token rules


def test_a_public_sandbox_has_no_traffic_token_and_answers_anyone(served: Sandbox, endpoint: LocalEndpoint) -> None:
    answer = httpx.get(endpoint.sandbox_url, headers=routed(served))

    assert served.traffic_access_token is None
    assert answer.status_code == 200


def test_the_endpoints_credentials_never_reach_a_sandbox_port(secured: Sandbox, endpoint: LocalEndpoint) -> None:
    url = endpoint.sandbox_url.replace("http://", "ws://")
    sent = {
        "X-API-Key": endpoint.api_key,
        "Authorization": f"Bearer {endpoint.api_key}",
        "X-Access-Token": "envd-token-of-the-caller",
        "e2b-traffic-access-token": secured.traffic_access_token or "",
        "X-Probe": "kept",
    }

    answer = httpx.get(endpoint.sandbox_url, headers={**routed(secured), **sent})
    with contextlib.suppress(Exception):  # the logging server speaks no WebSocket: only its log matters
        ws_connect(url, additional_headers={**routed(secured), **sent}, open_timeout=10).close()
    seen = seen_headers(secured)

    assert answer.status_code == 200
    assert len(seen) == 2 and "x-probe" in seen[0]  # the plain request, then the WebSocket upgrade
    assert [headers & set(CREDENTIALS) for headers in seen] == [set(), set()]


def test_a_fork_of_a_secured_sandbox_gets_a_traffic_token_of_its_own(secured: Sandbox) -> None:
    forks = [f for f in secured.fork(count=1, timeout=60) if isinstance(f, Sandbox)]
    try:
        token = forks[0].traffic_access_token
    finally:
        for fork in forks:
            fork.kill()

    assert token and token != secured.traffic_access_token
