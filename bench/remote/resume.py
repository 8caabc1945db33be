"""A hung case is one case: a runner that outlives a step's deadline is restarted for the steps it had
not reached, so one step that never answers costs that step, not every step after it.

The hung step is `error` "no answer in N s" with what the wire showed at that moment; a step that needs
it is `error` "depends on <id>" without running; the others run in a fresh runner, their prerequisites
run again first (those second results are not kept: a step has one result, its first).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import Any

from bench.runners.manifest import Step
from bench.runners.protocol import Event, RunnerResult, StepResult, reported_result

TYPICAL_STEP_S = 30.0  # what a step declaring no `expect_s` is allowed for in its deadline

RunOnce = Callable[[dict[str, Any], Callable[[Event], None]], RunnerResult]


def step_deadlines(steps: Iterable[Step], deadline_s: float) -> dict[str, float]:
    """Each step's deadline: `deadline_s` (already scaled by the host's slowness), stretched for a step whose
    manifest says it takes longer than a typical one (`expect_s`)."""
    return {step.id: deadline_s * max(step.expect_s or 0.0, TYPICAL_STEP_S) / TYPICAL_STEP_S for step in steps}


def run_resuming(
    task: Mapping[str, Any],
    run_once: RunOnce,
    on_result: Callable[[StepResult], None] = lambda result: None,
    on_event: Callable[[Event], None] = lambda event: None,
    evidence: Callable[[], dict[str, Any]] = dict,
) -> tuple[dict[str, StepResult], list[RunnerResult]]:
    """Run `task` with `run_once(task, on_event)` until every step has its result, restarting after a hang.

    `on_result` gets each step's final result as soon as it is known (reported steps as their event
    arrives); `evidence()` is added to the hung step's details (the wire at the deadline). Returns the
    result of every step of `task` and every runner run."""
    steps: list[str] = list(task.get("steps") or ())
    depends: dict[str, list[str]] = {k: list(v) for k, v in (task.get("depends") or {}).items()}
    final: dict[str, StepResult] = {}
    runs: list[RunnerResult] = []

    def settle(result: StepResult) -> None:
        if result.id not in final:
            final[result.id] = result
            on_result(result)

    def heard(event: Event) -> None:
        on_event(event)  # first: a step's end is noted (its wire evidence window) before its case is recorded
        if event.get("type") == "step" and event.get("id") in steps:
            settle(reported_result(event))

    current = dict(task)
    while True:
        run = run_once(current, heard)
        runs.append(run)
        if not run.timed_out or run.stopped or run.hung_in is None:
            for result in run.step_results():
                settle(result)
            break
        hung = run.hung_in
        why = f"depends on {hung}"
        if hung in final:  # a prerequisite that had passed hung when it ran again for the restarted runner
            why += f", which had no answer in {run.hung_after_s:g} s when it ran again"
        settle(_hung(run, hung, evidence()))
        for step in steps:
            if step not in final and hung in _needs(step, depends):
                settle(StepResult(step, "error", None, why, {}, False))
        remaining = [step for step in steps if step not in final]
        if not remaining:
            break
        wanted = set(remaining).union(*(_needs(step, depends) for step in remaining))
        current = {
            **task,
            "steps": [step for step in steps if step in wanted],
            "depends": {step: deps for step, deps in depends.items() if step in wanted},
        }
    return {step: final[step] for step in steps if step in final}, runs


def _hung(run: RunnerResult, step: str, evidence: Mapping[str, Any]) -> StepResult:
    result = next(result for result in run.step_results() if result.id == step)
    details = {**result.details, **evidence, "deadline_s": run.hung_after_s}
    return replace(result, details=details)


def _needs(step: str, depends: Mapping[str, list[str]]) -> set[str]:
    """Every step `step` needs, directly or through another."""
    found: set[str] = set()
    pending = list(depends.get(step, ()))
    while pending:
        dep = pending.pop()
        if dep not in found:
            found.add(dep)
            pending.extend(depends.get(dep, ()))
    return found
