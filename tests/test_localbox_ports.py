"""Sandbox ports (#13 item 14): requests for port N of a sandbox reach a server listening on N inside it.

Routed as E2B's sandbox proxy routes them: `E2b-Sandbox-Id` + `E2b-Sandbox-Port`, or the host `get_host` gives.
"""

from __future__ import annotations

import asyncio
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
