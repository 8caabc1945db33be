"""Headless Chromium driven over the DevTools protocol on a pipe (`--remote-debugging-pipe`): real clicks, no deps.

Chromium reads NUL-terminated JSON commands on fd 3 and writes replies and events on fd 4.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import select
import subprocess
import time
from pathlib import Path
from types import TracebackType
from typing import Any

CHROMIUM = Path("/usr/bin/chromium")


def chromium_command(profile: Path, *arguments: str) -> list[str]:
    """Headless Chromium with a fresh profile and no background traffic (this machine reaches no network)."""
    quiet = ("--disable-background-networking", "--disable-component-update", "--disable-sync", "--no-first-run")
    return [
        str(CHROMIUM),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        *quiet,
        f"--user-data-dir={profile}",
        *arguments,
    ]


REPLY_TIMEOUT_S = 60.0


class BrowserError(Exception):
    """Chromium answered a command with an error or did not answer in time."""


class Page:
    """One tab of a headless Chromium: navigate, evaluate, click at an element's centre."""

    def __init__(self, profile: Path, width: int = 1280, height: int = 900) -> None:
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()
        # Chromium wants its ends on fds 3 and 4 exactly: moved above 10 first so that neither dup2 clobbers the other.
        low = [fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in (to_browser_r, from_browser_w)]
        self._process = subprocess.Popen(
            chromium_command(profile, f"--window-size={width},{height}", "--remote-debugging-pipe", "about:blank"),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            pass_fds=(3, 4),
            preexec_fn=lambda: (os.dup2(low[0], 3), os.dup2(low[1], 4)),
        )
        for fd in (to_browser_r, from_browser_w, *low):
            os.close(fd)
        self._buffer = b""
        self._next_id = 0
        self._events: list[dict[str, Any]] = []
        target = self._command("Target.createTarget", {"url": "about:blank"})["targetId"]
        self._session = self._command("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        self._command("Page.enable", session=True)

    def _send(self, method: str, params: dict[str, Any] | None, session: bool) -> int:
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = self._session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        return self._next_id

    def _read(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([self._from_browser], [], [], remaining)[0]:
                raise BrowserError("chromium did not answer in time")
            chunk = os.read(self._from_browser, 1 << 16)
            if not chunk:
                raise BrowserError("chromium closed the pipe")
            self._buffer += chunk
        raw, self._buffer = self._buffer.split(b"\0", 1)
        return dict(json.loads(raw))

    def _command(self, method: str, params: dict[str, Any] | None = None, session: bool = False) -> dict[str, Any]:
        wanted = self._send(method, params, session)
        deadline = time.monotonic() + REPLY_TIMEOUT_S
        while True:
            message = self._read(deadline)
            if message.get("id") == wanted:
                if "error" in message:
                    raise BrowserError(f"{method}: {message['error']}")
                return dict(message.get("result", {}))
            self._events.append(message)

    def _wait_event(self, method: str) -> None:
        deadline = time.monotonic() + REPLY_TIMEOUT_S
        while not any(event.get("method") == method for event in self._events):
            self._events.append(self._read(deadline))
        self._events.clear()

    def goto(self, url: str) -> None:
        self._events.clear()
        self._command("Page.navigate", {"url": url}, session=True)
        self._wait_event("Page.loadEventFired")

    def evaluate(self, expression: str) -> Any:
        result = self._command(
            "Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True}, session=True
        )
        if "exceptionDetails" in result:
            raise BrowserError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def click(self, selector: str) -> None:
        """A real mouse click (press and release) at the centre of the first element matching `selector`."""
        box = self.evaluate(
            f"(() => {{ const e = document.querySelector({json.dumps(selector)});"
            " e.scrollIntoView({block: 'center'}); const r = e.getBoundingClientRect();"
            " return [r.x + r.width / 2, r.y + r.height / 2]; })()"
        )
        for kind in ("mousePressed", "mouseReleased"):
            self._command(
                "Input.dispatchMouseEvent",
                {"type": kind, "x": box[0], "y": box[1], "button": "left", "clickCount": 1},
                session=True,
            )

    def screenshot(self, path: Path) -> None:
        path.write_bytes(base64.b64decode(self._command("Page.captureScreenshot", {}, session=True)["data"]))

    def close(self) -> None:
        try:
            self._send("Browser.close", None, session=False)
            self._process.wait(timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            self._process.kill()
            self._process.wait()
        finally:
            os.close(self._to_browser)
            os.close(self._from_browser)

    def __enter__(self) -> Page:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
