"""Every sandbox a run's runners created, as the recording proxies saw it on the wire.

Each create, kill, pause, resume/connect and timeout change passes a `WireProxy`, which tells the run's
one `SandboxLedger`. The ledger is what `--max-sandboxes` is enforced with (a create beyond the quota
waits for a sandbox of the run to end), what the cost figure counts (sandbox-seconds by suite: running
time, from the create's answer to its kill, its expiry or the end of the run) and how the end of a run
tells the sandboxes it left itself (created, never killed) from those an endpoint failed to end.
"""

from __future__ import annotations

import asyncio
import re
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

SANDBOX_PATH = re.compile(r"^/sandboxes/(?P<id>[^/]+)(?P<action>/timeout|/pause|/resume|/connect|/fork)?$")
CREATE_PATH = re.compile(r"^/(v2/)?sandboxes$")
ADMIT_POLL_S = 0.05
EXPIRY_GRACE_S = 30.0  # a sandbox past its expiry by less than this may still be alive through no fault


@dataclass
class Sandbox:
    """One sandbox of the run: who made it, and its running intervals."""

    id: str
    suite: str
    runner: str
    since: float | None  # running since (None: paused or gone)
    expires: float | None  # when its timeout ends it (None: unknown)
    running_s: float = 0.0
    killed: bool = False
    lifetime_s: float | None = None  # the lifetime last given (create, timeout, resume/connect), as asked
    pauses: bool = False  # its create asked it to pause when its lifetime ends (`autoPause`): no expiry then


