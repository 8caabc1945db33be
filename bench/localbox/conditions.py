"""Remote conditions: what a distant, shared endpoint does to a run, reproduced around the embedded one.

An ASGI middleware, outside the wire mutations: every request first waits `latency` ms; a create waits
`slow_create` ms more and, past `rate_limit` creates in the last second, is answered 429 with `Retry-After`
in E2B's error shape; a fraction `transient_5xx` of control-plane requests is answered 502 or 503 as a
gateway would, before the endpoint sees it (so nothing was created or changed); and every request of the
`unavailable_route` is answered 503, whatever the moment (every one of the `missing_route`: 404). Draws come from
one seeded generator per server, so a run's sequence of answers is reproducible.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import time
from collections import deque
from collections.abc import Callable

from starlette.types import ASGIApp, Receive, Scope, Send

from .quirks import Quirks

CREATE = re.compile(r"/(v2/)?sandboxes")
ENVD_PREFIXES = ("/process.Process/", "/filesystem.Filesystem/", "/files", "/health")
SEED = 27  # the same draws every server life: a failure under these conditions can be replayed
RETRY_AFTER_S = 1


class Conditions:
    """The app behind a distant endpoint's latency, slow creates, rate limit and transient gateway errors."""

    def __init__(self, app: ASGIApp, quirks: Quirks) -> None:
        self.app = app
        self.quirks = quirks
        self.random = random.Random(SEED)
        self.creates: deque[float] = deque()  # when the creates of the last second were let through
        self.unavailable = _route_matcher(quirks.unavailable_route)
        self.missing = _route_matcher(quirks.missing_route)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        quirks = self.quirks
        create = scope["method"] == "POST" and CREATE.fullmatch(scope["path"]) is not None
        delay_ms = quirks.latency + (self.random.randint(*quirks.slow_create) if create else 0)
        if delay_ms:
            await asyncio.sleep(delay_ms / 1000)
        if self.missing is not None and self.missing(scope["method"], scope["path"]):
            await _answer(receive, send, 404, f"no route {scope['method']} {scope['path']}")
            return
        if self.unavailable is not None and self.unavailable(scope["method"], scope["path"]):
            await _answer(receive, send, 503, "the service is unavailable")
            return
        if not scope["path"].startswith(ENVD_PREFIXES) and self.random.random() < quirks.transient_5xx:
            status = self.random.choice((502, 503))
            await _answer(receive, send, status, "the endpoint is temporarily unavailable, try again")
            return
        if create and quirks.rate_limit and not self._admit():
            message = f"rate limit exceeded: at most {quirks.rate_limit} sandbox creates per second"
            await _answer(receive, send, 429, message, [(b"retry-after", str(RETRY_AFTER_S).encode())])
            return
        await self.app(scope, receive, send)

    def _admit(self) -> bool:
        """Is one more create within `rate_limit` per second (counted over the last second)?"""
        now = time.monotonic()
        while self.creates and now - self.creates[0] >= 1:
            self.creates.popleft()
        if len(self.creates) >= self.quirks.rate_limit:
            return False
        self.creates.append(now)
        return True


def _route_matcher(wanted: str | None) -> Callable[[str, str], bool] | None:
    """`"METHOD /route"` as a test of a request's method and path (a `{name}` or `*` segment: any one)."""
    if wanted is None:
        return None
    method, _, route = wanted.partition(" ")
    pattern = re.compile("^" + re.sub(r"\\\{[^}]+\\\}|\\\*", "[^/]+", re.escape(route)) + "$")
    return lambda asked, path: asked == method and pattern.match(path) is not None


async def _answer(
    receive: Receive, send: Send, status: int, message: str, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    """Answer in the app's place with E2B's error shape, after reading the request body."""
    while (await receive()).get("more_body"):
        pass
    body = json.dumps({"code": status, "message": message}).encode()
    fixed = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": fixed + (headers or [])})
    await send({"type": "http.response.body", "body": body})


def with_conditions(app: ASGIApp, quirks: Quirks) -> ASGIApp:
    """`app` behind the remote conditions `quirks` asks for, or `app` itself when it asks for none."""
    wanted = (
        quirks.latency
        or quirks.slow_create != (0, 0)
        or quirks.rate_limit
        or quirks.transient_5xx
        or quirks.unavailable_route
        or quirks.missing_route
    )
    return Conditions(app, quirks) if wanted else app
