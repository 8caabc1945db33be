"""The lifetimes the harness gives its runners' sandboxes, and how it tells an expiry it caused from the endpoint's.

A sandbox a step makes must outlive the step however slow the host gets: the step's deadline (the longest the
harness lets it run, scaled by the slowness) bounds how long the step can use it, so the task's lifetime is at
least its longest step deadline, with a margin. The slowness is measured again for each task (the host may have
got busy since the run began), never less than the run's. A sandbox several steps share is given that lifetime
again before a step whenever less than it is left (the runners' drivers).

Should a sandbox still expire while a step uses it (a step of a runner that chose its own lifetime, a host
slower than any measurement), the wire proxy knows: the sandbox's lifetime, as the ledger saw it set, had run out
when the endpoint answered that it was gone. Such an answer is the harness's doing: the step is `error`
"sandbox expired: ...", never a deviation of the endpoint (`bench/remote/transient.py`).
"""

from __future__ import annotations

import math
import os
from collections.abc import Collection, Iterable, Sequence
from dataclasses import replace
from typing import Any

from ..runners.protocol import StepResult
from .slowness import SLOWNESS_ENV, measure, slowness

BASE_LIFETIME_S = 120  # what the SDK runners' sandboxes are created with on a quiet host (at the least)
# E2B's base tier gives a sandbox an hour at most (a create or set_timeout asking more is refused); the runners'
# shared sandboxes live twice the task's lifetime and their set_timeout steps ask 60 s more than that.
MAX_LIFETIME_S = 1740
MARGIN_S = 30.0  # beyond the longest step deadline, on a quiet host: the kill after a step and the clock's skew
# Answers that say a sandbox is gone (the API's 404, envd's 401/404 for a sandbox that no longer exists, the
# proxy's 502): after the sandbox's lifetime ran out, the harness's doing.
GONE_STATUSES = frozenset({401, 404, 410, 502})
EXPIRED_SLACK_S = 1.0  # an answer this much before the lifetime's end (the create's own latency) still counts
CAUSE = "sandbox expired"
# A factor on every lifetime the harness chooses (tests: a lifetime made too short on purpose, to see the expiry
# it causes judged as the harness's); 1 when unset or not a positive number.
LIFETIME_SCALE_ENV = "E2B_BENCH_LIFETIME_SCALE"


def lifetime_scale() -> float:
    try:
        scale = float(os.environ.get(LIFETIME_SCALE_ENV, "") or 1.0)
    except ValueError:
        return 1.0
    return scale if scale > 0 else 1.0


def task_factor() -> float:
    """How much slower than a quiet host this one is now: the run's factor, or a fresh measurement if larger
    (E2B_BENCH_SLOWNESS, when set, is the factor)."""
    if os.environ.get(SLOWNESS_ENV, "").strip():
        return slowness()
    return max(slowness(), measure())


def task_lifetime_s(factor: float, deadlines: Iterable[float]) -> int:
    """The lifetime of a task's sandboxes on a host `factor` times slower than a quiet one whose steps may each
    run up to `deadlines` (seconds, already scaled): the base lifetime scaled, and at least the longest deadline
    and a margin, within E2B's maximum."""
    longest = max(deadlines, default=0.0)
    lifetime = min(max(round(BASE_LIFETIME_S * factor), math.ceil(longest + MARGIN_S * factor)), MAX_LIFETIME_S)
    return max(round(lifetime * lifetime_scale()), 1)


def chosen_by_the_harness(lifetime_s: float | None) -> bool:
    """Whether a sandbox's lifetime can be one the harness chose: never shorter than its base lifetime (with the
    tests' scale). A shorter one a case asked for itself, to see the sandbox end (an orphan's 10 s): that expiry is
    what the case observes, not the host's slowness."""
    return lifetime_s is None or lifetime_s >= BASE_LIFETIME_S * lifetime_scale() - EXPIRED_SLACK_S


def expired_condition(
    sandbox_id: str, lifetime_s: float | None, method: str, path: str, status: int, past_s: float
) -> dict[str, Any]:
    """The condition a step takes (`WireProxy.take_conditions`) when the endpoint said a sandbox was gone
    `past_s` seconds after the lifetime `lifetime_s` the wire saw it given ran out."""
    return {
        "expired": True,
        "sandbox": sandbox_id,
        "lifetime_s": lifetime_s,
        "method": method,
        "path": path,
        "status": status,
        "past_s": round(past_s, 1),
    }


def expired_error(condition: dict[str, Any], error: str | None) -> str:
    """What a step failed by a sandbox the harness let expire says."""
    lifetime = condition.get("lifetime_s")
    shown = f"{lifetime:g} s" if isinstance(lifetime, int | float) else "lifetime"
    said = f"{condition.get('status')} to {condition.get('method')} {condition.get('path')}"
    return (
        f"{CAUSE}: the harness's lifetime {shown} for sandbox {condition.get('sandbox')} was too short for this host "
        f"(it ran out {condition.get('past_s')} s before the endpoint answered {said}): {error or 'the step failed'}"
    )


def expired_step(observed: StepResult, expired: Sequence[dict[str, Any]], not_passed: Collection[str]) -> StepResult:
    """`observed` with `details.expired_sandboxes`; a step that did not pass is `error` naming the expiry (its
    `cause` "sandbox expired"), whatever it observed: the endpoint answered as E2B does for a sandbox past its
    lifetime."""
    details = {**observed.details, "expired_sandboxes": list(expired)}
    if observed.outcome not in not_passed:
        return replace(observed, details=details)
    details["cause"] = CAUSE
    details.setdefault("observed_outcome", observed.outcome)
    return replace(observed, outcome="error", error=expired_error(expired[0], observed.error), details=details)
