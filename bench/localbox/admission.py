"""Admission of creates: a host makes only so many sandboxes at once; past that, E2B's 429 and when to retry.

Making a sandbox is work for the host's CPUs (namespaces, a disk, a network, a warm shell). Creates beyond
what the CPUs can do at once do not finish sooner, they only make every create (and every running
sandbox's commands) slower, until clients time out. So at most `CREATES_PER_CPU` per CPU are made at once
and the others wait their turn, as long as their turn is expected within `QUEUE_WAIT_S` (from the recent
creates' own durations); a create beyond that is answered 429 with `Retry-After`, the time the creates
ahead of it are expected to take, as E2B answers a team past its limit. A client that honours it comes
back when there is room; nothing was made for it. The expectation can lag a host that slows down, so a create
that has waited `QUEUE_HOLD_S` in fact is answered 429 too: its client's request timeout (60 s in E2B's SDKs)
must still cover the making, and a create the client gave up on would be made for no one.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import time
from collections import deque
from collections.abc import AsyncIterator

CREATES_PER_CPU = 2  # made at once per CPU: beyond, they share the CPUs and each takes longer
RECENT = 32  # creates whose durations estimate the next ones'
RETRY_AFTER_MIN_S, RETRY_AFTER_MAX_S = 1, 30
QUEUE_WAIT_S = 10.0  # a create waits its turn this long at most (expected): well within an SDK's request timeout
QUEUE_HOLD_S = 20.0  # ... and this long at most in fact, whatever was expected (the making then has the rest)


class Refused(Exception):
    """A create the endpoint has no room for now; `retry_after_s`: when there should be."""

    def __init__(self, making: int, waiting: int, retry_after_s: int) -> None:
        super().__init__(
            f"the endpoint is making {making} sandboxes and {waiting} more wait their turn: "
            f"retry after {retry_after_s} s"
        )
        self.retry_after_s = retry_after_s


class Admission:
    """Creates in progress bounded by the host's CPUs, queued while their turn is near; beyond, `Refused`."""

    def __init__(
        self, at_once: int | None = None, queue_wait_s: float = QUEUE_WAIT_S, queue_hold_s: float = QUEUE_HOLD_S
    ) -> None:
        self.at_once = at_once or CREATES_PER_CPU * (os.cpu_count() or 1)
        self.queue_wait_s = queue_wait_s
        self.queue_hold_s = queue_hold_s
        self._slots = asyncio.Semaphore(self.at_once)
        self.making = 0
        self.waiting = 0
        self.refused = 0
        self._durations: deque[float] = deque(maxlen=RECENT)

    def ahead_s(self) -> float:
        """Seconds until the creates ahead (making and waiting) should be done, from recent creates' times."""
        typical = sorted(self._durations)[len(self._durations) // 2] if self._durations else 1.0
        return typical * (self.making + self.waiting) / self.at_once

    def retry_after(self) -> int:
        return min(max(math.ceil(self.ahead_s()), RETRY_AFTER_MIN_S), RETRY_AFTER_MAX_S)

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        """Hold one of the create slots for the block; `Refused` at once when the queue is full, or once its
        turn has not come within `queue_hold_s`."""
        if self.waiting >= self.at_once and self.ahead_s() > self.queue_wait_s:
            self.refused += 1
            raise Refused(self.making, self.waiting, self.retry_after())
        self.waiting += 1
        try:
            async with asyncio.timeout(self.queue_hold_s):
                await self._slots.acquire()
        except TimeoutError:
            self.refused += 1
            raise Refused(self.making, self.waiting - 1, self.retry_after()) from None
        finally:
            self.waiting -= 1
        self.making += 1
        started = time.monotonic()
        try:
            yield
            self._durations.append(time.monotonic() - started)
        finally:
            self.making -= 1
            self._slots.release()
