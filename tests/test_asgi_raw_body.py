"""A request body taken raw (`bench.asgi.RawBody`): read off the socket into buffers the app owns, every byte
in order, and the connection handed back to HTTP for the next request whatever the app did with the body.

A real uvicorn server with the project's protocol on loopback, on both event loops it may run on (uvloop,
and asyncio's own where uvloop is missing), and plain sockets as clients, so every framing is the test's.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import uvicorn

from bench import asgi
from bench.remote.slowness import scaled

MIB = 1 << 20
SEEN: list[dict[str, Any]] = []  # what the app saw of each POST, in order
THREADS = ThreadPoolExecutor(max_workers=2, thread_name_prefix="raw-body-test")


async def app(scope: dict, receive: Any, send: Any) -> None:
    """POST: the body's digest and how it was read (`?early` answers before reading, `?one` reads one piece
    and drops the rest, `?first` answers the first piece's size at once); GET /seen: what the last POST saw."""
    if scope["type"] != "http":
        return
    if scope["method"] == "GET":
        await answer(send, SEEN[-1] if SEEN else {})
        return
    query = scope["query_string"].decode()
    if query == "early":
        SEEN.append({"early": True})
        await answer(send, SEEN[-1])
        return
    body = scope["extensions"][asgi.BODY_EXTENSION]()
    if query.startswith("thread") and body is not None:
        await in_thread(body, query, send)
        return
    digest, size, pieces, seen = hashlib.sha256(), 0, 0, {"raw": body is not None}
    try:
        if body is None:
            while True:
                message = await receive()
                digest.update(message.get("body", b""))
                size += len(message.get("body", b""))
                if not message.get("more_body"):
                    break
        else:
            async for piece in body:
                assert isinstance(piece, bytearray)
                digest.update(piece)
                size, pieces = size + len(piece), pieces + 1
                if query == "first":
                    await answer(send, {"first": len(piece)})
                    return
                if query == "one":
                    body.drop()
                    break
    except asgi.ClientGone as exc:
        SEEN.append({**seen, "gone": str(exc)})
        return
    SEEN.append({**seen, "sha256": digest.hexdigest(), "size": size, "pieces": pieces})
    await answer(send, SEEN[-1])


async def in_thread(body: asgi.RawBody, query: str, send: Any) -> None:
    """The body taken by `rest_in_thread` (`?thread`); `?thread-fail` makes `take` raise once 1 MiB is in."""
    digest, size, threads, kept = hashlib.sha256(), 0, set(), []
    loop_thread = threading.get_ident()

    def take(pieces: list[bytes | bytearray]) -> None:
        nonlocal size
        threads.add(threading.get_ident())
        kept.extend(pieces)  # kept past the call: none is read over later
        size += sum(map(len, pieces))
        if query == "thread-fail" and size >= MIB:
            raise ValueError("the app refused the body")

    seen: dict[str, Any] = {"raw": True, "thread": True}
    try:
        await body.rest_in_thread(take, THREADS)
    except ValueError as exc:
        seen["refused"] = str(exc)
    except asgi.ClientGone as exc:
        SEEN.append({**seen, "gone": str(exc)})
        return
    for piece in kept:
        digest.update(piece)
    seen.update(sha256=digest.hexdigest(), size=size, off_loop=loop_thread not in threads)
    SEEN.append(seen)
    await answer(send, seen)


async def answer(send: Any, document: dict) -> None:
    content = json.dumps(document).encode()
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"%d" % len(content))]})
    await send({"type": "http.response.body", "body": content})


@pytest.fixture(scope="module", params=["uvloop", "asyncio"])
def port(request: pytest.FixtureRequest) -> Iterator[int]:
    config = uvicorn.Config(app, http=asgi.ResettableHttp, loop=request.param, lifespan="off", log_level="warning")
    server = uvicorn.Server(config)
    sockets = [asgi.bind("127.0.0.1", 0)]
    with asgi.in_thread(server, sockets, f"raw-body-{request.param}"):
        yield sockets[0].getsockname()[1]