@dataclass
class SandboxLedger:
    """Thread-safe: every proxy of the run (one per runner, each in its own thread) reports here."""

    max_sandboxes: int | None = None
    clock: Callable[[], float] = time.monotonic
    sandboxes: dict[str, Sandbox] = field(default_factory=dict)
    pending: int = 0  # creates admitted whose answer has not come yet
    queued_s: float = 0.0  # time creates spent waiting for a slot
    # The endpoint's concurrency limit as learned from its capacity answers (bench/remote/capacity.py): the most
    # sandboxes of the run live at once since the first one; None until a create is refused for capacity.
    capacity: int | None = None
    capacity_answers: int = 0  # creates refused for capacity (each retried after waiting, or handed on)
    capacity_message: str = ""  # what the endpoint said, the first time
    on_capacity: Callable[[int, str], None] | None = None  # (limit, message) when the limit is learned or changes
    _told: int | None = None  # the limit last given to on_capacity
    waiting_for_room: int = 0  # creates refused for capacity, waiting before they are sent again
    _lock: threading.Lock = field(default_factory=threading.Lock)

    # --- the quota ---------------------------------------------------------------------------------
    def running(self) -> int:
        now = self.clock()
        return sum(1 for s in self.sandboxes.values() if s.since is not None and not _expired(s, now))

    def limit(self) -> int | None:
        """How many sandboxes the run may have at once: `--max-sandboxes` (or the endpoint's quota), lowered to
        the endpoint's concurrency limit once learned."""
        limits = [n for n in (self.max_sandboxes, self.capacity) if n is not None]
        return min(limits) if limits else None

    def _try_admit(self) -> bool:
        with self._lock:
            limit = self.limit()
            if limit is not None and self.running() + self.pending >= limit:
                return False
            self.pending += 1
            return True

    def refused_for_capacity(self, message: str) -> int | None:
        """A create was refused for capacity: the limit learned (the run's live sandboxes now and its other creates
        in flight, or more seen live since), or None when the run has none (so the refusal is not about the run's
        own sandboxes)."""
        with self._lock:
            live = self.running()
            # The endpoint counts the creates it is still making: those in flight (not this one, nor those waiting
            # for room after a refusal of their own) may make sandboxes too.
            others = max(self.pending - 1 - self.waiting_for_room, 0)
            if live + others == 0:
                return None
            self.capacity_answers += 1
            self.capacity = learned = max(live + others, self.capacity or 0)
            self.capacity_message = self.capacity_message or message
            told = self._settled(in_flight=others)
        self._tell(told)
        return learned

    def waiting(self, change: int) -> None:
        """A create refused for capacity starts (+1) or ends (-1) its wait for room before it is sent again."""
        with self._lock:
            self.waiting_for_room = max(self.waiting_for_room + change, 0)

    def _settled(self, in_flight: int) -> int | None:
        """The limit to tell, once no other create is in flight (one that may still make a sandbox raises it) and
        it changed since last told; called with the lock held."""
        if self.capacity is None or self.capacity == self._told or in_flight > 0:
            return None
        self._told = self.capacity
        return self.capacity

    def _tell(self, limit: int | None) -> None:
        if limit is not None and self.on_capacity is not None:
            self.on_capacity(limit, self.capacity_message)

    async def readmit(self, within_s: float) -> bool:
        """A create refused for capacity gives up its slot and waits, at most `within_s`, for another under the
        learned limit (one of the run's sandboxes ending); False when none came (it is counted pending anyway)."""
        self.abandon()
        try:
            await asyncio.wait_for(self.admit(), timeout=within_s)
        except (TimeoutError, asyncio.CancelledError) as exc:  # counted again: the create's end abandons it
            with self._lock:
                self.pending += 1
            if isinstance(exc, asyncio.CancelledError):
                raise
            return False
        return True

    async def admit(self) -> None:
        """Wait (polling) until a create fits under the quota, then count it as pending."""
        started = self.clock()
        while not self._try_admit():
            await asyncio.sleep(ADMIT_POLL_S)
        waited = self.clock() - started
        if waited > 0:
            with self._lock:
                self.queued_s += waited

    def abandon(self) -> None:
        """An admitted create that made no sandbox (refused, failed, client gone)."""
        with self._lock:
            self.pending = max(self.pending - 1, 0)

    # --- what the wire showed ----------------------------------------------------------------------
    def created(self, sandbox_id: str, suite: str, runner: str, timeout_s: float | None, pauses: bool = False) -> None:
        now = self.clock()
        with self._lock:
            self.pending = max(self.pending - 1, 0)
            made = Sandbox(sandbox_id, suite, runner, now, _expiry(now, timeout_s), lifetime_s=timeout_s, pauses=pauses)
            self.sandboxes[sandbox_id] = made
            if self.capacity is not None and self.running() > self.capacity:  # a create in flight when it was learned
                self.capacity = self.running()
            told = self._settled(in_flight=self.pending - self.waiting_for_room)
        self._tell(told)

    def observe(self, method: str, path: str, status: int, body: Mapping[str, Any] | None, answer: Any = None) -> None:
        """A lifecycle call on one sandbox answered `status` (`body`: the request's JSON, if any; `answer`: the
        response's). A fork's new sandboxes are counted (not queued: one call may make up to a hundred)."""
        match = SANDBOX_PATH.match(path)
        if match is None or (status >= 300 and status != 404):
            return
        now = self.clock()
        with self._lock:
            sandbox = self.sandboxes.get(match["id"])
            if sandbox is None:
                return
            action = match["action"] or ""
            timeout = (body or {}).get("timeout")
            timeout_s = float(timeout) if isinstance(timeout, int | float) and not isinstance(timeout, bool) else None
            if action == "/fork" and status < 300:
                for fork in answer if isinstance(answer, list) else []:
                    made = (fork.get("sandbox") or {}).get("sandboxID") if isinstance(fork, dict) else None
                    if isinstance(made, str):
                        expires = _expiry(now, timeout_s)
                        self.sandboxes[made] = Sandbox(made, sandbox.suite, sandbox.runner, now, expires)
            elif status == 404 or (method == "DELETE" and not action):
                self._stop(sandbox, now)
                sandbox.killed = method == "DELETE"
            elif action == "/pause":
                self._stop(sandbox, now)
            elif action in ("/resume", "/connect"):
                if sandbox.since is None and not sandbox.killed:
                    sandbox.since = now
                if timeout_s is not None:
                    sandbox.expires, sandbox.lifetime_s = _expiry(now, timeout_s), timeout_s
                if isinstance((body or {}).get("autoPause"), bool):
                    sandbox.pauses = bool((body or {})["autoPause"])
            elif action == "/timeout" and timeout_s is not None:
                sandbox.expires, sandbox.lifetime_s = _expiry(now, timeout_s), timeout_s

    def past_lifetime(self, sandbox_id: str, slack_s: float) -> tuple[float | None, float] | None:
        """For a running sandbox of the run whose lifetime, as the wire saw it given, has run out (or will in
        `slack_s`): that lifetime and how long ago it ran out; None for any other (killed, paused, one that
        pauses at its end, one whose lifetime is unknown or not over)."""
        now = self.clock()
        with self._lock:
            sandbox = self.sandboxes.get(sandbox_id)
            if sandbox is None or sandbox.killed or sandbox.since is None or sandbox.pauses:
                return None
            if sandbox.expires is None or now < sandbox.expires - slack_s:
                return None
            return sandbox.lifetime_s, now - sandbox.expires

    @staticmethod
    def _stop(sandbox: Sandbox, now: float) -> None:
        if sandbox.since is not None:
            end = min(now, sandbox.expires) if sandbox.expires is not None else now
            sandbox.running_s += max(end - sandbox.since, 0.0)
            sandbox.since = None

    # --- the end of the run ------------------------------------------------------------------------
    def left(self) -> list[Sandbox]:
        """Sandboxes the run created and never killed that may still be alive (running or paused)."""
        now = self.clock()
        with self._lock:
            return [
                s for s in self.sandboxes.values()
                if not s.killed and not (s.expires is not None and now > s.expires + EXPIRY_GRACE_S)
            ]  # fmt: skip

    def sandbox_seconds(self) -> dict[str, float]:
        """Running sandbox-seconds by suite, up to now."""
        now = self.clock()
        by_suite: dict[str, float] = {}
        with self._lock:
            for sandbox in self.sandboxes.values():
                seconds = sandbox.running_s
                if sandbox.since is not None:
                    end = min(now, sandbox.expires) if sandbox.expires is not None else now
                    seconds += max(end - sandbox.since, 0.0)
                by_suite[sandbox.suite] = by_suite.get(sandbox.suite, 0.0) + seconds
        return by_suite

    def ids(self) -> set[str]:
        with self._lock:
            return set(self.sandboxes)


def is_create(method: str, path: str) -> bool:
    return method == "POST" and CREATE_PATH.match(path) is not None


def is_lifecycle(method: str, path: str) -> bool:
    """A call the ledger follows: a create, or a kill/pause/resume/connect/timeout of one sandbox."""
    if is_create(method, path):
        return True
    match = SANDBOX_PATH.match(path)
    return match is not None and (method == "DELETE") == (match["action"] is None) and method in ("DELETE", "POST")


def _expiry(now: float, timeout_s: float | None) -> float | None:
    return now + timeout_s if timeout_s is not None else None


def _expired(sandbox: Sandbox, now: float) -> bool:
    return sandbox.expires is not None and now > sandbox.expires
