"""What this machine does on its own, measured in the same run as the endpoint it is compared with.

Absolute times on a shared machine mean little, so benchmark figures are stated as ratios to these:
a bare `bash -c true` spawn, an HTTP round trip over loopback (a minimal keep-alive server, the
`httpx` client the Python SDK uses), and a copy of a file of the transfer size on the local disk.

`python -m bench.baselines '{"count": 30, "bytes": 20971520}'` prints `{name: [ms, ...]}`: the
benchmark runs it as its own process so that no endpoint served in the harness shares its GIL.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx

SPAWN, LOOPBACK, DISK_COPY = "spawn", "loopback_rtt", "disk_copy"
TITLES = {
    SPAWN: "bare process spawn (bash -c true)",
    LOOPBACK: "loopback HTTP round trip (keep-alive)",
    DISK_COPY: "local disk copy of the transfer size",
}
WARMUP = 2
COPY_COUNT = 10


def serve_connections(listener: socket.socket, serve: Callable[[socket.socket], None]) -> None:
    """Accept on a loopback listener until it is closed, each connection (no Nagle delay) served in a thread."""
    while True:
        try:
            connection, _ = listener.accept()
        except OSError:
            return
        connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threading.Thread(target=serve, args=(connection,), daemon=True).start()


class BaselineError(Exception):
    """A baseline could not be measured."""


def timed(action: Callable[[], object], count: int, warmup: int = WARMUP) -> list[float]:
    """`count` durations (ms) of `action`, after `warmup` untimed calls."""
    for _ in range(warmup):
        action()
    samples = []
    for _ in range(count):
        started = time.perf_counter()
        action()
        samples.append((time.perf_counter() - started) * 1000)
    return samples


def spawn(count: int) -> list[float]:
    return timed(lambda: subprocess.run(["bash", "-c", "true"], check=True), count)


class _TinyHttpServer:
    """The least an HTTP/1.1 server can do: answer every request on a kept-alive connection with 200."""

    RESPONSE = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Type: text/plain\r\n\r\nok"

    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}/"
        threading.Thread(target=serve_connections, args=(self._listener, self._serve), daemon=True).start()

    def _serve(self, connection: socket.socket) -> None:
        buffered = b""
        with connection:
            while True:
                while b"\r\n\r\n" not in buffered:
                    chunk = connection.recv(65536)
                    if not chunk:
                        return
                    buffered += chunk
                _, buffered = buffered.split(b"\r\n\r\n", 1)
                connection.sendall(self.RESPONSE)

    def close(self) -> None:
        self._listener.close()


def loopback_rtt(count: int) -> list[float]:
    server = _TinyHttpServer()
    try:
        with httpx.Client(trust_env=False) as client:
            return timed(lambda: client.get(server.url).raise_for_status(), count)
    finally:
        server.close()


def disk_copy(size: int, count: int = COPY_COUNT) -> list[float]:
    with tempfile.TemporaryDirectory(prefix="e2b-bench-copy-") as scratch:
        source, target = Path(scratch) / "source", Path(scratch) / "copy"
        source.write_bytes(os.urandom(size))
        return timed(lambda: shutil.copyfile(source, target), count, warmup=1)


def measure(count: int, size: int) -> dict[str, list[float]]:
    """Samples of every baseline: `count` spawns and round trips, a few copies of `size` bytes."""
    return {SPAWN: spawn(count), LOOPBACK: loopback_rtt(count), DISK_COPY: disk_copy(size)}


def measure_in_subprocess(count: int, size: int, timeout_s: float = 60) -> dict[str, list[float]]:
    """`measure` in a fresh interpreter (the harness's own), so nothing else in this process disturbs it."""
    argv = [sys.executable, "-m", "bench.baselines", json.dumps({"count": count, "bytes": size})]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired as exc:
        raise BaselineError(f"measuring the local baselines took longer than {timeout_s:g}s") from exc
    if done.returncode != 0:
        raise BaselineError(f"measuring the local baselines failed: {done.stderr.strip()[-1000:]}")
    return {name: [float(v) for v in values] for name, values in json.loads(done.stdout).items()}


if __name__ == "__main__":
    request = json.loads(sys.argv[1])
    print(json.dumps(measure(int(request["count"]), int(request["bytes"]))))
