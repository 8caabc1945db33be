"""How fast a soak starts its sessions: the rate asked for, held to what the endpoint shows it can make.

A fixed session rate above what the endpoint makes per second only grows a backlog: every create then
waits longer than the last, until one waits past any budget and fails, and what the run measured is the
backlog, not the endpoint. So a load process starts its creates one at a time, in the order its users
asked, at most at the asked rate. The endpoint's 429 is its measure of what it can make: the process
honours the `Retry-After` for all its creates (an E2B rate limit is a team's, not a request's), sends the
refused create again first, and cuts its rate by `CUT`, or to what the endpoint made in the last
`WINDOW_S` when that is less (a refusing endpoint is at its capacity, and that is what it made at it),
once per refusal that came after the previous backoff (refusals of creates already sent when the rate was
cut say nothing new). Each create made without
a refusal raises the rate by `RAISE` of the asked one, back to it at most. The run's rate then tracks the
endpoint's capacity as it moves (a shared host's does), and a refusal honoured and then made is a retry.

Pure: times are given (seconds on any one clock); `bench/loadusers.py` drives it from its gevent users and
`bench/load.py` sums the processes' figures.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

CUT = 0.75  # the rate after a refusal, as a share of the rate before it (at most)
WINDOW_S = 30.0  # a refusal also holds the rate to what the endpoint made in this many seconds before it
RAISE = 0.005  # each create made adds this share of the asked rate back
FLOOR = 0.05  # the rate never goes below this share of the asked one: past that the endpoint is not serving
MADE, FAILED, STOPPED = "made", "failed", "stopped"  # how a refused create ended


@dataclass
class Pacer:
    """When a load process's next create may start. `asked`: sessions per second (0 or less: no pace, only
    the endpoint's backoffs)."""

    asked: float
    factor: float = 1.0  # the rate now, as a share of the asked one
    lowest: float = 1.0
    cuts: int = 0
    refusals: int = 0
    starts: int = 0
    backoff_until: float = -math.inf  # no create starts before: the endpoint's Retry-After
    last_start: float = -math.inf
    first_start: float | None = None
    recent: deque[float] = field(default_factory=deque)  # when the creates of the last `WINDOW_S` were made

    @property
    def rate(self) -> float:
        return self.asked * self.factor

    def wait_s(self, now: float) -> float:
        """Seconds from `now` until the next create may start (0: now)."""
        paced = self.last_start + 1 / self.rate if self.asked > 0 else -math.inf
        return max(0.0, self.backoff_until - now, paced - now)

    def started(self, now: float) -> None:
        self.starts += 1
        self.last_start = now
        if self.first_start is None:
            self.first_start = now

    def refused(self, now: float, retry_after_s: float, sent_at: float) -> None:
        """A create sent at `sent_at` was refused at `now`, asking for `retry_after_s`."""
        self.refusals += 1
        if sent_at >= self.backoff_until:  # sent at the rate now in force: that rate is too high
            cut = self.factor * CUT
            if self.first_start is not None and now - self.first_start >= WINDOW_S and self.asked > 0:
                self._forget(now)
                cut = min(cut, len(self.recent) / WINDOW_S / self.asked)  # what it made when it was full
            self.factor = max(cut, FLOOR)
            self.lowest = min(self.lowest, self.factor)
            self.cuts += 1
        self.backoff_until = max(self.backoff_until, now + retry_after_s)

    def made(self, now: float, refusals: int) -> None:
        """A create was made at `now` after `refusals` refusals."""
        self.recent.append(now)
        self._forget(now)
        if refusals == 0:
            self.factor = min(1.0, self.factor + RAISE)

    def _forget(self, now: float) -> None:
        while self.recent and self.recent[0] <= now - WINDOW_S:
            self.recent.popleft()

    def summary(self) -> dict[str, Any]:
        return {
            "asked_per_s": self.asked,
            "lowest_per_s": round(self.asked * self.lowest, 4),
            "final_per_s": round(self.rate, 4),
            "cuts": self.cuts,
            "refusals": self.refusals,
            "starts": self.starts,
        }


def retry_figures(refused: Iterable[Sequence[Any]]) -> dict[str, Any]:
    """`refused`: one [refusals, seconds waited, how it ended] per create refused at least once. Out: the
    refusals, the waits, and the creates that were retried (made after honouring them), failed anyway, or
    were stopped while refused (nothing made, nothing failed)."""
    ended = {MADE: 0, FAILED: 0, STOPPED: 0}
    refusals, waited = 0, 0.0
    for times, seconds, how in refused:
        if how not in ended:
            raise ValueError(f"a refused create ended {how!r}: one of {', '.join(ended)}")
        refusals, waited = refusals + int(times), waited + float(seconds)
        ended[how] += 1
    return {
        "refusals": refusals,
        "waited_s": round(waited, 3),
        "retried": ended[MADE],
        "failed": ended[FAILED],
        "stopped": ended[STOPPED],
    }


def pace_figures(processes: Sequence[Mapping[str, Any]], made: int, span_s: float) -> dict[str, Any]:
    """The run's pace from each load process's `Pacer.summary()`: the rate asked and the lowest it was cut
    to (sums: each process paces its share), and the creates made per second of the load's span."""
    return {
        "asked_per_s": round(sum(float(p["asked_per_s"]) for p in processes), 4),
        "lowest_per_s": round(sum(float(p["lowest_per_s"]) for p in processes), 4),
        "final_per_s": round(sum(float(p["final_per_s"]) for p in processes), 4),
        "cuts": sum(int(p["cuts"]) for p in processes),
        "made_per_s": round(made / span_s, 4) if span_s > 0 else None,
    }


def retries_line(refused: Mapping[str, Any]) -> str:
    """The creates the endpoint refused 429, said as retries (made after its backoff) and failures."""
    if not refused["refusals"]:
        return "retries: none (no create was refused 429)"
    return (
        f"retries: {refused['refusals']} refusals 429 honoured (waited {refused['waited_s']:.1f} s in all); "
        f"of the creates refused, {refused['retried']} were made after the backoff, {refused['failed']} failed "
        f"anyway, {refused['stopped']} were stopped while refused"
    )


def pace_line(pace: Mapping[str, Any]) -> str:
    """What the soak asked for and what the endpoint's refusals held it to."""
    made = f"{pace['made_per_s']:.2f}" if pace["made_per_s"] is not None else "—"
    held = (
        f"cut {pace['cuts']} times by the endpoint's 429s, to {pace['lowest_per_s']:.2f}/s at the lowest "
        f"and {pace['final_per_s']:.2f}/s at the end"
        if pace["cuts"]
        else "never cut: the endpoint refused none of the creates sent at the asked rate"
    )
    return f"pace: {pace['asked_per_s']:.2f} sessions/s asked, {made} sandboxes/s made; {held}"