class Client:
    """One HTTP/1.1 connection, requests written by hand."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.buffer = b""

    def request(self, method: str, target: str, body: bytes = b"", headers: str = "") -> None:
        self.sock.sendall(
            f"{method} {target} HTTP/1.1\r\nHost: t\r\nContent-Length: {len(body)}\r\n{headers}\r\n".encode()
        )
        self.sock.sendall(body)

    def response(self) -> tuple[int, dict]:
        while b"\r\n\r\n" not in self.buffer:
            self.buffer += self.recv()
        head, self.buffer = self.buffer.split(b"\r\n\r\n", 1)
        status = int(head.split()[1])
        length = int(
            next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length"))
        )
        while len(self.buffer) < length:
            self.buffer += self.recv()
        content, self.buffer = self.buffer[:length], self.buffer[length:]
        return status, json.loads(content)

    def recv(self) -> bytes:
        data = self.sock.recv(65536)
        assert data, "the server closed the connection"
        return data

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def client(port: int) -> Iterator[Client]:
    connection = Client(port)
    yield connection
    connection.close()


def seen(client: Client) -> dict:
    client.request("GET", "/seen")
    return client.response()[1]


@pytest.mark.parametrize("size", [5 * MIB + 3, 2 * MIB, MIB + 1, 300_000])
def test_a_body_taken_raw_arrives_whole_in_order_in_pieces_of_a_mebibyte(client: Client, size: int) -> None:
    body = os.urandom(size)

    client.request("POST", "/up", body)
    status, document = client.response()

    assert status == 200
    assert document["raw"] is True
    assert (document["size"], document["sha256"]) == (size, hashlib.sha256(body).hexdigest())
    # what uvicorn parsed before the switch is one piece (under 1 MiB), then the head, then pieces of at most 1 MiB
    assert document["pieces"] <= size // MIB + 3


def test_the_start_of_a_body_reaches_the_app_before_a_mebibyte_of_it_has_arrived(client: Client) -> None:
    # a multipart body names its file in its first bytes: the app can open the file while the rest arrives.
    # The body is sent once the server asks for it (100 Continue), so none of it came with the head.
    client.sock.sendall(
        b"POST /up?first HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\nExpect: 100-continue\r\n\r\n" % (8 * MIB)
    )
    client.sock.settimeout(scaled(10))  # the old 1 MiB first piece never filled: the answer never came
    interim = b""
    while not interim.endswith(b"\r\n\r\n"):
        interim += client.recv()
    client.sock.sendall(os.urandom(100_000))  # and no more until the answer

    status, document = client.response()

    assert status == 200
    assert 0 < document["first"] <= 100_000  # a piece of what was sent: no mebibyte waited for


def test_the_connection_serves_the_next_requests_after_a_raw_body(client: Client) -> None:
    bodies = [os.urandom(3 * MIB), os.urandom(MIB + 5)]

    answers = []
    for body in bodies:
        client.request("POST", "/up", body)
        answers.append(client.response()[1])

    assert [a["sha256"] for a in answers] == [hashlib.sha256(b).hexdigest() for b in bodies]
    assert seen(client) == answers[-1]


def test_a_body_the_app_stops_reading_is_dropped_and_the_connection_still_serves(client: Client) -> None:
    body = os.urandom(6 * MIB)

    client.request("POST", "/up?one", body)
    status, document = client.response()
    client.request("POST", "/up", b"after")
    after = client.response()[1]

    assert status == 200 and document["raw"] is True and document["pieces"] == 1
    assert after["sha256"] == hashlib.sha256(b"after").hexdigest()


def test_a_body_answered_before_it_is_read_is_dropped_and_the_connection_still_serves(client: Client) -> None:
    client.request("POST", "/up?early", os.urandom(6 * MIB))
    status, document = client.response()
    client.request("POST", "/up", b"x" * (2 * MIB))
    after = client.response()[1]

    assert (status, document) == (200, {"early": True})
    assert after["sha256"] == hashlib.sha256(b"x" * (2 * MIB)).hexdigest()


def test_a_client_waiting_for_100_continue_is_told_to_send_its_body(client: Client) -> None:
    body = os.urandom(2 * MIB)

    client.sock.sendall(
        f"POST /up HTTP/1.1\r\nHost: t\r\nContent-Length: {len(body)}\r\nExpect: 100-continue\r\n\r\n".encode()
    )
    interim = b""
    while not interim.endswith(b"\r\n\r\n"):
        interim += client.recv()
    client.sock.sendall(body)
    document = client.response()[1]

    assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
    assert document["sha256"] == hashlib.sha256(body).hexdigest()


def test_a_chunked_body_is_not_taken_raw_and_arrives_whole(client: Client) -> None:
    pieces = [os.urandom(700_000), os.urandom(MIB)]
    framed = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"

    client.sock.sendall(b"POST /up HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n" + framed)
    document = client.response()[1]

    assert document["raw"] is False
    assert document["sha256"] == hashlib.sha256(b"".join(pieces)).hexdigest()


@pytest.mark.parametrize("path", ["/up", "/up?thread"])
def test_a_client_gone_mid_body_ends_the_raw_body_with_client_gone(port: int, path: str) -> None:
    SEEN.clear()
    leaving = Client(port)
    leaving.sock.sendall(b"POST %s HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n" % (path.encode(), 8 * MIB))
    leaving.sock.sendall(os.urandom(3 * MIB))
    leaving.close()
    watcher = Client(port)

    while not (document := seen(watcher)).get("gone"):  # the server (or the body's thread) sees the close on reading
        time.sleep(0.01)
    watcher.close()

    assert (document["raw"], document.get("thread", False)) == (True, path.endswith("?thread"))
    assert document["gone"].endswith("bytes of the body still to come")


@pytest.mark.parametrize("size", [5 * MIB + 3, MIB + 1, 300_000])
def test_a_body_read_in_a_thread_arrives_whole_in_order_off_the_event_loop(client: Client, size: int) -> None:
    data = os.urandom(size)

    client.request("POST", "/up?thread", data)
    status, document = client.response()

    assert status == 200
    assert document == {
        "raw": True,
        "thread": True,
        "sha256": hashlib.sha256(data).hexdigest(),
        "size": size,
        "off_loop": True,
    }


def test_a_body_read_in_a_thread_arrives_whole_from_a_client_that_pauses(client: Client) -> None:
    data = os.urandom(3 * MIB)
    client.sock.sendall(b"POST /up?thread HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n" % len(data))
    for start in range(0, len(data), 700_001):
        client.sock.sendall(data[start : start + 700_001])
        time.sleep(0.05)  # the thread waits on the socket between sends: each wait must end on data

    status, document = client.response()

    assert (status, document["sha256"], document["size"]) == (200, hashlib.sha256(data).hexdigest(), len(data))


def test_after_a_body_read_in_a_thread_the_connection_serves_the_next_requests(client: Client) -> None:
    first, second = os.urandom(2 * MIB), os.urandom(1000)
    client.request("POST", "/up?thread", first)
    client.request("POST", "/up", second)  # sent at once: its head may arrive with the first body's end

    answers = [client.response(), client.response()]

    assert [document["sha256"] for _, document in answers] == [
        hashlib.sha256(first).hexdigest(),
        hashlib.sha256(second).hexdigest(),
    ]


def test_a_body_a_thread_refuses_midway_is_dropped_and_the_connection_still_serves(client: Client) -> None:
    data = os.urandom(6 * MIB)
    client.request("POST", "/up?thread-fail", data)

    status, document = client.response()
    client.request("POST", "/up", b"next")

    assert (status, document["refused"]) == (200, "the app refused the body")
    assert MIB <= document["size"] < len(data)
    assert client.response()[1]["sha256"] == hashlib.sha256(b"next").hexdigest()


def test_a_spare_piece_is_given_again_only_once_nothing_holds_it() -> None:
    async def pieces() -> tuple[bool, bool, bool]:
        held = asgi.spare_buffer(MIB)
        other = asgi.spare_buffer(MIB)
        viewed = memoryview(other)[10:20]
        held_id, other_id = id(held), id(other)
        del held, other
        again = asgi.spare_buffer(MIB)
        return id(again) == held_id, id(asgi.spare_buffer(MIB)) != other_id, bytes(viewed) == bytes(10)

    reused, not_while_viewed, view_intact = asyncio.run(pieces())

    assert reused and not_while_viewed and view_intact
