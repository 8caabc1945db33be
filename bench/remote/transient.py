"""A step's result seen with what the endpoint's conditions did during it (the wire proxy's retries and the
transient answers it handed on): the retries are recorded with the case. A step that failed after a transient
answer reached it is run again first (bench/remote/rerun.py): only one that could not run again is recorded here
as the endpoint's moment (`endpoint transient (502)`), unconfirmed.

A moment, not a rule: a 429/502/503 is transient only when requests of its kind (its method and route, ids
as placeholders) were answered otherwise in the same run, before or after it. An endpoint that answers 503
to every `POST /sandboxes/{sandboxID}/pause` of a run does not implement pause: such a case is a
conformance failure whose cause names the route (`RouteAnswers`, judged once the run's answers are all in).
"""

from __future__ import annotations

import re
import threading
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from functools import cache
from typing import Any

from ..coverage import load_operations
from ..runners.protocol import StepResult
from . import capacity, lifetimes
from .retry import RATE_LIMITED, TRANSIENT, transient_cause

ID_SEGMENT = re.compile(r"(/(?:sandboxes|snapshots|templates|contexts|builds|volumes)/)[^/]+")


@cache
def _spec_routes() -> tuple[tuple[str, re.Pattern[str]], ...]:
    """Every route of the specification, most specific first, as a pattern over request paths."""
    routes = sorted({op["route"] for op in load_operations()}, key=lambda route: (route.count("{"), route))
    return tuple(
        (route, re.compile("^" + re.sub(r"\\\{[^}]+\\\}", "[^/]+", re.escape(route)) + "$")) for route in routes
    )


def route_of(path: str) -> str:
    """A request path as its route: the specification's (`/sandboxes/{sandboxID}/pause`), else the path with
    the ids after a collection name as placeholders."""
    path = path.split("?", 1)[0]
    for route, pattern in _spec_routes():
        if pattern.match(path):
            return route
    return ID_SEGMENT.sub(r"\1{id}", path)


def is_gateway_answer(status: int) -> bool:
    """An answer a distant endpoint gives for a moment (rate limit, a gateway's 502/503)."""
    return status == RATE_LIMITED or status in TRANSIENT


class RouteAnswers:
    """How the endpoint answered each kind of request (method, route) in the run, across every runner's proxy."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._answers: Counter[tuple[str, str, bool]] = Counter()  # (method, route, a gateway answer?) -> how many

    def add(self, method: str, path: str, status: int) -> None:
        with self._lock:
            self._answers[(method, route_of(path), is_gateway_answer(status))] += 1

    def systematic(self, method: str, path: str) -> str | None:
        """When no request of this kind was ever answered other than 429/502/503: the sentence naming it."""
        route = route_of(path)
        with self._lock:
            answered, refused = self._answers[(method, route, False)], self._answers[(method, route, True)]
        if answered or not refused:
            return None
        return f"the endpoint refuses every {method} {route} ({refused} of {refused} requests of the run)"


FAILED = frozenset({"fail", "error"})
NOT_PASSED = frozenset({"fail", "error", "refused", "deviation"})  # what a capacity 429 or a re-run may explain
CAUSE_PREFIX = "endpoint transient ("


def is_transient(details: dict[str, Any]) -> bool:
    """Was this case's failure only the endpoint's transient answer?"""
    return str(details.get("cause", "")).startswith(CAUSE_PREFIX)


def at_capacity(details: dict[str, Any]) -> bool:
    """Was this case's failure only the endpoint's capacity (a create refused for a concurrency limit)?"""
    return details.get("cause") == capacity.CAUSE


def transient_only(failed: Sequence[dict[str, Any]]) -> str | None:
    """When every non-conformant case (their `details`) failed only by a transient answer (or the endpoint's
    capacity): the sentence that says so (the run is then no conformance verdict, exit 2), else None."""
    no_verdict = all(at_capacity(details) or is_transient(details) for details in failed)
    if failed and no_verdict and any(at_capacity(details) for details in failed):
        return (
            f"{len(failed)} case(s) failed only because the endpoint answered 429/502/503 (its capacity, or a "
            "moment) (see details.cause): no conformance verdict on them; re-run with a lower --max-sandboxes"
        )
    if not failed or not all(is_transient(details) for details in failed):
        return None
    return (
        f"{len(failed)} case(s) failed only because the endpoint answered 429/502/503 where no retry was due and "
        "could not be run again (see details.cause): no conformance verdict on them; re-run when the endpoint is steady"
    )


def with_conditions(
    observed: StepResult, conditions: Sequence[dict[str, Any]], answers: RouteAnswers | None = None
) -> StepResult:
    """`observed` with `details.retries` (each retry made during the step) and, when a transient answer was
    handed on to a step that then failed, outcome `error` and `details.cause` "endpoint transient (502)".
    With the run's `answers`: a step failed by a kind of request the endpoint never answered otherwise keeps
    its outcome (a conformance failure) with that route as its cause."""
    if not conditions:
        return observed
    expired = [c for c in conditions if c.get("expired")]
    if expired:  # the harness let a sandbox expire under the step: its doing, whatever else the endpoint said
        return lifetimes.expired_step(observed, expired, NOT_PASSED)
    details = dict(observed.details)
    retries = [c for c in conditions if c.get("retried")]
    handed_on = [c for c in conditions if not c.get("retried")]
    if retries:
        details["retries"] = [{k: v for k, v in c.items() if k != "retried"} for c in retries]
    if handed_on:
        details["transient_answers"] = [{k: v for k, v in c.items() if k != "retried"} for c in handed_on]
    if not handed_on or observed.outcome not in NOT_PASSED:
        return replace(observed, details=details)
    full = next((c for c in handed_on if c.get("capacity")), None)
    if full is not None:  # capacity is not conformance: never `refused`, `fail` or a cause of its own
        details["cause"] = capacity.CAUSE
        details.setdefault("observed_outcome", observed.outcome)
        said = f"429 {full.get('message') or ''}".strip()
        error = f"{capacity.PREFIX} ({said}): {observed.error or 'the step failed'}"
        return replace(observed, outcome="error", error=error, details=details)
    if observed.outcome not in FAILED:
        return replace(observed, details=details)
    refused = [answers.systematic(c["method"], c["path"]) for c in handed_on] if answers is not None else []
    systematic = next((sentence for sentence in refused if sentence), None)
    if systematic is not None:
        details["cause"] = systematic
        return replace(observed, error=f"{systematic}: {observed.error or 'the step failed'}", details=details)
    cause = transient_cause(int(handed_on[0]["status"]))
    details["cause"] = cause
    details.setdefault("observed_outcome", observed.outcome)
    return replace(observed, outcome="error", error=f"{cause}: {observed.error or 'the step failed'}", details=details)
