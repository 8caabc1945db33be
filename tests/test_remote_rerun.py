"""Transient means it did not recur (#42): a step that failed after the endpoint handed it a 429/502/503 runs once
more in a fresh runner, on a fresh sandbox. A re-run that passes makes the first failure the endpoint's moment
(the case passes, both attempts recorded); one that fails again is the deviation it is, with what the endpoint
answered in its message (tests/test_computer_suite.py: a lost answer every time, exit 1)."""

from __future__ import annotations

import json
from pathlib import Path

from run_cli import e2b_bench, only_run_dir

from bench.remote.rerun import rerun_task, settle, wants_rerun
from bench.results import read_run
from bench.runners.protocol import StepResult

RUNNER = "py-e2b-2.63.0"
ANSWER = {"method": "DELETE", "path": "/sandboxes/abc", "status": 502, "retried": False, "message": "sandbox not found"}
RETRY = {"method": "POST", "path": "/sandboxes", "status": 429, "retried": True, "wait_ms": 1000}
FAILED = StepResult("py10_kill", "fail", 80.0, "SandboxException: 502: sandbox not found", {"kill": None}, True)


def test_a_step_is_run_again_after_a_handed_on_answer_and_so_are_the_steps_it_blocked() -> None:
    blocked = StepResult("py11_refusals", "error", 0.0, "depends on py10_kill", {}, True)

    assert wants_rerun(FAILED, [ANSWER])
    assert not wants_rerun(FAILED, [RETRY])  # retried through: the failure is the endpoint's own
    assert not wants_rerun(FAILED, [{**ANSWER, "capacity": True}])  # capacity is not a moment to re-run
    assert not wants_rerun(StepResult("py10_kill", "pass", 1.0, None, {}, True), [ANSWER])
    assert wants_rerun(blocked, [], held={"py10_kill"}) and not wants_rerun(blocked, [], held={"py09"})
    task = {"steps": ["py01_create", "py05", "py06", "py10_kill"], "depends": {"py06": ["py05", "py01_create"],
            "py05": ["py01_create"], "py10_kill": ["py01_create"]}}  # fmt: skip
    assert rerun_task(task, ["py06"]) == {
        "steps": ["py01_create", "py05", "py06"],
        "depends": {"py06": ["py05", "py01_create"], "py05": ["py01_create"]},
    }


def test_a_re_run_that_passes_is_the_pass_and_one_that_fails_again_says_what_the_endpoint_answered() -> None:
    passed = StepResult("py10_kill", "pass", 90.0, None, {"kill": True}, True)
    again = StepResult("py10_kill", "fail", 85.0, "SandboxException: 502: sandbox not found", {"kill": None}, True)

    moment = settle(FAILED, [ANSWER, ANSWER], passed, [RETRY])
    deviation = settle(FAILED, [ANSWER], again, [ANSWER])
    other = settle(FAILED, [ANSWER], StepResult("py10_kill", "fail", 85.0, "AssertionError: x", {}, True), [])

    assert (moment.outcome, moment.error, moment.duration_ms) == ("pass", None, 90.0)
    assert moment.details["kill"] is True
    assert moment.details["transient"] == (
        "endpoint transient (502): the first attempt failed after the endpoint answered 502 sandbox not found; "
        "the re-run on a fresh sandbox: pass"
    )
    answer = {"method": "DELETE", "path": "/sandboxes/abc", "status": 502, "message": "sandbox not found"}
    assert moment.details["attempts"] == [
        {"outcome": "fail", "error": FAILED.error, "duration_ms": 80.0, "answers": [{**answer, "times": 2}]},
        {"outcome": "pass", "error": None, "duration_ms": 90.0},
    ]
    assert moment.details["retries"] == [{"method": "POST", "path": "/sandboxes", "status": 429, "wait_ms": 1000}]
    assert deviation.outcome == "fail" and "cause" not in deviation.details
    assert deviation.error == (
        "SandboxException: 502: sandbox not found (the endpoint answered 502 sandbox not found, on the re-run too)"
    )
    assert deviation.details["transient_answers"] == [answer]
    assert (other.outcome, other.error) == ("fail", "AssertionError: x")  # failed otherwise: that failure, judged
    assert len(other.details["attempts"]) == 2


def test_transient_answers_that_do_not_recur_leave_every_case_conformant_and_the_run_exits_0(tmp_path: Path) -> None:
    # A seeded 30% of control-plane requests answer 502/503: the proxy retries creates and reads through them; a
    # kill it cannot retry fails once (and the step that needs it is not run), then both pass on a fresh runner.
    done = e2b_bench("run", "sandboxes/e2b/test_quickstart.py", "--runner", RUNNER, "--quirk", "transient_5xx=0.3",
                     "--no-report", "--results-dir", str(tmp_path), timeout=900)  # fmt: skip

    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-3000:]
    run = read_run(only_run_dir(tmp_path))
    assert all(case.conformant and case.outcome == "pass" for case in run.cases)
    again = {case.case: case.details for case in run.cases if "attempts" in case.details}
    assert again, "no step failed after a 502/503: the quirk did not reach a call the proxy hands on"
    # The wire log, a second path: each first attempt's answers are lines of it, with what the endpoint said.
    exchanges = [json.loads(line) for line in (run.path / "wire" / f"{RUNNER}.jsonl").read_text().splitlines()]
    refused = {(e["method"], e["url"].split("/", 3)[-1], e["status"]) for e in exchanges if e["status"] in (502, 503)}
    for details in again.values():
        # a re-run that met another 502/503 and failed ran once more (rerun.RERUNS): the last attempt passed
        first, *between, last = details["attempts"]
        assert last["outcome"] == "pass" and first["outcome"] in ("fail", "error") and len(between) <= 1
        assert details["transient"].startswith("endpoint transient (")
        for answer in first.get("answers", []):
            assert (answer["method"], answer["path"].lstrip("/"), answer["status"]) in refused
            assert answer["message"] == "the endpoint is temporarily unavailable, try again"
    held = [name for name, details in again.items() if not details["attempts"][0].get("answers")]
    assert all(again[name]["attempts"][0]["error"].startswith("depends on ") for name in held)
    assert "running again on a fresh sandbox, after a 429/502/503 answer: " in output
