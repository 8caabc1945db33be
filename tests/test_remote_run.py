"""Runs that survive remote conditions, through the real CLI against the embedded endpoint: a case whose
command stream never ends is one `error` case (the rest keep their verdicts), a time budget ends the run
with every finished case kept, and a signal mid-run keeps every finished case, frameworks' included."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
from run_cli import REPO, e2b_bench, only_run_dir

from bench.housekeeping import tagged_sandboxes
from bench.localbox.server import LocalEndpoint
from bench.remote.slowness import SLOWNESS_ENV
from bench.results import read_run
from bench.runners.manifest import load_steps

RUNNER = "py-e2b-2.63.0"
FRAMEWORK = "pydantic-ai-harness-0.62.0"


DEADLINE_S = 30  # under the SDK's own 60 s command timeout, so the harness's deadline is what ends the wait


def test_a_case_whose_command_stream_never_ends_is_one_error_and_every_other_case_keeps_its_verdict(
    tmp_path: Path,
) -> None:
    # The embedded endpoint holds back the end of the first command stream of its life, forever. The host's
    # slowness is set, so the deadline is known (measured under load it could outgrow the SDK's timeout).
    done = e2b_bench(
        "run", "quickstart", "--runner", RUNNER, "--quirk", "stream_stall=1", "--step-timeout", str(DEADLINE_S),
        "--results-dir", str(tmp_path), "--no-report", env={SLOWNESS_ENV: "1"}, timeout=900,
    )  # fmt: skip

    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    run = read_run(only_run_dir(tmp_path))
    (hung,) = [case for case in run.cases if case.outcome != "pass"]
    assert (hung.outcome, hung.error) == ("error", f"no answer in {DEADLINE_S} s in step {hung.case}")
    # What the runner waited for: the command stream, still open at the deadline.
    assert [exchange["url"].rsplit("/", 2)[-2:] for exchange in hung.details["in_flight"]] == [
        ["process.Process", "Start"]
    ]
    # Every other case ran (those after the hang in a fresh runner) and passed, as without the quirk.
    selected = {step.id for step in load_steps("quickstart", "python")}
    assert {case.case for case in run.cases} == selected | {"leak_check"}
    assert run.footer is not None and run.footer["status"] == "completed"


def test_a_time_budget_ends_the_run_keeping_what_finished_and_names_the_budget_for_the_rest(tmp_path: Path) -> None:
    # tk04 waits 60 s on purpose: the half-minute budget runs out while it waits.
    started = time.monotonic()
    done = e2b_bench(
        "run", "tokens", "--include-slow", "-k", "tk03 or tk04", "--runner", RUNNER, "--max-minutes", "0.5",
        "--max-sandboxes", "3", "--results-dir", str(tmp_path), timeout=900,
    )  # fmt: skip

    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    assert time.monotonic() - started < 0.5 * 60 + 120  # it did not wait for tk04's minute and more
    run = read_run(only_run_dir(tmp_path))
    by_case = {case.case: case for case in run.cases}
    assert (
        by_case["tk04_rotated_out_token_expires_after_60s"].outcome,
        by_case["tk04_rotated_out_token_expires_after_60s"].error,
    ) == ("error", "not run: budget of 0.5 min reached")
    assert run.footer is not None
    assert (run.footer["status"], run.footer["stop_reason"]) == ("interrupted", "budget of 0.5 min reached")
    assert run.header["budget"] == {"max_sandboxes": 3, "max_minutes": 0.5}
    assert run.footer["cost"]["total_sandbox_seconds"] > 0
    assert by_case["leak_check"].outcome == "pass"
    latest = json.loads((tmp_path / "latest.json").read_text())
    assert Path(latest["run_dir"]) == run.path.resolve() and (run.path / "junit.xml").is_file()
    assert "budget of 0.5 min reached" in done.stdout
    # the case not run is told apart from a non-conformant one, in the list and in the verdict
    assert "1 case(s) not run (budget of 0.5 min reached): no verdict on them" in done.stdout
    assert "✘ cause" not in done.stdout
    assert done.stdout.splitlines()[-1].startswith("INTERRUPTED: 2 of 3 case(s) ran (1 not run), 0 not conformant;")
    assert "- cost: " in (run.path / "summary.md").read_text()


def started(command: list[str], endpoint: LocalEndpoint, results: Path) -> subprocess.Popen[str]:
    env = {**os.environ, **endpoint.env(), "E2B_BENCH_ENDPOINT": "env"}
    return subprocess.Popen(
        [sys.executable, "-m", "bench.cli", *command, "--results-dir", str(results)],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def recorded(results: Path) -> list[str]:
    """The lines of the run's cases.jsonl so far."""
    found = list(results.glob("*/cases.jsonl"))
    return found[0].read_text().splitlines() if found else []


def test_sigterm_keeps_every_finished_case_frameworks_included_and_records_the_rest_not_run(
    endpoint: LocalEndpoint, tmp_path: Path
) -> None:
    # tk04 keeps its runner busy for a minute; the framework's cases finish meanwhile.
    command = ["run", "tokens", "frameworks", "--include-slow", "-k", "tk04 or fw0", "--runner", RUNNER,
               "--runner", FRAMEWORK]  # fmt: skip
    process = started(command, endpoint, tmp_path)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and process.poll() is None:
        if any(json.loads(line)["suite"] == "frameworks" for line in recorded(tmp_path)):
            break
        time.sleep(0.1)
    before = recorded(tmp_path)
    assert any(json.loads(line)["suite"] == "frameworks" for line in before), process.communicate()[0][-3000:]

    process.send_signal(signal.SIGTERM)
    output = process.communicate(timeout=300)[0]

    assert process.returncode == 143, output[-3000:]
    run = read_run(only_run_dir(tmp_path))
    after = (run.path / "cases.jsonl").read_text().splitlines()
    assert after[: len(before)] == before  # what had finished is kept as it was
    assert run.footer is not None and run.footer["status"] == "interrupted"
    selected = {f"tokens/{RUNNER}/tk04_rotated_out_token_expires_after_60s"} | {
        f"frameworks/{FRAMEWORK}/{step}" for step in ("fw01_proof_task", "fw02_exit_code", "fw03_late_output")
    }
    assert {case.id for case in run.cases} == selected | {"housekeeping/harness/leak_check"}
    tk04 = next(case for case in run.cases if case.suite == "tokens")
    assert (tk04.outcome, tk04.error) == ("error", "not run: the run was interrupted")
    # Only sandboxes the harness did not end itself could be the endpoint's: here none is.
    (leak,) = [case for case in run.cases if case.case == "leak_check"]
    assert (leak.outcome, leak.details["survivors"]) == ("pass", [])
    assert set(run.footer["left_by_run"].values()) <= {"killed", "already gone"}
    with httpx.Client(base_url=endpoint.api_url, headers={"X-API-KEY": endpoint.api_key}) as client:
        assert tagged_sandboxes(client, run.run_id) == []
    assert json.loads((tmp_path / "latest.json").read_text())["status"] == "interrupted"
