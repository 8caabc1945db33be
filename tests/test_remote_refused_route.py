"""A 429/502/503 is the endpoint's moment only when requests of its kind were answered otherwise in the run: an
endpoint that answers 503 to every request of one route lacks that route, and the cases that need it are
conformance failures naming it (#27)."""

from __future__ import annotations

import json
from pathlib import Path

from run_cli import e2b_bench, only_run_dir

from bench.remote.transient import RouteAnswers, is_transient, with_conditions
from bench.results import read_run
from bench.runners.protocol import StepResult

RUNNER = "py-e2b-2.63.0"
ROUTE = "POST /sandboxes/{sandboxID}/timeout"
FAILED = StepResult("s", "fail", 10, "SandboxException: 503: unavailable", {}, True)
HANDED_ON = {"method": "POST", "path": "/sandboxes/abc/timeout", "status": 503, "retried": False}


def test_a_503_is_transient_only_when_its_route_was_answered_otherwise_in_the_run() -> None:
    answers = RouteAnswers()
    answers.add("POST", "/sandboxes/abc/timeout", 503)
    refused = with_conditions(FAILED, [HANDED_ON], answers)
    answers.add("POST", "/sandboxes/other/timeout", 204)  # later in the run, another sandbox: the route works
    moment = with_conditions(FAILED, [HANDED_ON], answers)

    assert (refused.outcome, refused.details["cause"]) == ("fail", f"the endpoint refuses every {ROUTE} (1 of 1 "
                                                           "requests of the run)")  # fmt: skip
    assert not is_transient(refused.details)
    assert (moment.outcome, moment.details["cause"]) == ("error", "endpoint transient (503)")


def test_a_route_answered_503_every_time_is_a_conformance_failure_naming_the_route(tmp_path: Path) -> None:
    done = e2b_bench("run", "behaviours", "--runner", RUNNER, "--case", f"behaviours/{RUNNER}/*_set_timeout",
                     "--quirk", f"unavailable_route={ROUTE}", "--no-report", "--results-dir", str(tmp_path),
                     timeout=600)  # fmt: skip

    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    run = read_run(only_run_dir(tmp_path))
    cases = [case for case in run.cases if case.suite == "behaviours"]
    # The wire log, a second path: how often the endpoint refused the route, and that it never answered it otherwise.
    exchanges = [json.loads(line) for line in (run.path / "wire" / f"{RUNNER}.jsonl").read_text().splitlines()]
    statuses = [e["status"] for e in exchanges if e["method"] == "POST" and e["url"].endswith("/timeout")]
    assert statuses and set(statuses) == {503}
    assert sorted(case.case for case in cases) == ["async_set_timeout", "sync_set_timeout"]
    cause = f"the endpoint refuses every {ROUTE} ({len(statuses)} of {len(statuses)} requests of the run)"
    for case in cases:
        assert not case.conformant and case.details["cause"] == cause
        assert case.error is not None and case.error.startswith(f"{cause}: ")
        # Run again on a fresh sandbox first (#42): it failed the same way, and says what the endpoint answered.
        assert case.error.endswith("(the endpoint answered 503 the service is unavailable, on the re-run too)")
        # failed after a 503 on its re-run too: run once more (rerun.RERUNS), the same every time
        assert [attempt["outcome"] for attempt in case.details["attempts"]] == ["fail", "fail", "fail"]
    assert "endpoint transient" not in done.stdout + done.stderr
