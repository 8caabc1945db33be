"""The floor of a transfer: envd's `/files` as a server that does nothing but move bytes.

`POST /files` reads the request body (Content-Length or chunked) and discards it; `GET /files` sends
`size` zero bytes. Each answers as envd would for the SDK's call (the same status, headers and JSON),
so an SDK's `files.write` / `files.read` pointed here (its own `sandbox_url` option) takes the time the
client library alone needs: the `<measure>_floor` measures. An endpoint that is no slower than 1.5x
its floor is as fast as that SDK lets it be. `GET /floor/received` says how many body bytes the last
upload carried, so a runner can check the upload through a second path.

`python -m bench.floor SIZE` serves on a free loopback port in its own process (no GIL shared with the
harness), prints `{"url": ...}` as one line and serves until its stdin closes.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import parse_qs, urlsplit

from .baselines import serve_connections

PIECE = 1 << 20  # bytes received or sent per call
HEAD_MAX = 64 << 10
START_TIMEOUT_S = 30


class FloorError(Exception):
    """The floor server could not start."""


class FloorServer:
    """Threads on a loopback listener; one per connection, each serving kept-alive requests in order."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.received = 0  # body bytes of the last upload
        self._zeros = bytes(min(PIECE, max(size, 1)))
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"

    def serve_forever(self) -> None:
        serve_connections(self._listener, self._serve)

    def close(self) -> None:
        self._listener.close()

    def _serve(self, connection: socket.socket) -> None:
        try:
            with connection:
                self._answer(connection, _Reader(connection))
        except (OSError, ValueError):  # a client gone mid-request or not speaking HTTP: its connection ends
            pass

    def _answer(self, connection: socket.socket, reader: _Reader) -> None:
        while (head := reader.head()) is not None:
            request_line, headers = head
            method, target = request_line.split(" ")[:2]
            url = urlsplit(target)
            if method == "POST" and url.path == "/files":
                self.received = reader.discard_body(headers)
                path = (parse_qs(url.query).get("path") or ["/floor"])[0]
                entry = {"name": os.path.basename(path), "type": "file", "path": path}
                connection.sendall(_answer(200, json.dumps([entry]).encode(), "application/json"))
            elif method == "GET" and url.path == "/files":
                reader.discard_body(headers)
                head_bytes = _head(200, self.size, "application/octet-stream")
                connection.sendall(head_bytes + b'Content-Disposition: attachment; filename="floor"\r\n\r\n')
                left = self.size
                while left > 0:
                    piece = self._zeros if left >= len(self._zeros) else self._zeros[:left]
                    connection.sendall(piece)
                    left -= len(piece)
            elif method == "GET" and url.path == "/floor/received":
                body = json.dumps({"bytes": self.received}).encode()
                connection.sendall(_answer(200, body, "application/json"))
            else:
                reader.discard_body(headers)
                connection.sendall(_answer(404, b'{"code":404,"message":"not a floor route"}', "application/json"))


def _head(status: int, length: int, content_type: str) -> bytes:
    reason = {200: "OK", 404: "Not Found"}[status]
    return f"HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\nContent-Length: {length}\r\n".encode()


def _answer(status: int, body: bytes, content_type: str) -> bytes:
    return _head(status, len(body), content_type) + b"\r\n" + body


class _Reader:
    """HTTP/1.1 requests off one connection: heads parsed, bodies counted and dropped."""

    def __init__(self, connection: socket.socket) -> None:
        self._connection = connection
        self._buffer = bytearray()
        self._scratch = bytearray(PIECE)

    def _fill(self) -> bool:
        got = self._connection.recv_into(self._scratch)
        self._buffer += memoryview(self._scratch)[:got]
        return got > 0

    def head(self) -> tuple[str, dict[str, str]] | None:
        """The next request's line and headers (names lower-cased); None when the client closed."""
        while (end := self._buffer.find(b"\r\n\r\n")) < 0:
            if len(self._buffer) > HEAD_MAX or not self._fill():
                return None
        lines = bytes(self._buffer[:end]).decode("latin-1").split("\r\n")
        del self._buffer[: end + 4]
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        return lines[0], headers

    def discard_body(self, headers: dict[str, str]) -> int:
        """Read the request's body and drop it (after a `100 Continue` if the client waits for one); its length."""
        if headers.get("expect", "").lower() == "100-continue":
            self._connection.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
        if "chunked" in headers.get("transfer-encoding", "").lower():
            return self._discard_chunked()
        return self._discard(int(headers.get("content-length") or 0))

    def _discard(self, length: int) -> int:
        left = length - min(length, len(self._buffer))
        del self._buffer[: length - left]
        while left > 0:
            got = self._connection.recv_into(self._scratch, min(left, PIECE))
            if not got:
                raise ConnectionError("the client closed the connection inside a body")
            left -= got
        return length

    def _line(self) -> bytes:
        while (end := self._buffer.find(b"\r\n")) < 0:
            if not self._fill():
                raise ConnectionError("the client closed the connection inside a chunked body")
        line = bytes(self._buffer[:end])
        del self._buffer[: end + 2]
        return line

    def _discard_chunked(self) -> int:
        total = 0
        while size := int(self._line().split(b";")[0], 16):
            total += self._discard(size)
            self._line()  # the CRLF after a chunk
        while self._line():  # trailers, up to the empty line
            pass
        return total


class FloorProcess:
    """`python -m bench.floor SIZE` started at once; its URL is waited for only when first asked."""

    def __init__(self, size: int) -> None:
        argv = [sys.executable, "-m", "bench.floor", str(size)]
        self._process = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self._url: str | None = None

    @property
    def url(self) -> str:
        if self._url is None:
            assert self._process.stdout is not None
            started = threading.Timer(START_TIMEOUT_S, self._process.kill)
            started.start()
            line = self._process.stdout.readline()
            started.cancel()
            if not line:
                raise FloorError(f"the floor server did not start (exit code {self._process.poll()})")
            self._url = str(json.loads(line)["url"])
        return self._url

    def stop(self) -> None:
        if self._process.stdin is not None:
            self._process.stdin.close()  # its signal to end
        try:
            self._process.wait(5)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()


@contextmanager
def started(size: int) -> Iterator[FloorProcess]:
    """A floor server of `size`-byte downloads in its own process for the block, starting while the block runs."""
    process = FloorProcess(size)
    try:
        yield process
    finally:
        process.stop()


@contextmanager
def serving(size: int) -> Iterator[str]:
    """A floor server of `size`-byte downloads in its own process for the block; its base URL."""
    with started(size) as process:
        yield process.url


def main(size: int) -> None:
    server = FloorServer(size)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    print(json.dumps({"url": server.url}), flush=True)
    sys.stdin.read()  # until the harness closes it (or exits)
    server.close()


if __name__ == "__main__":
    main(int(sys.argv[1]))
