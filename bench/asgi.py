"""Serving an ASGI app with uvicorn on sockets bound before it starts (so port 0 works), in a thread or not.

Shared by the embedded endpoint (`bench.localbox.server`) and the scripted model (`bench.model.server`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import struct
import threading
from collections.abc import Iterator

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from .remote.slowness import scaled

STOP_S = 30.0  # a server in a thread has this long (on a quiet host) to shut down once told to

log = logging.getLogger("e2b-bench.asgi")

# The ASGI extension of a request served by `ResettableHttp`: calling it resets the request's connection.
RESET_EXTENSION = "e2b-bench.reset"


class ResettableHttp(HttpToolsProtocol):
    """uvicorn's HTTP protocol whose requests can reset their connection (a TCP RST) under an answer already
    begun, as a proxy that lost its upstream resets its client's stream: the client sees neither the answer's
    end nor an orderly close, a transport failure (E2B's SDKs then probe the sandbox)."""

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.scope["extensions"] = {RESET_EXTENSION: self.reset}  # type: ignore[dict-item]

    def reset(self) -> None:
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            cycle.disconnected = True  # what is sent from now on goes nowhere, and uvicorn does not complain
            cycle.message_event.set()
        sock = self.transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.transport.abort()


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on `host:port` (0: a free port), inheritable by uvicorn."""
    # proto must be IPPROTO_TCP, or asyncio does not set TCP_NODELAY on accepted connections (+40 ms)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(1024)
    sock.set_inheritable(True)
    return sock


def run(server: uvicorn.Server, sockets: list[socket.socket]) -> None:
    """Serve on the calling thread, on uvicorn's preferred event loop (uvloop when installed)."""
    with asyncio.Runner(loop_factory=server.config.get_loop_factory()) as runner:
        runner.run(server.serve(sockets=sockets))


@contextlib.contextmanager
def in_thread(server: uvicorn.Server, sockets: list[socket.socket], name: str) -> Iterator[None]:
    """Serve in a daemon thread for the duration of the block; a failure to start is raised here."""
    failure: list[BaseException] = []

    def serve() -> None:
        try:
            run(server, sockets)
        except BaseException as exc:  # surfaced to the caller below
            failure.append(exc)

    thread = threading.Thread(target=serve, name=name, daemon=True)
    thread.start()
    while not server.started:
        if failure or not thread.is_alive():
            raise RuntimeError(f"{name} failed to start: {failure[0] if failure else 'exited'}")
        thread.join(0.01)
    try:
        yield
    finally:
        server.should_exit = True
        thread.join(scaled(STOP_S))
        if thread.is_alive():  # its clean-up is stuck: said, not waited for (the thread is a daemon)
            log.warning("e2b-bench: %s did not stop within %.0f s", name, scaled(STOP_S))
