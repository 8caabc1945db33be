"""Lifetimes that outlive a slow run, and an expiry the harness caused judged as its own (#43 item 4).

The run-level tests slow the embedded endpoint down honestly (its `latency` condition: every request waits
before the endpoint sees it, as on a busy host or a distant endpoint) and run a case that makes a sandbox of its
own with the harness's lifetime: with the harness's lifetimes the case passes; with the lifetimes forced short
(E2B_BENCH_LIFETIME_SCALE) the sandbox expires under the case, and the case is `error` "sandbox expired", never
the endpoint's failure.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from bench.preload import run_forked
from bench.remote import lifetimes
from bench.remote.ledger import SandboxLedger
from bench.remote.resume import step_deadlines
from bench.remote.transient import with_conditions
from bench.results import read_run
from bench.runners.manifest import load_steps
from bench.runners.protocol import StepResult

CASE = "behaviours/py-e2b-2.63.0/sync_create_envs_metadata"  # makes its own sandbox, then several calls on it
LATENCY_MS = 2500  # each request waits this long: the case's calls after its create outlast a 1 s lifetime


def run_case(tmp_path: Path, **env: str) -> Any:
    """The case's record from a run on an embedded endpoint of its own, every request slowed by LATENCY_MS."""
    results = tmp_path / "results"
    command = ["run", "behaviours", "--case", CASE, "--quirk", f"latency={LATENCY_MS}"]
    command += ["--results-dir", str(results), "--no-report"]
    child = run_forked(command, timeout_s=900, grace_s=30, env={**os.environ, **env})
    (made,) = [p for p in results.iterdir() if p.is_dir()]
    assert child.returncode in (0, 1), child.output[-3000:]
    run = read_run(made)
    (case,) = [c for c in run.cases if c.id == CASE]
    return case


def test_a_case_slowed_down_keeps_its_sandbox_for_as_long_as_it_uses_it(tmp_path: Path) -> None:
    case = run_case(tmp_path)

    assert (case.outcome, case.conformant) == ("pass", True), (case.error, json.dumps(case.details)[:800])


def test_a_sandbox_the_harness_let_expire_is_its_error_not_the_endpoints_failure(tmp_path: Path) -> None:
    # The harness's lifetimes scaled to their floor: 1 s, which the case's second call (2.5 s later) outlasts.
    case = run_case(tmp_path, **{lifetimes.LIFETIME_SCALE_ENV: "0.0001"})

    assert case.outcome == "error", (case.outcome, case.error)
    assert case.details["cause"] == "sandbox expired"
    assert case.error.startswith("sandbox expired: the harness's lifetime 1 s for sandbox ")
    assert "was too short for this host" in case.error
    (first, *_) = case.details["expired_sandboxes"]
    assert first["lifetime_s"] == 1 and first["status"] in lifetimes.GONE_STATUSES and first["past_s"] >= 0
    assert case.details["observed_outcome"] in ("fail", "error", "refused", "deviation")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_ledger_tells_a_lifetime_run_out_from_an_endpoint_that_ended_a_sandbox_early() -> None:
    clock = Clock()
    ledger = SandboxLedger(clock=clock)
    ledger.created("a", "behaviours", "py", 100.0)
    ledger.created("paused-at-end", "behaviours", "py", 100.0, pauses=True)
    ledger.created("killed", "behaviours", "py", 100.0)
    ledger.observe("DELETE", "/sandboxes/killed", 204, None)

    clock.now += 50  # half its lifetime: a gone answer now is the endpoint's
    early = ledger.past_lifetime("a", slack_s=1.0)
    clock.now += 49.5  # within the slack of its end
    at_end = ledger.past_lifetime("a", slack_s=1.0)
    clock.now += 30.5
    after = ledger.past_lifetime("a", slack_s=1.0)
    others = [ledger.past_lifetime(s, slack_s=1.0) for s in ("paused-at-end", "killed", "never-made")]
    ledger.observe("POST", "/sandboxes/a/timeout", 204, {"timeout": 300})
    given_again = ledger.past_lifetime("a", slack_s=1.0)

    assert early is None
    assert at_end == (100.0, -0.5)
    assert after == (100.0, 30.0)
    assert others == [None, None, None]
    assert given_again is None


def test_an_expiry_explains_a_failed_step_and_only_notes_a_passed_one() -> None:
    condition = lifetimes.expired_condition("sbx1", 122.0, "POST", "/process.Process/Start", 401, 3.25)
    failed = StepResult("s", "deviation", 10.0, "AuthenticationException: unauthorized", {}, True)
    passed = StepResult("s", "pass", 10.0, None, {}, True)

    judged = with_conditions(failed, [condition])
    kept = with_conditions(passed, [condition])

    assert judged.outcome == "error"
    assert judged.error == (
        "sandbox expired: the harness's lifetime 122 s for sandbox sbx1 was too short for this host (it ran out "
        "3.2 s before the endpoint answered 401 to POST /process.Process/Start): AuthenticationException: "
        "unauthorized"
    )
    assert judged.details["observed_outcome"] == "deviation"
    assert (kept.outcome, kept.details["expired_sandboxes"]) == ("pass", [condition])


@pytest.mark.parametrize("factor", [1.0, 2.5, 15.0])
def test_a_tasks_lifetime_outlasts_every_step_deadline_it_has(factor: float) -> None:
    # Every suite's steps as the harness gives them deadlines (its default step timeout, 90 s on a quiet host).
    tables = [("behaviours", "python"), ("behaviours", "ts"), ("quickstart", "python"), ("computer", "ts")]
    steps = [step for suite, language in tables for step in load_steps(suite, language)]
    deadlines = step_deadlines(steps, 90.0 * factor)

    lifetime = lifetimes.task_lifetime_s(factor, deadlines.values())

    assert max(deadlines.values()) > 90.0 * factor  # some step declares it takes longer than a typical one
    assert lifetime >= max(deadlines.values()) + lifetimes.MARGIN_S * factor or lifetime == lifetimes.MAX_LIFETIME_S
    assert lifetime >= lifetimes.BASE_LIFETIME_S * factor or lifetime == lifetimes.MAX_LIFETIME_S
