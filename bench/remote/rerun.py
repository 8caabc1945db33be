"""Transient means it did not recur: a step that failed after the endpoint handed it a 429, 502 or 503 is run
once more by a fresh runner (its prerequisites first, as a restart after a hang runs them: bench/remote/resume.py),
so on a fresh sandbox, before its case is recorded.

Only a re-run that passes makes the first failure the endpoint's moment: the case is recorded with the re-run's
result, `details.transient` saying so and `details.attempts` holding both attempts. A re-run that fails is the
deviation it is, judged as any failure, its message saying what the endpoint answered when it failed again the
same way ("… (the endpoint answered 502 sandbox not found, on the re-run too)"); a re-run that failed after a
429/502/503 again runs once more (`RERUNS`): a random gateway error met twice in a row (the `remote-e2b` profile's
1 %, seeded, once in CI) is no deviation, a deterministic one fails every time. A step that could not be run
again (the run stopping, a runner that never reported it) keeps its first result: `endpoint transient (502)`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import replace
from typing import Any, NamedTuple

from bench.runners.protocol import Event, RunnerResult, StepResult

from .resume import RunOnce, _needs, run_resuming
from .transient import NOT_PASSED as FAILED

Conditions = list[dict[str, Any]]
BLOCKED = re.compile(r"depends on (?P<step>[^\s,]+)")  # a runner's word for a step it did not run (runkit)


class Settled(NamedTuple):
    """A re-run step's result. `again`: it ran again, and `conditions` are the 429/502/503 answers its re-run
    failed after (judged once more when the run's answers are all in: a route never answered otherwise is a
    refused route); else it keeps its first result and `conditions` are still to be applied to it."""

    result: StepResult
    conditions: Conditions
    again: bool


ANSWER_WORDS = 120  # characters of the endpoint's message an attempt keeps


def handed_on(conditions: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The 429/502/503 answers the wire proxy handed on to the runner (not retried through, not capacity)."""
    return [c for c in conditions if not c.get("retried") and not c.get("capacity")]


def wants_rerun(observed: StepResult, conditions: Sequence[dict[str, Any]], held: Collection[str] = ()) -> bool:
    """Is this step run again: it failed after the endpoint handed it a transient-looking answer, or it was not
    run because a step it needs is `held` for a re-run (so it runs again after that one)?"""
    if not observed.reported or observed.outcome not in FAILED:
        return False
    blocked = BLOCKED.match(observed.error or "")
    return bool(handed_on(conditions)) or (blocked is not None and blocked["step"] in held)


def rerun_task(task: Mapping[str, Any], steps: Sequence[str]) -> dict[str, Any]:
    """`task` narrowed to `steps` and every step they need, in the task's order."""
    depends: dict[str, list[str]] = {k: list(v) for k, v in (task.get("depends") or {}).items()}
    wanted = set(steps).union(*(_needs(step, depends) for step in steps))
    return {
        **task,
        "steps": [step for step in task.get("steps") or () if step in wanted],
        "depends": {step: deps for step, deps in depends.items() if step in wanted},
    }


def answered(condition: Mapping[str, Any]) -> str:
    """One answer as the endpoint gave it: `502 sandbox not found`."""
    message = " ".join(str(condition.get("message") or "").split())[:ANSWER_WORDS]
    return f"{condition['status']} {message}".strip()


def attempt(observed: StepResult, conditions: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One attempt as `details.attempts` records it."""
    shown: dict[str, Any] = {"outcome": observed.outcome, "error": observed.error, "duration_ms": observed.duration_ms}
    answers: list[dict[str, Any]] = []
    for condition in handed_on(conditions):  # one line per different answer, with how many times it came
        answer: dict[str, Any] = {k: condition[k] for k in ("method", "path", "status", "message") if k in condition}
        same = next((a for a in answers if {k: v for k, v in a.items() if k != "times"} == answer), None)
        if same is None:
            answers.append({**answer, "times": 1})
        else:
            same["times"] += 1
    if answers:
        shown["answers"] = answers
    return shown


def settle(
    first: StepResult, first_conditions: Conditions, second: StepResult, second_conditions: Conditions
) -> StepResult:
    """The result a re-run step is judged by: the re-run's, with both attempts in `details.attempts`; a re-run that
    passed names the first failure `details.transient`; one failed again after a 429/502/503 says so."""
    attempts = [attempt(first, first_conditions), attempt(second, second_conditions)]
    details = {**second.details, "attempts": attempts}
    retries = [{k: v for k, v in c.items() if k != "retried"} for c in second_conditions if c.get("retried")]
    if retries:
        details["retries"] = retries
    if second.outcome not in FAILED:
        first_answers = handed_on(first_conditions)
        if first_answers:
            why = f"({first_answers[0]['status']}): the first attempt failed after the endpoint answered "
            why += answered(first_answers[0])
        else:  # held because a step it needs was: it never ran the first time
            why = f"(before it): the first attempt did not run ({first.error}), which failed after a 429/502/503"
        details["transient"] = f"endpoint transient {why}; the re-run on a fresh sandbox: {second.outcome}"
        return replace(second, details=details)
    again = handed_on(second_conditions)
    if not again:
        return replace(second, details=details)
    details["transient_answers"] = [{k: v for k, v in c.items() if k != "retried"} for c in again]
    error = f"{second.error or 'the step failed'} (the endpoint answered {answered(again[0])}, on the re-run too)"
    return replace(second, error=error, details=details)


# Runs of a failed step after its first: a failure seen again after another 429/502/503 gets one more (a random
# gateway error met twice in a row is rare, a deterministic one is met every time).
RERUNS = 2


def rerun(
    task: Mapping[str, Any],
    failed: Mapping[str, tuple[StepResult, Conditions]],
    run_once: RunOnce,
    take_conditions: Callable[[str], Conditions],
    on_event: Callable[[Event], None] = lambda event: None,
    evidence: Callable[[], dict[str, Any]] = dict,
) -> tuple[dict[str, Settled], list[RunnerResult]]:
    """Run the `failed` steps (step -> first result and the conditions around it) again in a fresh runner.
    `take_conditions(step)`: what the endpoint's conditions did while the step ran again (taken at its event)."""
    settled: dict[str, Settled] = {}
    runs: list[RunnerResult] = []
    earlier: dict[str, list[dict[str, Any]]] = {}  # attempts before the pair a round settles
    pending = dict(failed)
    for round_ in range(RERUNS):
        results, ran = run_resuming(rerun_task(task, list(pending)), run_once, on_event=on_event, evidence=evidence)
        runs += ran
        again: dict[str, tuple[StepResult, Conditions]] = {}
        for step, (first, first_conditions) in pending.items():
            second = results.get(step)
            second_conditions = take_conditions(step)
            if second is None or not second.reported:  # never ran again: the first result, as it was
                why = second.error if second is not None else "not run again"
                settled[step] = Settled(
                    replace(first, details={**first.details, "rerun": why}), first_conditions, False
                )
                continue
            result = settle(first, first_conditions, second, second_conditions)
            if step in earlier:
                result.details["attempts"] = [*earlier[step], *result.details["attempts"][1:]]
            # failed again, and again after a 429/502/503: a moment met twice or the endpoint's rule; once more
            if result.outcome in FAILED and handed_on(second_conditions) and round_ + 1 < RERUNS:
                earlier[step] = list(result.details["attempts"])
                again[step] = (second, second_conditions)
                continue
            settled[step] = Settled(
                result, list(handed_on(second_conditions)) if result.outcome in FAILED else [], True
            )
        pending = again
        if not pending:
            break
    return settled, runs
