"""A hung case is one case, and so is a case its runner died in: a runner that outlives a step's deadline, or
dies (a crash, a kill, an exit before its footer), is restarted for the steps it had not reached, so one step
costs that step, not every step after it.

The hung step is `error` "no answer in N s" with what the wire showed at that moment; the step a runner died
in is `error` "runner died in step <id>: exit code N; stderr tail: ..." (a runner that died between steps
blames none); a step that needs it is `error` "depends on <id>" without running; the others run in a fresh
runner, their prerequisites run again first (those second results are not kept: a step has one result, its
first). Deaths are bounded: at the MAX_DEATHS-th the steps left keep the last runner's "runner died before this
step" and say it was not restarted again. Each restart is said at once (`on_restart`, one line).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import Any

from bench.runners.manifest import Step
from bench.runners.protocol import Event, RunnerResult, StepResult, reported_result

TYPICAL_STEP_S = 30.0  # what a step declaring no `expect_s` is allowed for in its deadline
MAX_DEATHS = 3  # deaths of one runner's task: it is restarted after each but the last; the steps left are not run

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
    on_restart: Callable[[str], None] = lambda line: None,
) -> tuple[dict[str, StepResult], list[RunnerResult]]:
    """Run `task` with `run_once(task, on_event)` until every step has its result, restarting after a hang
    or a death.

    `on_result` gets each step's final result as soon as it is known (reported steps as their event
    arrives); `evidence()` is added to the hung step's details (the wire at the deadline); `on_restart` gets
    one line for the terminal each time a runner is restarted (or, deaths used up, not). Returns the
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

    name = str(task.get("runner") or "")
    deaths = 0
    current = dict(task)
    while True:
        run = run_once(current, heard)
        runs.append(run)
        hung = run.timed_out and not run.stopped and run.hung_in is not None
        if run.died:
            deaths += 1
        if not hung and not (run.died and deaths < MAX_DEATHS):
            if run.died:
                left = _left(run, final)
                on_restart(f"runner {name} died {_where(run)} ({_exit(run)}), {deaths} deaths: not restarted "
                           f"again, {left} step{'s' * (left != 1)} left not run")  # fmt: skip
            for result in run.step_results():
                if run.died and not result.reported and result.id != run.in_step:
                    why = f"runner died before this step, not restarted after {deaths} deaths: {run.death}"
                    result = replace(result, error=why)
                settle(result)
            break
        if hung:
            culprit = run.hung_in
            assert culprit is not None
            why = f"depends on {culprit}"
            if culprit in final:  # a prerequisite that had passed hung when it ran again for the restarted runner
                why += f", which had no answer in {run.hung_after_s:g} s when it ran again"
            settle(_hung(run, culprit, evidence()))
            what = f"had no answer in {run.hung_after_s:g} s in step {culprit}"
        else:
            culprit = run.in_step
            why = f"depends on {culprit}"
            if culprit is not None and culprit in final:  # a prerequisite that had passed, when it ran again
                why += ", whose runner died when it ran again"
            if culprit is not None:
                settle(next(result for result in run.step_results() if result.id == culprit))
            what = f"died {_where(run)} ({_exit(run)})"
        for result in run.step_results():  # what it reported before it stopped answering
            if result.reported:
                settle(result)
        for step in steps:
            if culprit is not None and step not in final and culprit in _needs(step, depends):
                settle(StepResult(step, "error", None, why, {}, False))
        remaining = [step for step in steps if step not in final]
        if not remaining:
            break
        on_restart(f"runner {name} {what}; restarted for the remaining {len(remaining)} steps")
        wanted = set(remaining).union(*(_needs(step, depends) for step in remaining))
        current = {
            **task,
            "steps": [step for step in steps if step in wanted],
            "depends": {step: deps for step, deps in depends.items() if step in wanted},
        }
    return {step: final[step] for step in steps if step in final}, runs


def _where(run: RunnerResult) -> str:
    if run.in_step is not None:
        return f"in step {run.in_step}"
    done = [step for step in run.requested if step in run.steps]
    return f"after step {done[-1]}" if done else "before its first step"


def _exit(run: RunnerResult) -> str:
    code = run.exit_code
    return f"killed by signal {-code}" if code is not None and code < 0 else f"exit {code}"


def _left(run: RunnerResult, final: Mapping[str, StepResult]) -> int:
    return sum(step not in final and step not in run.steps and step != run.in_step for step in run.requested)


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
