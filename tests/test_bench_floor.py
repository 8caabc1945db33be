"""The floor server of the transfer measures: it answers an SDK's files call as the endpoint does, moving bytes only."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from urllib.parse import urlsplit

import httpx
import pytest

from bench.floor import serving

SIZE = 3 * (1 << 20) + 7


@pytest.fixture(scope="module")
def floor_url() -> Iterator[str]:
    with serving(SIZE) as url:
        yield url


def received(floor_url: str) -> int:
    return int(httpx.get(f"{floor_url}/floor/received").json()["bytes"])


def test_an_sdk_write_to_the_floor_is_answered_as_the_endpoint_answers_it(sandbox, floor_url: str) -> None:
    from e2b import Sandbox

    data = bytes(range(256)) * 4096
    at_floor = Sandbox.connect(sandbox.sandbox_id, sandbox_url=floor_url)

    floor_info = at_floor.files.write("/tmp/floor/x.bin", data)
    endpoint_info = sandbox.files.write("/tmp/floor/x.bin", data)

    assert (floor_info.name, floor_info.path, floor_info.type) == (
        endpoint_info.name,
        endpoint_info.path,
        endpoint_info.type,
    )
    assert len(data) < received(floor_url) < len(data) + 1024  # the whole multipart body, discarded


def test_an_sdk_read_from_the_floor_gets_the_size_in_zero_bytes(sandbox, floor_url: str) -> None:
    from e2b import Sandbox

    at_floor = Sandbox.connect(sandbox.sandbox_id, sandbox_url=floor_url)

    assert bytes(at_floor.files.read("/tmp/anything.bin", format="bytes")) == bytes(SIZE)


def test_a_chunked_upload_is_read_to_its_end(floor_url: str) -> None:
    pieces = [b"a" * 70_000, b"", b"b" * 5, b"c" * (1 << 20)]

    answer = httpx.post(f"{floor_url}/files", params={"path": "/x/y.bin"}, content=iter(pieces))

    assert answer.request.headers["transfer-encoding"] == "chunked"
    assert (answer.status_code, answer.json()) == (200, [{"name": "y.bin", "type": "file", "path": "/x/y.bin"}])
    assert received(floor_url) == sum(map(len, pieces))


def test_a_client_that_waits_for_100_continue_gets_it_before_sending(floor_url: str) -> None:
    address = urlsplit(floor_url)
    with socket.create_connection((address.hostname, address.port), timeout=10) as connection:
        connection.sendall(
            b"POST /files?path=/z HTTP/1.1\r\nHost: floor\r\nContent-Length: 3\r\nExpect: 100-continue\r\n\r\n"
        )
        assert connection.recv(100) == b"HTTP/1.1 100 Continue\r\n\r\n"
        connection.sendall(b"abc")
        answer = connection.recv(1000).split(b"\r\n\r\n", 1)

    assert answer[0].startswith(b"HTTP/1.1 200 OK") and json.loads(answer[1]) == [
        {"name": "z", "type": "file", "path": "/z"}
    ]
    assert received(floor_url) == 3


def test_the_floor_server_is_gone_after_its_block() -> None:
    with serving(10) as url:
        assert httpx.get(f"{url}/files", params={"path": "/a"}).content == bytes(10)

    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{url}/files", params={"path": "/a"})
