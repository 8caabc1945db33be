"""Hostile control plane: what a misbehaving third-party endpoint's API does to a whole run, around the embedded one.

An ASGI middleware (inside the remote conditions, outside the wire mutations), on with either quirk:
- `max_running=N`: a create (POST /sandboxes, /v2/sandboxes), or a resume or connect that would wake a paused
  sandbox, while N sandboxes run (creates under way count) answers 429 `at most N sandboxes at once` in E2B's
  error shape, with no Retry-After: a capacity answer, not a rate limit.
- `deleted_502`: once a DELETE of a sandbox succeeded, every later request about it (REST by its path, envd and
  its ports by the E2b-Sandbox-Id header or the host name) answers 502 `sandbox not found`, every time, where
  E2B answers 404. The ids kept are bounded (the oldest are forgotten past DELETED_KEPT).

The envd side of the hostile profile lives where envd serves (envd.py: `envd_pool`, `ignore_user`) and on the
wire (mutations.py: `output_held`, `stream_no_end_frame`).
"""

from __future__ import annotations

import re
from collections import OrderedDict

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .app import HOST_ROUTE, scope_header
from .conditions import _answer
from .quirks import Quirks
from .registry import Registry

CREATE = re.compile(r"/(v2/)?sandboxes")
ABOUT = re.compile(r"/(?:v2/)?sandboxes/([^/]+)(/.*)?")
ONE = re.compile(r"/sandboxes/[^/]+")  # DELETE of it kills it
WAKES = re.compile(r"/(?:v2/)?sandboxes/[^/]+/(connect|resume)")
DELETED_KEPT = 10_000
NOT_FOUND = "sandbox not found"


class Hostile:
    """The app behind a control plane that caps running sandboxes and answers 502 about deleted ones."""

    def __init__(self, app: ASGIApp, quirks: Quirks, registry: Registry) -> None:
        self.app = app
        self.quirks = quirks
        self.registry = registry
        self.deleted: OrderedDict[str, None] = OrderedDict()
        self.creating = 0  # creates let through and not yet answered

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        method, path = scope.get("method", "GET"), scope["path"]
        about = self._about(scope)
        if self.quirks.deleted_502 and about in self.deleted:
            if scope["type"] == "websocket":
                await send({"type": "websocket.close", "code": 1011})
            else:
                await _answer(receive, send, 502, NOT_FOUND)
            return
        create = method == "POST" and CREATE.fullmatch(path) is not None
        if self.quirks.max_running and (create or self._wakes(method, path, about)):
            if self._running() + self.creating >= self.quirks.max_running:
                await _answer(receive, send, 429, f"at most {self.quirks.max_running} sandboxes at once")
                return
            self.creating += 1
            try:
                await self.app(scope, receive, send)
            finally:
                self.creating -= 1
            return
        if self.quirks.deleted_502 and method == "DELETE" and ONE.fullmatch(path) is not None:
            await self.app(scope, receive, self._noting_delete(send, about))
            return
        await self.app(scope, receive, send)

    def _about(self, scope: Scope) -> str:
        """The sandbox a request is about: by its REST path, else envd's header or the sandbox's host name."""
        match = ABOUT.fullmatch(scope["path"])
        if match and not scope_header(scope, b"e2b-sandbox-id"):
            return match[1]
        if sandbox_id := scope_header(scope, b"e2b-sandbox-id"):
            return sandbox_id
        host = HOST_ROUTE.match(scope_header(scope, b"host"))
        return host[1] if host else ""

    def _wakes(self, method: str, path: str, about: str) -> bool:
        """Would this request make one more sandbox run (a resume or connect of a paused one)?"""
        if method != "POST" or WAKES.fullmatch(path) is None:
            return False
        sandbox = self.registry.get(about)
        return sandbox is not None and sandbox.state == "paused"

    def _running(self) -> int:
        return sum(1 for sandbox in self.registry.sandboxes.values() if sandbox.state == "running")

    def _noting_delete(self, send: Send, sandbox_id: str) -> Send:
        async def sender(message: Message) -> None:
            if message["type"] == "http.response.start" and 200 <= message["status"] < 300:
                self.deleted[sandbox_id] = None
                while len(self.deleted) > DELETED_KEPT:
                    self.deleted.popitem(last=False)
            await send(message)

        return sender


def with_hostile(app: ASGIApp, quirks: Quirks, registry: Registry) -> ASGIApp:
    """`app` behind the hostile control plane `quirks` asks for, or `app` itself when it asks for none."""
    return Hostile(app, quirks, registry) if quirks.max_running or quirks.deleted_502 else app
