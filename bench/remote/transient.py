"""A step's result seen with what the endpoint's conditions did during it (the wire proxy's retries and the
transient answers it handed on): the retries are recorded with the case, and a step that failed after a
transient answer reached it failed because of the endpoint's moment, not its conformance."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from ..runners.protocol import StepResult
from .retry import transient_cause

FAILED = frozenset({"fail", "error"})
CAUSE_PREFIX = "endpoint transient ("


def is_transient(details: dict[str, Any]) -> bool:
    """Was this case's failure only the endpoint's transient answer?"""
    return str(details.get("cause", "")).startswith(CAUSE_PREFIX)


def transient_only(failed: Sequence[dict[str, Any]]) -> str | None:
    """When every non-conformant case (their `details`) failed only by a transient answer: the sentence that
    says so (the run is then no conformance verdict, exit 2), else None."""
    if not failed or not all(is_transient(details) for details in failed):
        return None
    return (
        f"{len(failed)} case(s) failed only because the endpoint answered 429/502/503 where no retry was due "
        "(see details.cause): no conformance verdict on them; re-run when the endpoint is steady"
    )


def with_conditions(observed: StepResult, conditions: Sequence[dict[str, Any]]) -> StepResult:
    """`observed` with `details.retries` (each retry made during the step) and, when a transient answer was
    handed on to a step that then failed, outcome `error` and `details.cause` "endpoint transient (502)"."""
    if not conditions:
        return observed
    details = dict(observed.details)
    retries = [c for c in conditions if c.get("retried")]
    handed_on = [c for c in conditions if not c.get("retried")]
    if retries:
        details["retries"] = [{k: v for k, v in c.items() if k != "retried"} for c in retries]
    if handed_on:
        details["transient_answers"] = [{k: v for k, v in c.items() if k != "retried"} for c in handed_on]
    if not handed_on or observed.outcome not in FAILED:
        return replace(observed, details=details)
    cause = transient_cause(int(handed_on[0]["status"]))
    details["cause"] = cause
    details.setdefault("observed_outcome", observed.outcome)
    return replace(observed, outcome="error", error=f"{cause}: {observed.error or 'the step failed'}", details=details)
