"""A runner survives its cases: an error a step did not handle (thrown, a promise nobody awaited, a thread's, an
async task's) fails that step, never the runner (both kits, small real runners in tests/fixtures/runners/); a
runner that still dies is restarted for the steps left, its death said at once and bounded; and a whole run
against an endpoint whose streams end without their end frame ends with every case its own verdict."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from run_cli import e2b_bench, only_run_dir

from bench.remote.faults import FAULTS_ENV
from bench.remote.resume import MAX_DEATHS, run_resuming
from bench.results import read_run
from bench.runners import RunnerSpec, StepResult, run_runner
from bench.runners.manifest import load_steps
from bench.runners.node import find_node
from bench.runners.protocol import Event, RunnerResult, make_task

JS_RUNNER = "js-e2b-2.51.0"
PY_RUNNER = "py-e2b-2.63.0"
NO_END_FRAME = "mutations=stream_no_end_frame"


def fixture(script: str, language: str = "python") -> RunnerSpec:
    return RunnerSpec(
        name=f"fixture-{Path(script).stem}", language=language, pins={}, entry=f"tests/fixtures/runners/{script}"
    )


def outcomes(results: list[StepResult] | dict[str, StepResult]) -> list[tuple[str, str, str | None]]:
    listed = list(results.values()) if isinstance(results, dict) else results
    return [(r.id, r.outcome, r.error) for r in listed]


# --- an error nobody handled fails its step, never the runner ---------------------------------------------


def test_node_kit_fails_the_step_whose_promise_or_callback_failed_and_keeps_the_runner() -> None:
    steps = ["kept_rejects", "callback_throws", "rejects_late", "next_step", "throws", "last_leaves_one"]
    task = make_task("quickstart", "fixture", "run-1", steps=steps, depends={})

    result = run_runner(fixture("strays.mjs", "js"), find_node(), task, step_timeout_s=60)

    assert outcomes(list(result.step_results())) == [
        ("kept_rejects", "fail", "TypeError: kept promise rejected"),
        ("callback_throws", "fail", "RangeError: thrown from a timer"),
        ("rejects_late", "pass", None),
        ("next_step", "pass", None),
        ("throws", "fail", "Error: raised by the step"),
        ("last_leaves_one", "pass", None),
    ]
    # Neither waited for what it was still awaiting (10 minutes): the error ended it at once.
    assert [result.steps[s]["details"]["unawaited"] for s in steps[:2]] == ["unhandledRejection", "uncaughtException"]
    assert all(result.steps[s]["duration_ms"] < 30_000 for s in steps[:2])
    # A rejection whose step had ended is said on the next step's event, the last one's on the footer.
    assert result.steps["next_step"]["details"] == {
        "ran": True,
        "late_errors": [
            {"step": "rejects_late", "kind": "unhandledRejection", "error": "Error: rejected after its step ended"}
        ],
    }
    assert result.footer is not None and result.footer["late_errors"] == [
        {"step": "last_leaves_one", "kind": "unhandledRejection", "error": "Error: after the last step"}
    ]
    # The runner ended on its own once its footer was out, though two steps left timers of 10 minutes.
    assert (result.exit_code, result.timed_out, result.protocol_errors) == (0, False, [])


def test_python_kit_fails_the_step_whose_thread_or_task_failed_and_keeps_the_runner() -> None:
    steps = ["thread_raises", "task_never_awaited", "cancelled", "raises", "passes"]
    task = make_task("quickstart", "fixture", "run-1", steps=steps, depends={})

    result = run_runner(fixture("strays.py"), sys.executable, task, step_timeout_s=60)

    assert outcomes(list(result.step_results())) == [
        ("thread_raises", "fail", "ZeroDivisionError: division by zero"),
        ("task_never_awaited", "fail", "LookupError: an async task nobody awaited"),
        ("cancelled", "fail", "CancelledError: cancelled under the step"),
        ("raises", "fail", "ValueError: raised by the step"),
        ("passes", "pass", None),
    ]
    assert [result.steps[s]["details"]["unawaited"][0]["kind"] for s in steps[:2]] == ["thread", "asyncio"]
    assert result.steps["cancelled"]["details"]["raised"] == {
        "exception": "CancelledError",
        "message": "cancelled under the step",
    }
    assert (result.exit_code, result.completed, result.protocol_errors) == (0, True, [])


# --- a runner that dies is restarted for the steps left ----------------------------------------------------

STEPS = ["s1", "s2", "s3", "s4"]


def resumed(options: dict[str, Any], depends: dict[str, list[str]] | None = None):
    task = make_task("quickstart", "fixture", "run-1", steps=STEPS, depends=depends or {}, options=options)
    lines: list[str] = []
    seen: list[Event] = []

    def once(current: dict[str, Any], heard: Any) -> RunnerResult:
        return run_runner(fixture("dies_in_step.py"), sys.executable, current, step_timeout_s=30, on_event=heard)

    results, runs = run_resuming(task, once, on_event=seen.append, on_restart=lines.append)
    return results, runs, lines


def test_the_step_a_runner_died_in_is_its_error_and_a_fresh_runner_runs_the_rest() -> None:
    results, runs, lines = resumed({"die_in": ["s2"]})

    died = "runner died in step s2: exit code 3; stderr tail: Fatal error in s2"
    assert outcomes(results) == [
        ("s1", "pass", None),
        ("s2", "error", died),
        ("s3", "pass", None),
        ("s4", "pass", None),
    ]
    assert [run.requested for run in runs] == [tuple(STEPS), ("s3", "s4")]
    assert results["s3"].details == {"ran_with": ["s3", "s4"]}  # on the restarted runner
    assert lines == ["runner fixture died in step s2 (exit 3); restarted for the remaining 2 steps"]


def test_a_runner_that_died_between_steps_blames_none_and_its_prerequisites_run_again() -> None:
    results, runs, lines = resumed({"die_after": "s2"}, depends={"s3": ["s1"], "s4": ["s1"]})

    assert outcomes(results) == [(s, "pass", None) for s in STEPS]
    assert [run.requested for run in runs] == [tuple(STEPS), ("s1", "s3", "s4")]
    assert results["s1"].details == {"ran_with": STEPS}  # a step keeps its first result
    assert lines == ["runner fixture died after step s2 (exit 3); restarted for the remaining 2 steps"]


def test_a_step_needing_the_one_a_runner_died_in_is_not_run() -> None:
    results, _, _ = resumed({"die_in": ["s2"]}, depends={"s3": ["s2"]})

    assert [(r.id, r.outcome, r.error) for r in results.values()][2:] == [
        ("s3", "error", "depends on s2"),
        ("s4", "pass", None),
    ]


def test_deaths_are_bounded_and_the_steps_left_say_the_runner_was_not_restarted_again() -> None:
    results, runs, lines = resumed({"die_first": True})

    assert len(runs) == MAX_DEATHS == 3
    died = [(s, "error", f"runner died in step {s}: exit code 3; stderr tail: Fatal error in {s}") for s in STEPS[:3]]
    given_up = "runner died before this step, not restarted after 3 deaths: exit code 3; stderr tail: Fatal error in s3"
    assert outcomes(results) == [*died, ("s4", "error", given_up)]
    assert lines == [
        "runner fixture died in step s1 (exit 3); restarted for the remaining 3 steps",
        "runner fixture died in step s2 (exit 3); restarted for the remaining 2 steps",
        "runner fixture died in step s3 (exit 3), 3 deaths: not restarted again, 1 step left not run",
    ]


# --- whole runs through the CLI ----------------------------------------------------------------------------


def test_a_killed_runner_is_restarted_its_later_cases_pass_and_the_terminal_says_so_at_once(
    served: dict[str, str], tmp_path: Path
) -> None:
    crash_after = "ts05_run_streaming_onStdout"
    done = e2b_bench(
        "run", "quickstart", "--runner", JS_RUNNER, "--results-dir", str(tmp_path), "--no-report",
        env={**served, FAULTS_ENV: json.dumps({"crash_after": crash_after})}, timeout=900,
    )  # fmt: skip

    run = read_run(only_run_dir(tmp_path))
    ids = [step.id for step in load_steps("quickstart", "ts") if not step.slow]
    after = ids[ids.index(crash_after) + 1 :]
    by_case = {case.case: case for case in run.cases}
    # Every case ran once, those after the kill on a restarted runner, and passed as without it (the restarted
    # runner is killed after the same step only if it runs it again: it does not, ts05 is no prerequisite).
    assert {case: by_case[case].outcome for case in ids} == {case: "pass" for case in ids}, done.stdout[-3000:]
    line = f"e2b-bench: runner {JS_RUNNER} died after step {crash_after} (killed by signal 9); restarted for the "
    assert f"{line}remaining {len(after)} steps" in done.stdout + done.stderr
    assert run.footer is not None and run.footer["status"] == "completed"


@pytest.fixture(scope="module")
def no_end_frame(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, str, float]:
    """One run of the behaviours (both languages) and the quickstart against an endpoint whose process streams end
    without their end frame: the run, its terminal and its wall time."""
    import time

    results = tmp_path_factory.mktemp("no-end-frame")
    started = time.monotonic()
    done = e2b_bench(
        "run", "behaviours", "quickstart", "--runner", PY_RUNNER, "--runner", JS_RUNNER, "--quirk", NO_END_FRAME,
        "--results-dir", str(results), "--no-report", timeout=1800,
    )  # fmt: skip
    return read_run(only_run_dir(results)), done.stdout + done.stderr, time.monotonic() - started


def test_streams_without_their_end_frame_leave_every_case_its_own_verdict_and_no_runner_dies(
    no_end_frame: tuple[Any, str, float],
) -> None:
    run, terminal, _ = no_end_frame

    selected = {
        (suite, runner, step.id)
        for suite in ("behaviours", "quickstart")
        for runner, language in ((PY_RUNNER, "python"), (JS_RUNNER, "ts"))
        for step in load_steps(suite, language)
        if not step.slow  # a run selects no slow case unless asked
    }
    recorded = [(case.suite, case.runner, case.case) for case in run.cases if case.suite != "housekeeping"]
    assert sorted(recorded) == sorted(selected)  # each once: none missing, none twice
    assert [case.id for case in run.cases if "runner died" in (case.error or "")] == []
    assert [case.id for case in run.cases if (case.error or "").startswith(("not run", "runner finished"))] == []
    assert "died" not in terminal
    assert run.footer is not None and run.footer["status"] == "completed"


def test_the_npm_run_streams_case_fails_with_its_message_and_the_npm_behaviours_after_it_run(
    no_end_frame: tuple[Any, str, float],
) -> None:
    run, _, _ = no_end_frame

    js = [case for case in run.cases if case.suite == "behaviours" and case.runner == JS_RUNNER]
    by_case = {case.case: case for case in js}
    streams = by_case["js_run_streams"]
    assert streams.outcome == "fail"
    assert streams.error is not None and "EndStreamResponse" in streams.error
    order = [step.id for step in load_steps("behaviours", "ts") if not step.slow]
    later = order[order.index("js_run_streams") + 1 :]
    assert later and all(by_case[case].duration_ms is not None for case in later)  # each reported by its runner
    assert any(by_case[case].outcome == "pass" for case in later)
