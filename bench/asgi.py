"""Serving an ASGI app with uvicorn on sockets bound before it starts (so port 0 works), in a thread or not.

Shared by the embedded endpoint (`bench.localbox.server`) and the scripted model (`bench.model.server`).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import select
import socket
import struct
import sys
import threading
import weakref
from collections.abc import Callable, Iterator
from concurrent.futures import Executor

import httptools
import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from .remote.slowness import scaled

STOP_S = 30.0  # a server in a thread has this long (on a quiet host) to shut down once told to
# A connection between requests is kept longer than an SDK client keeps it in its pool (300 s): the client
# closes it first. Closed by the server as the client reuses it, the request on it is reset (under load the
# loop runs the timer before it reads the request that arrived in time). uvicorn's default is 5 s. Every server
# an SDK or a framework talks to uses it: the embedded endpoint, the wire proxy in front of every endpoint and
# the scripted model.
KEEPALIVE_S = 330.0

log = logging.getLogger("e2b-bench.asgi")

# The ASGI extensions of a request served by `ResettableHttp`. Calling the first resets the request's
# connection; calling the second gives the rest of the request body as `RawBody` (None where it cannot).
RESET_EXTENSION = "e2b-bench.reset"
BODY_EXTENSION = "e2b-bench.body"
BODY_PIECE = 1 << 20  # bytes of a raw body handed on at once
BODY_HEAD = 64 << 10  # bytes of a raw body's first piece: its start (a multipart part's headers) is not held back
BODY_READ_AHEAD = 4  # pieces read ahead of the app at most
SPARE_PIECES = 16  # body buffers kept per event loop: an upload holds about as many while its file opens


class ClientGone(Exception):
    """The client closed its connection before the whole request body arrived."""


class ResettableHttp(HttpToolsProtocol):
    """uvicorn's HTTP protocol whose requests can reset their connection (a TCP RST) under an answer already
    begun, as a proxy that lost its upstream resets its client's stream: the client sees neither the answer's
    end nor an orderly close, a transport failure (E2B's SDKs then probe the sandbox). A request's body can
    also be taken raw (`BODY_EXTENSION`, `RawBody`), read off the socket without uvicorn's copies."""

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._body_parsed = 0
        cycle_scope = self.scope
        extensions: dict[str, object] = {
            RESET_EXTENSION: self.reset,
            BODY_EXTENSION: lambda: self._raw_body(cycle_scope),
        }
        self.scope["extensions"] = extensions  # type: ignore[typeddict-item]  # ASGI extensions hold callables here

    def on_body(self, body: bytes) -> None:
        self._body_parsed += len(body)
        super().on_body(body)

    def _raw_body(self, scope: object) -> RawBody | None:
        """The rest of the body of the request whose scope is `scope`, if it has a Content-Length and no part
        of it was received yet; None otherwise (the app then reads it through `receive` as usual)."""
        cycle = self.cycle
        if cycle is None or cycle.scope is not scope or cycle.disconnected or cycle.response_started:
            return None
        if not cycle.more_body:  # all of it is parsed already (a small body): `receive` has it
            return None
        if self._body_parsed != len(cycle.body):  # some of it was received already, e.g. by a middleware
            return None
        lengths = [value for name, value in self.headers if name == b"content-length"]
        chunked = any(name == b"transfer-encoding" for name, _ in self.headers)
        if len(lengths) != 1 or chunked or not lengths[0].isdigit():
            return None
        if cycle.waiting_for_100_continue and not self.transport.is_closing():
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            cycle.waiting_for_100_continue = False
        return RawBody(self, cycle, int(lengths[0]) - self._body_parsed)

    def restart_parser(self) -> None:
        """A parser for the next request on this connection, after a body read past uvicorn's."""
        self.parser = httptools.HttpRequestParser(self)
        with contextlib.suppress(AttributeError):  # as uvicorn sets it, where httptools has it
            self.parser.set_dangerous_leniencies(lenient_data_after_close=True)

    def reset(self) -> None:
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            cycle.disconnected = True  # what is sent from now on goes nowhere, and uvicorn does not complain
            cycle.message_event.set()
        sock = self.transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.transport.abort()


class RawBody(asyncio.BufferedProtocol):
    """The rest of one request's body, read off the socket straight into buffers of its own.

    uvicorn copies a body four times on its way to the app (the event loop's read into `bytes`, the parser's
    slice, the request's buffer, the message); for a file upload those copies cost more CPU than the disk.
    While a RawBody is read it is the connection's protocol: the socket is read into `BODY_PIECE` buffers,
    never past the body's end, each handed to the app whole (a `bytearray` it owns from then on:
    `async for piece in body`); the first is `BODY_HEAD` bytes, so the app sees the body's start (where a
    multipart body names its file) as soon as it arrives, not a mebibyte later. With the last byte the
    connection goes back to the HTTP protocol, with a fresh parser for the next request. At most
    `BODY_READ_AHEAD` pieces wait for the app before reading pauses. What the app does not take (it called
    `drop()`, or its answer is complete) is read and dropped, as uvicorn drops the body of a request already
    answered, so the connection stays usable.
    """

    def __init__(self, http: ResettableHttp, cycle: RequestResponseCycle, remaining: int) -> None:
        self._http = http
        self._cycle = cycle
        self._remaining = remaining
        self._pieces: collections.deque[bytearray] = collections.deque()
        if cycle.body:
            self._pieces.append(cycle.body)  # what uvicorn's parser took before the switch
            cycle.body = bytearray()
        self._buffer = bytearray()
        self._filled = 0
        self._next_size = BODY_HEAD
        self._dropping = False
        self._waiter: asyncio.Future[None] | None = None
        self._failure: Exception | None = None
        self._receiver: _Receiver | None = None
        http.transport.set_protocol(self)
        http.flow.resume_reading()  # uvicorn pauses reading past 64 KiB of body the app did not take

    def __aiter__(self) -> RawBody:
        return self

    async def __anext__(self) -> bytearray:
        while not self._pieces:
            if self._failure is not None:
                raise self._failure
            if not self._remaining or self._dropping:
                raise StopAsyncIteration
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter
        piece = self._pieces.popleft()
        if len(self._pieces) < BODY_READ_AHEAD:
            self._http.flow.resume_reading()
        return piece

    async def rest_in_thread(self, take: Callable[[list[bytes | bytearray]], None], executor: Executor) -> None:
        """Hand the rest of the body to `take`, in order, in a thread of `executor` that reads the socket itself, so
        the event loop sees only the start and the end: first the pieces already read, then what the socket held
        each time it had no more (at most BODY_PIECE bytes at once), before the thread waits for more. The pieces
        are the app's to keep. Raises what `take` raised, or ClientGone; a body not taken to its end is then read
        and dropped, as after `drop()`. Cancelled, the thread stops after its current `take`, and the cancellation
        goes on once it has."""
        if self._failure is not None:
            raise self._failure
        loop = asyncio.get_running_loop()
        pieces: list[bytes | bytearray] = [*self._pieces]
        if self._filled:  # a partly filled buffer: its bytes, as a piece of their own
            pieces.append(self._buffer[: self._filled])
        self._pieces.clear()
        self._buffer, self._filled = bytearray(), 0
        if not self._remaining:  # all of it was read already: the connection is HTTP's again
            await loop.run_in_executor(executor, take, pieces)
            return
        http = self._http
        sock = http.transport.get_extra_info("socket")
        if sock is None or http.transport.is_closing():
            raise ClientGone(f"the connection closed with {self._remaining} bytes of the body still to come")
        http.flow.pause_reading()  # the thread alone reads the socket from here
        receiver = self._receiver = _Receiver(sock.fileno(), self._remaining, take)
        reading = loop.run_in_executor(executor, receiver.run, pieces)
        try:
            await asyncio.shield(reading)
        except asyncio.CancelledError:
            receiver.stop()
            while not reading.done():  # the thread lets go of the socket before anything else is done with it
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.wait([reading])
            raise
        finally:
            self._receiver = None
            receiver.close()
            self._remaining -= receiver.received
            if not self._remaining:
                self._done()
            else:
                self.drop()

    def nudge(self) -> None:
        """While `rest_in_thread` runs: its thread calls `take` with no pieces as soon as it can, even while the
        socket stays silent (what `take` holds can go on: e.g. the file it writes to is open now). From any thread."""
        receiver = self._receiver
        if receiver is not None:
            receiver.nudge()

    def drop(self) -> None:
        """The app takes no more of the body: the rest is read and dropped."""
        self._dropping = True
        self._pieces.clear()
        self._http.flow.resume_reading()

    # --- the connection's protocol while the body is read -------------------------------------------
    def get_buffer(self, sizehint: int) -> memoryview:
        if self._filled == len(self._buffer):  # each buffer is min(its size, remaining): the last one ends the body
            if not (self._dropping and self._buffer):
                self._buffer = spare_buffer(min(self._next_size, self._remaining))
                self._next_size = BODY_PIECE
            self._filled = 0
        return memoryview(self._buffer)[self._filled : self._filled + self._remaining]

    def buffer_updated(self, nbytes: int) -> None:
        self._filled += nbytes
        self._remaining -= nbytes
        self._dropping = self._dropping or self._cycle.response_complete or self._cycle.disconnected
        if self._filled == len(self._buffer) and not self._dropping:
            self._pieces.append(self._buffer)
            self._buffer, self._filled = bytearray(), 0
            if len(self._pieces) >= BODY_READ_AHEAD:
                self._http.flow.pause_reading()
            self._wake()
        if not self._remaining:
            self._done()

    def _done(self) -> None:
        """The whole body is read: the HTTP protocol takes the connection back, its request complete."""
        self._http.restart_parser()
        self._cycle.more_body = False
        self._cycle.message_event.set()
        self._http.transport.set_protocol(self._http)
        self._http.flow.resume_reading()
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def eof_received(self) -> None:
        self._http.eof_received()  # the connection closes; `connection_lost` follows

    def connection_lost(self, exc: Exception | None) -> None:
        self._failure = ClientGone(f"the connection closed with {self._remaining} bytes of the body still to come")
        self._wake()
        self._http.connection_lost(exc)

    def pause_writing(self) -> None:
        self._http.pause_writing()

    def resume_writing(self) -> None:
        self._http.resume_writing()


class _Receiver:
    """A raw body's rest read in a thread (`RawBody.rest_in_thread`), off a duplicate of the connection's socket
    (non-blocking, as the event loop left it), waiting in poll on it and on a pipe `stop()` and `nudge()` write to."""

    def __init__(self, fd: int, remaining: int, take: Callable[[list[bytes | bytearray]], None]) -> None:
        self._fd = os.dup(fd)
        self._wake, self._waker = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._remaining = remaining
        self._take = take
        self._stopped = False
        self._nudged = False
        self.received = 0  # bytes read off the socket

    def stop(self) -> None:
        self._stopped = True
        self._wake_up()

    def nudge(self) -> None:
        self._nudged = True
        self._wake_up()

    def _wake_up(self) -> None:
        with contextlib.suppress(OSError):  # a full pipe wakes the thread all the same
            os.write(self._waker, b"x")

    def close(self) -> None:
        """Once the thread is done with the socket: its duplicate and the pipe are closed."""
        for fd in (self._fd, self._wake, self._waker):
            os.close(fd)

    def run(self, pieces: list[bytes | bytearray]) -> None:
        if pieces:
            self._take(pieces)
        poller = select.poll()
        poller.register(self._fd, select.POLLIN)
        poller.register(self._wake, select.POLLIN)
        read: list[bytes | bytearray] = []
        size = 0
        while not self._stopped and self.received < self._remaining:
            try:
                piece = os.read(self._fd, min(BODY_PIECE, self._remaining - self.received))
            except BlockingIOError:
                if read or self._nudged:  # what arrived is taken before waiting for more
                    self._nudged = False
                    self._take(read)
                    read, size = [], 0
                elif any(ready == self._wake for ready, _ in poller.poll()):  # `stop()` or `nudge()` was called
                    with contextlib.suppress(BlockingIOError):
                        os.read(self._wake, 4096)
                continue
            except ConnectionError as exc:
                raise ClientGone(f"the connection failed with {self._left()} bytes of the body still to come") from exc
            if not piece:
                raise ClientGone(f"the connection closed with {self._left()} bytes of the body still to come")
            self.received += len(piece)
            read.append(piece)
            size += len(piece)
            if size >= BODY_PIECE or self.received == self._remaining:
                self._take(read)
                read, size = [], 0

    def _left(self) -> int:
        return self._remaining - self.received


# Body buffers of BODY_PIECE bytes, per event loop, given again once nothing holds them: a new bytearray is
# zeroed first, which costs as much as the copy into it.
_spare_buffers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, list[bytearray]] = weakref.WeakKeyDictionary()


def spare_buffer(size: int) -> bytearray:
    """A buffer of `size` bytes for a body (a request's or an answer's): a spare one of the running event loop
    that nothing holds any more (its contents are old), else a new one."""
    try:
        spares = _spare_buffers.setdefault(asyncio.get_running_loop(), [])
    except RuntimeError:  # no event loop runs here: nothing to share with
        return bytearray(size)
    for spare in spares:
        # held by the list, `spare` and getrefcount's argument only: the app and its writers are done with it
        if len(spare) == size and sys.getrefcount(spare) == 3:
            return spare
    piece = bytearray(size)
    if size == BODY_PIECE and len(spares) < SPARE_PIECES:
        spares.append(piece)
    return piece


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
