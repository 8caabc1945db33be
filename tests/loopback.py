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
