"""SIGTERM (what `timeout`, GitLab and Jenkins send) ends a run like Ctrl-C: runners and their sandboxes
stopped, footer `interrupted`, JUnit, summary and report written; exit 143 for SIGTERM, 130 for Ctrl-C
(128 + the signal); a second signal exits at once. A signal after the last case lets the results be written
as the run ended, then exits with the signal's code."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from run_cli import REPO, only_run_dir

from bench.housekeeping import tagged_sandboxes
from bench.localbox.server import LocalEndpoint
from bench.results import read_run

RUNNER = "py-e2b-2.63.0"
COMMANDS = {
    # tk04 keeps a sandbox alive for 60 s on purpose: the signal arrives while it waits
    "run": ["run", "tokens", "--include-slow", "-k", "tk04", "--runner", RUNNER],
    "bench": ["bench", "-n", "500", "--modes", "sequential", "--runner", RUNNER, "--transfer-mib", "1"],
}


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


def wait_for_a_sandbox_of_the_run(process: subprocess.Popen[str], endpoint: LocalEndpoint, results: Path) -> str:
    """The run id, once the run has a sandbox alive on the endpoint."""
    deadline = time.monotonic() + 300
    with httpx.Client(base_url=endpoint.api_url, headers={"X-API-KEY": endpoint.api_key}) as client:
        while time.monotonic() < deadline and process.poll() is None:
            runs = [path.name for path in results.glob("*") if path.is_dir()] if results.exists() else []
            if runs and tagged_sandboxes(client, runs[0]):
                return runs[0]
            time.sleep(0.05)
    raise AssertionError(f"the run never had a sandbox alive: {process.communicate()[0][-2000:]}")


@pytest.mark.parametrize(
    ("name", "signum", "code"),
    [("run", signal.SIGTERM, 143), ("run", signal.SIGINT, 130), ("bench", signal.SIGTERM, 143)],
    ids=["run-sigterm", "run-sigint", "bench-sigterm"],
)
def test_a_signal_mid_run_stops_the_runners_and_writes_every_result(
    name: str, signum: signal.Signals, code: int, endpoint: LocalEndpoint, tmp_path: Path
) -> None:
    process = started(COMMANDS[name], endpoint, tmp_path)
    run_id = wait_for_a_sandbox_of_the_run(process, endpoint, tmp_path)

    process.send_signal(signum)
    output = process.communicate(timeout=120)[0]

    assert process.returncode == code, output[-3000:]
    run = read_run(tmp_path / run_id)
    assert run.footer is not None and (run.footer["status"], run.footer["exit_code"]) == ("interrupted", code)
    assert {"junit.xml", "summary.md", "report.html"} <= {path.name for path in run.path.iterdir()}
    # The runner kills what it created; a create the signal cut short is the sweep's to delete.
    (leak,) = [case for case in run.cases if case.case == "leak_check"]
    assert sorted(leak.details.get("deletes", {})) == sorted(leak.details["survivors"])
    assert all(status < 300 for status in leak.details.get("deletes", {}).values())
    with httpx.Client(base_url=endpoint.api_url, headers={"X-API-KEY": endpoint.api_key}) as client:
        assert tagged_sandboxes(client, run_id) == []


def handled(*body: str) -> subprocess.CompletedProcess[str]:
    """Run the lines of `body` in a Python process of their own, inside the CLI's `interrupt_on_sigterm()`."""
    script = "\n".join(
        [
            "import os, signal, time",
            "from bench.exits import defer_interrupts, interrupt_deferred, interrupt_on_sigterm",
            "with interrupt_on_sigterm():",
            *(f"    {line}" for line in body),
        ]
    )
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.parametrize(
    ("first", "second", "code"), [("SIGTERM", "SIGINT", 143), ("SIGINT", "SIGTERM", 130), ("SIGINT", "SIGINT", 130)]
)
def test_a_second_signal_during_the_clean_up_exits_at_once_with_the_first_signals_code(
    first: str, second: str, code: int
) -> None:
    done = handled(
        "try:",
        f"    os.kill(os.getpid(), signal.{first})",
        "    time.sleep(30)",
        "except KeyboardInterrupt:",
        "    print('cleaning up', flush=True)",
        f"    os.kill(os.getpid(), signal.{second})",
        "    time.sleep(30)",
        "    print('clean-up finished', flush=True)",
    )

    assert (done.returncode, done.stdout) == (code, "cleaning up\n")


def test_while_results_are_written_a_first_signal_waits_for_them_and_a_second_exits_at_once() -> None:
    done = handled(
        "defer_interrupts()",
        "os.kill(os.getpid(), signal.SIGTERM)",
        "time.sleep(0.2)",
        "print('written', interrupt_deferred(), flush=True)",
        "os.kill(os.getpid(), signal.SIGINT)",
        "time.sleep(30)",
        "print('never', flush=True)",
    )

    assert (done.returncode, done.stdout) == (143, "written True\n")
    assert done.stderr.startswith(
        "e2b-bench: interrupted while writing the results: finishing them first, then exit 143"
    )


def test_a_signal_after_the_last_case_lets_every_result_be_written_then_exits_143(
    endpoint: LocalEndpoint, tmp_path: Path
) -> None:
    process = started(["run", "quickstart", "-k", "py03", "--runner", RUNNER], endpoint, tmp_path)
    # junit.xml is the first file the write-up makes; the coverage, footer, report (which imports pandas and
    # renders templates) and latest.json follow, so the signal lands in the middle of the write-up.
    deadline = time.monotonic() + 300
    while not list(tmp_path.glob("*/junit.xml")):
        assert process.poll() is None and time.monotonic() < deadline, process.communicate()[0][-3000:]
        time.sleep(0.002)
    process.send_signal(signal.SIGTERM)
    output = process.communicate(timeout=120)[0]

    assert process.returncode == 143, output[-3000:]
    assert "interrupted while writing the results: finishing them first, then exit 143" in output
    run = read_run(only_run_dir(tmp_path))
    # Every selected case ran: the run's record says so, and says how it went.
    assert run.footer is not None and (run.footer["status"], run.footer["exit_code"]) == ("completed", 0)
    assert [case.case for case in run.cases if case.suite == "quickstart"] == ["py03_run_nonzero_exit_raises"]
    assert "GATE PASSED" in (run.path / "summary.md").read_text("utf-8")
    assert "GATE PASSED" in (run.path / "report.html").read_text("utf-8")
    latest = json.loads((tmp_path / "latest.json").read_text("utf-8"))
    assert (latest["run_dir"], latest["status"], latest["summary"]) == (
        str(run.path.resolve()),
        "completed",
        str((run.path / "summary.md").resolve()),
    )
