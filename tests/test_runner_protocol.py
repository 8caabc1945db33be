"""run_runner against small real runner scripts (tests/fixtures/runners/)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import Any

import pytest

from bench.results import schema_errors
from bench.runners import RunnerSpec, StepResult, run_runner
from bench.runners.catalog import available_runners
from bench.runners.protocol import ProtocolError, make_task

STEPS = ["s1", "s2", "s3", "s4"]


def fixture_runner(script: str) -> RunnerSpec:
    return RunnerSpec(name=f"fixture-{script}", language="python", pins={}, entry=f"tests/fixtures/runners/{script}.py")


def run(script: str, *, step_timeout_s: float = 10.0, options: dict[str, Any] | None = None, **kwargs: Any):
    task = make_task("quickstart", "fixture", "run-1", steps=STEPS, depends={}, options=options or {"k": "v"})
    return run_runner(fixture_runner(script), sys.executable, task, step_timeout_s=step_timeout_s, **kwargs)


def outcomes(results: list[StepResult]) -> list[tuple[str, str, str | None]]:
    return [(r.id, r.outcome, r.error) for r in results]


def test_well_behaved_runner_reports_every_step_and_passes_other_events_through() -> None:
    seen: list[str] = []

    result = run("well_behaved", on_event=lambda event: seen.append(event["type"]))

    assert outcomes(list(result.step_results())) == [(s, "pass", None) for s in STEPS]
    assert seen == ["hello", "transcript", "step", "step", "step", "step", "footer"]
    assert result.steps["s1"]["details"] == {"echo": {"k": "v"}}
    assert (result.exit_code, result.timed_out, result.completed) == (0, False, True)
    assert result.stderr_tail == "runner log line on stderr"
    assert result.protocol_errors == []


def test_runner_that_dies_midway_leaves_error_steps_with_exit_code_and_stderr() -> None:
    result = run("dies_midway")

    died = "runner died before this step: exit code 3; stderr tail: Fatal Python error: Segmentation fault"
    assert outcomes(list(result.step_results())) == [
        ("s1", "pass", None),
        ("s2", "pass", None),
        ("s3", "error", died),
        ("s4", "error", died),
    ]
    assert (result.footer, result.exit_code, result.timed_out) == (None, 3, False)
    # One runner process; a run restarts it for the steps left (tests/test_runner_survives.py).
    assert (result.died, result.in_step) == (True, None)


def test_runner_that_hangs_is_killed_and_names_the_step_it_hung_in() -> None:
    started = time.monotonic()

    result = run("hangs", step_timeout_s=3.0)  # well above the first step's time, even on a loaded machine

    assert time.monotonic() - started < 30  # it did not wait for the endless step (600 s)
    assert outcomes(list(result.step_results())) == [
        ("s1", "pass", None),
        ("s2", "error", "no answer in 3 s in step s2"),
        ("s3", "error", "not run: runner timed out in s2"),
        ("s4", "error", "not run: runner timed out in s2"),
    ]
    assert (result.timed_out, result.hung_in, result.exit_code) == (True, "s2", -15)
    assert result.stderr_tail == "entering the endless step"


def test_runner_ignoring_sigterm_is_killed_after_the_grace_period() -> None:
    started = time.monotonic()

    result = run("hangs", step_timeout_s=3.0, options={"ignore_sigterm": True}, kill_grace_s=0.5)

    assert time.monotonic() - started < 30  # it did not wait for the endless step (600 s)
    assert (result.timed_out, result.exit_code) == (True, -9)


def test_garbage_on_stdout_is_recorded_as_protocol_errors_not_a_crash() -> None:
    result = run("garbage")

    assert outcomes(list(result.step_results())) == [(s, "pass", None) for s in STEPS]
    assert result.protocol_errors == [
        "stdout line 2 is not JSON: 'Downloading something... 100%'",
        "stdout line 3 is not an event object: '[1, 2, 3]'",
        "stdout line 4: step event s1 does not match event.schema.json: $: 'duration_ms' is a required property; "
        "$: 'error' is a required property; $: 'details' is a required property; "
        "$.outcome: 'maybe' is not one of ['pass', 'fail', 'refused', 'deviation', 'error', 'skip']",
        "stdout line 5: progress event does not match event.schema.json: "
        "$.type: 'progress' is not one of ['hello', 'start', 'step', 'footer', 'transcript', 'sample', 'measure']",
    ]
    assert result.completed


def test_runner_that_cannot_start_reports_every_step_as_not_run_with_the_reason() -> None:
    spec = RunnerSpec(name="missing", language="python", pins={}, entry="tests/fixtures/runners/absent.py")

    task = make_task("quickstart", "missing", "run-1", steps=["s1"], depends={})
    result = run_runner(spec, sys.executable, task, step_timeout_s=5)

    [only] = list(result.step_results())
    assert only.outcome == "error"
    assert only.error is not None
    assert only.error.startswith("not run: the runner could not start (exit code 2 before it said hello; stderr tail: ")
    assert "absent.py" in only.error
    assert "absent.py" in only.error


def test_a_task_carries_the_protocol_version_and_the_run_tag_and_matches_its_schema() -> None:
    task = make_task("quickstart", "py-e2b-2.63.0", "run-7", steps=["s1", "s2"], depends={"s2": ["s1"]}, options={})

    assert task == {
        "protocol": 1,
        "suite": "quickstart",
        "runner": "py-e2b-2.63.0",
        "run_id": "run-7",
        "metadata": {"e2b-bench-run": "run-7"},
        "steps": ["s1", "s2"],
        "depends": {"s2": ["s1"]},
        "options": {},
    }
    assert schema_errors("task", task) == []


def test_a_task_the_schema_refuses_is_never_sent() -> None:
    spec = fixture_runner("well_behaved")
    unversioned = {"suite": "quickstart", "steps": STEPS, "depends": {}, "options": {}}

    with pytest.raises(ProtocolError, match="'protocol' is a required property"):
        run_runner(spec, sys.executable, unversioned, step_timeout_s=5)


def test_a_hello_of_another_protocol_version_is_a_protocol_error() -> None:
    result = run("other_protocol")

    assert result.hello is None
    assert result.protocol_errors == [
        "stdout line 1: hello event does not match event.schema.json: $.protocol: 1 was expected"
    ]
    assert outcomes(list(result.step_results())) == [(s, "pass", None) for s in STEPS]


@pytest.mark.parametrize("name", ["py-e2b-2.63.0", "js-e2b-2.51.0"])
def test_each_runner_kit_refuses_a_task_of_another_protocol_version_and_says_so_in_its_footer(name: str) -> None:
    runner = available_runners()[name]
    unversioned = {"suite": "quickstart", "runner": name, "run_id": "t", "steps": [], "depends": {}}

    done = subprocess.run(
        [str(runner.prepare()), str(runner.spec.entry_path)],
        input=json.dumps(unversioned),
        env=runner.environment({}),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    assert done.returncode == 2
    assert [json.loads(line) for line in done.stdout.splitlines()] == [
        {"type": "footer", "completed": False, "reason": "task is not protocol 1"}
    ]
    assert "runner: task is not protocol 1" in done.stderr


@pytest.mark.parametrize("name", ["py-e2b-2.63.0", "js-e2b-2.51.0"])
def test_each_runner_kit_stamps_a_steps_start_on_the_hosts_clock(name: str) -> None:
    runner = available_runners()[name]
    task = make_task("quickstart", name, "t", steps=["no_such_step"], depends={})
    before = time.time()

    done = subprocess.run(
        [str(runner.prepare()), str(runner.spec.entry_path)],
        input=json.dumps(task),
        env=runner.environment({}),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )

    after = time.time()
    events = [json.loads(line) for line in done.stdout.splitlines()]
    assert [(event["type"], event.get("id")) for event in events] == [
        ("hello", None), ("start", "no_such_step"), ("step", "no_such_step"), ("footer", None),
    ]  # fmt: skip
    assert all(schema_errors("event", event) == [] for event in events)
    assert before <= events[1]["at"] <= after
