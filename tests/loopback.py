"""Real HTTP servers on loopback for tests: an ASGI app under uvicorn in a background thread."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn

from bench.remote.slowness import scaled


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextmanager
def serving(app: Any, **options: Any) -> Iterator[str]:
    """Serve `app` on a free loopback port (over TLS given uvicorn's `ssl_certfile` and `ssl_keyfile`); yields its
    base URL."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(128)
    port = listener.getsockname()[1]
    config = uvicorn.Config(
        app, log_level="critical", lifespan="off", ws="none", timeout_graceful_shutdown=1, **options
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=lambda: asyncio.run(server.serve(sockets=[listener])), daemon=True)
    thread.start()
    deadline = time.monotonic() + scaled(10)
    while not server.started:
        assert time.monotonic() < deadline, "test server did not start"
        time.sleep(0.005)
    try:
        yield f"{'https' if 'ssl_certfile' in options else 'http'}://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=5)


@contextmanager
def raw_tcp(reply: bytes) -> Iterator[str]:
    """A TCP server that answers every connection with `reply` and closes; yields its base URL."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    listener.settimeout(0.2)
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            try:
                connection, _ = listener.accept()
            except TimeoutError:
                continue
            with connection:
                connection.settimeout(2)
                try:
                    connection.recv(65536)
                    connection.sendall(reply)
                except OSError:
                    pass

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(timeout=2)
        listener.close()


UVICORN_DEFAULT_KEEP_ALIVE_S = 5  # what a server closes an idle connection after unless told otherwise


def two_requests_idle_between(port: int, request: bytes) -> tuple[bytes, bytes]:
    """Two whole responses to `request` on one connection to loopback `port`, idle past uvicorn's default
    keep-alive between them, as an SDK's pooled connection is (b"" or a part: the server closed it)."""
    with socket.create_connection(("127.0.0.1", port)) as conn:
        conn.settimeout(60)
        conn.sendall(request)
        first = whole_response(conn)
        time.sleep(UVICORN_DEFAULT_KEEP_ALIVE_S + 1)
        conn.sendall(request)
        return first, whole_response(conn)


def whole_response(conn: socket.socket) -> bytes:
    """One response with a Content-Length body, or what came before the server closed the connection."""
    received = b""
    while b"\r\n\r\n" not in received:
        chunk = conn.recv(4096)
        if not chunk:
            return received
        received += chunk
    head, _, body = received.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        chunk = conn.recv(4096)
        if not chunk:
            break
        body += chunk
    return head + b"\r\n\r\n" + body
