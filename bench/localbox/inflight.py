"""A sandbox's requests under way (envd RPCs and transfers, port proxy connections), cut when it stops.

When E2B's VM stops (killed, paused, past its timeout) its proxy loses the connection to it: an answer
under way is reset (no Connect end message, no last chunk), so the SDKs see a transport failure and
probe the sandbox; a request not yet answered gets the proxy's 502.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable

from starlette.types import Message, Receive, Scope, Send

from bench.asgi import RESET_EXTENSION

ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class ConnectionCut(Exception):
    """The sandbox stopped under an answer already begun and the server has no way to drop its connection."""


class InFlight:
    """`await in_flight.serve(app, scope, receive, send)` runs a request until it ends or `cut()` is called."""

    def __init__(self, sandbox_id: str) -> None:
        self.sandbox_id = sandbox_id
        self._cuts: set[asyncio.Event] = set()

    def cut(self) -> None:
        for cut in self._cuts:
            cut.set()

    async def serve(self, app: ASGIApp, scope: Scope, receive: Receive, send: Send) -> None:
        cut = asyncio.Event()
        started = finished = False

        async def send_unless_cut(message: Message) -> None:
            nonlocal started, finished
            if cut.is_set():  # e.g. the Connect end message of a stream whose process the stop ended: lost
                return
            started = started or message["type"] in ("http.response.start", "websocket.accept")
            finished = finished or (message["type"] == "http.response.body" and not message.get("more_body"))
            await send(message)

        self._cuts.add(cut)
        handler = asyncio.ensure_future(app(scope, receive, send_unless_cut))
        stopped = asyncio.ensure_future(cut.wait())
        try:
            await asyncio.wait({handler, stopped}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            self._cuts.discard(cut)
            stopped.cancel()
            if not handler.done() and not cut.is_set():  # this request itself was cancelled
                handler.cancel()
        if not cut.is_set() or finished:
            await handler
            return
        handler.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):  # what it raises as it is cut is moot
            await handler
        await self._drop(scope, send, started)

    async def _drop(self, scope: Scope, send: Send, started: bool) -> None:
        if not started and scope["type"] == "http":
            body = json.dumps(
                {"code": 502, "message": f"The sandbox {self.sandbox_id} was not found", "sandboxId": self.sandbox_id}
            ).encode()
            headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
            await send({"type": "http.response.start", "status": 502, "headers": headers})
            await send({"type": "http.response.body", "body": body})
            return
        if not started:  # a WebSocket not yet accepted: refused as the proxy refuses a sandbox it cannot reach
            await send({"type": "websocket.close", "code": 1011, "reason": "the sandbox stopped"})
            return
        reset = scope.get("extensions", {}).get(RESET_EXTENSION)
        if reset is None:
            raise ConnectionCut(f"sandbox {self.sandbox_id} stopped")  # the server closes the connection
        reset()
