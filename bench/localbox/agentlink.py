"""The server's side of the control socket to one sandbox agent (see agent.py)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import socket
from collections.abc import Callable, Sequence
from typing import Any

MAX_MESSAGE = 1 << 20


class AgentError(Exception):
    """The agent refused an operation; carries the errno it saw inside the sandbox."""

    def __init__(self, message: str, errno: int | None = None, filename: str | None = None) -> None:
        super().__init__(message)
        self.errno = errno
        self.filename = filename


class AgentGone(AgentError):
    """The agent's control socket closed: the sandbox is no longer running."""


class AgentLink:
    """Request/response messaging with file descriptors over a SOCK_SEQPACKET socket."""

    def __init__(self, sock: socket.socket, on_exit: Callable[[int, int], None]) -> None:
        self._sock = sock
        self._sock.setblocking(False)
        self._loop = asyncio.get_running_loop()
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[tuple[Any, list[int]]]] = {}
        self._on_exit = on_exit
        self._ready: asyncio.Future[dict] = self._loop.create_future()
        # A start that gave up waiting (its timeout, a shutdown) leaves nobody to hear how the agent's start ended.
        self._ready.add_done_callback(lambda ready: ready.cancelled() or ready.exception())
        self.closed = False
        self._loop.add_reader(self._sock.fileno(), self._readable)

    async def ready(self, timeout: float) -> dict:
        return await asyncio.wait_for(asyncio.shield(self._ready), timeout)

    async def call(self, op: str, fds: Sequence[int] = (), **fields: Any) -> tuple[Any, list[int]]:
        if self.closed:
            raise AgentGone("sandbox is not running")
        ident = next(self._ids)
        future = self._loop.create_future()
        self._pending[ident] = future
        data = json.dumps({"op": op, "id": ident, **fields}).encode()
        try:
            while True:
                try:
                    if fds:
                        socket.send_fds(self._sock, [data], list(fds))
                    else:
                        self._sock.send(data)
                    break
                except BlockingIOError:
                    await asyncio.sleep(0.001)
                except OSError as exc:
                    raise AgentGone(f"sandbox is not running ({exc.strerror})") from exc
            return await future
        finally:  # answered, failed or cancelled: nobody waits for this reply any more
            self._pending.pop(ident, None)
            future.cancel()

    async def result(self, op: str, fds: Sequence[int] = (), **fields: Any) -> Any:
        value, received = await self.call(op, fds, **fields)
        for fd in received:
            os.close(fd)
        return value

    def _readable(self) -> None:
        while True:
            try:
                data, fds, _, _ = socket.recv_fds(self._sock, MAX_MESSAGE, 8)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                data, fds = b"", []
            for fd in fds:  # no child this server starts may inherit a sandbox's pipe, pty or file
                os.set_inheritable(fd, False)
            if not data:
                self.close()
                return
            self._dispatch(json.loads(data), fds)

    def _dispatch(self, message: dict, fds: list[int]) -> None:
        op = message.get("op")
        if op == "reply":
            future = self._pending.pop(message["id"], None)
            if future is None or future.done():
                for fd in fds:
                    os.close(fd)
                return
            if message.get("ok"):
                future.set_result((message.get("result"), fds))
            else:
                future.set_exception(
                    AgentError(message.get("error", "failed"), message.get("errno"), message.get("filename"))
                )
        elif op == "exit":
            self._on_exit(message["pid"], message["status"])
        elif op == "ready" and not self._ready.done():
            self._ready.set_result(message)
        elif op == "failed" and not self._ready.done():
            self._ready.set_exception(AgentError(f"sandbox failed to start: {message.get('error')}"))

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        with contextlib.suppress(Exception):
            self._loop.remove_reader(self._sock.fileno())
        self._sock.close()
        for future in self._pending.values():
            if not future.done():
                future.set_exception(AgentGone("sandbox is not running"))
        self._pending.clear()
        if not self._ready.done():
            self._ready.set_exception(AgentGone("sandbox agent exited during start"))
