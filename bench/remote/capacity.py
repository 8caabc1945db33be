"""Capacity is not conformance: a create refused because the endpoint holds as many sandboxes as it allows at once.

A 429 on a create is read as capacity when its message names a concurrency limit ("at most 40 sandboxes at once",
"concurrent", "running sandboxes") and no rate, or when it comes without `Retry-After` and does not clear on
short retries, while the run holds live sandboxes of its own (bench/remote/ledger.py: none held, it is not about
the run's sandboxes). The wire proxy then lowers the run's concurrency: the ledger learns the limit (the most
sandboxes of the run live at once), later creates wait in the proxy for one of them to end, as under
`--max-sandboxes`, and the refused create is sent again after such a wait rather than handed to its client. Only
a create that found no room within `WAIT_S` gets the 429; its case is `error` "endpoint at capacity: …"
(`details.cause` "endpoint capacity"), never `refused`, `fail` or a cause of the endpoint's conformance.
"""

from __future__ import annotations

import contextlib
import re
import threading
from collections.abc import Callable, Iterator, Mapping

from .retry import RATE_LIMITED

# Words of a concurrency limit, and of a rate (a rate limit is not capacity: its Retry-After is followed).
CONCURRENCY = re.compile(
    r"at once|concurren|simultaneous|in parallel|(running|live|active|open) sandboxes|sandboxes (are )?running"
    r"|too many sandboxes|sandbox(es)? limit|limit of \d+ sandboxes",
    re.IGNORECASE,
)
RATE = re.compile(r"\bper (second|minute|hour)\b|\brate\b|/s\b", re.IGNORECASE)
SHORT_RETRIES = 2  # a wordless 429 without Retry-After still there after this many short retries is capacity
WAIT_S = 50.0  # a refused create waits for room at most this long: below the SDKs' 60 s request timeout
BACKOFF_S = 0.25  # after a room came, before sending again (an endpoint counts a kill a moment late); doubled
MAX_BACKOFF_S = 2.0
CAUSE = "endpoint capacity"
PREFIX = "endpoint at capacity"


def is_capacity(status: int, headers: Mapping[str, str], message: str, refusals: int) -> bool:
    """Is this answer to a create a capacity refusal? `refusals`: 429s this request had before it."""
    if status != RATE_LIMITED or RATE.search(message):
        return False
    if CONCURRENCY.search(message):
        return True
    return not headers.get("retry-after") and refusals >= SHORT_RETRIES


def backoff_s(refusals: int) -> float:
    """The pause before sending a create again after its `refusals`-th capacity refusal (1 for the first)."""
    return min(BACKOFF_S * 2 ** max(refusals - 1, 0), MAX_BACKOFF_S)


def sentence(limit: int, message: str) -> str:
    """The terminal's line when the run learns (or relearns) the endpoint's limit."""
    said = f"429 {message}".strip()
    return (
        f"the endpoint refuses more than {limit} sandboxes at once ({said}); holding the run to {limit}; "
        f"pass --max-sandboxes {limit} next time"
    )


SANDBOXES_PER_RUNNER = 2  # what a runner is taken to hold at once: a shared sandbox and a case's own


class RunnerGate:
    """Runners at once under the run's sandbox limit (`--max-sandboxes`, the endpoint's quota, or its concurrency
    limit once learned): each holds a shared sandbox and a case's own, so past `limit // 2` runners every runner
    could hold one sandbox and wait for a second that none will free. A runner waits for a seat before it starts;
    once a limit learned mid-run leaves fewer seats than runners, the latest seated are asked to yield (`over`):
    stopped (killing their sandboxes), they wait for a seat again and run the steps they had not finished."""

    def __init__(self, limit: Callable[[], int | None]) -> None:
        self.limit = limit
        self.seated: list[object] = []  # in the order they sat down
        self._changed = threading.Condition()

    @property
    def running(self) -> int:
        return len(self.seated)

    def allowed(self) -> int | None:
        limit = self.limit()
        return None if limit is None else max(1, limit // SANDBOXES_PER_RUNNER)

    def over(self, seat: object) -> bool:
        """Is this runner past the seats the limit allows now (so it should yield)?"""
        allowed = self.allowed()
        with self._changed:
            return allowed is not None and seat in self.seated and self.seated.index(seat) >= allowed

    @contextlib.contextmanager
    def slot(self, stop: threading.Event) -> Iterator[object]:
        seat = object()
        with self._changed:
            while not stop.is_set() and (allowed := self.allowed()) is not None and self.running >= allowed:
                self._changed.wait(GATE_POLL_S)  # the limit may be learned meanwhile: looked at again
            self.seated.append(seat)
        try:
            yield seat
        finally:
            with self._changed:
                self.seated.remove(seat)
                self._changed.notify_all()


class Halt(threading.Event):
    """A runner's stop: the run's (`stop`), or its seat asked back by the gate (`yielded`, latched)."""

    def __init__(self, stop: threading.Event, gate: RunnerGate, seat: object) -> None:
        super().__init__()
        self.stop, self.gate, self.seat = stop, gate, seat
        self.yielded = False

    def is_set(self) -> bool:
        if not self.yielded and not self.stop.is_set() and self.gate.over(self.seat):
            self.yielded = True
        return self.stop.is_set() or self.yielded


GATE_POLL_S = 0.5
