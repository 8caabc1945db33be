"""A runner that dies at exec (its interpreter vanished, or cannot be executed here) is a harness environment
fault: its cases are `error` "not run: the runner could not start (...)", nothing is blamed on the endpoint,
and the run exits 3 (#27). The Node.js given is a temp script: the shared runner cache is never touched."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from run_cli import e2b_bench, only_run_dir

from bench.results import read_run

RUNNER = "js-e2b-2.51.0"
# Each answers the harness's `--version` check as the real node does, then fails the runner's start.
BROKEN_NODES = {
    "cannot execute": 'echo "node: cannot execute binary file: Exec format error" >&2\nexit 126',
    "vanished": None,  # removes itself after the version check
}


def fake_node(directory: Path, how: str) -> Path:
    real = shutil.which("node")
    assert real is not None, "the Node runners' tests need node on PATH"
    script = directory / "node"
    after = BROKEN_NODES[how] or ""
    vanish = 'rm -f -- "$0"\n' if BROKEN_NODES[how] is None else ""
    script.write_text(
        f'#!/bin/sh\nif [ "$1" = "--version" ]; then\n  {real} --version\n  {vanish}  exit 0\nfi\n{after}\n'
    )
    script.chmod(0o755)
    return script


@pytest.mark.parametrize("how", BROKEN_NODES)
def test_a_runner_that_cannot_start_is_a_harness_fault_with_its_cases_not_run(how: str, tmp_path: Path) -> None:
    node = fake_node(tmp_path, how)
    results = tmp_path / "results"

    done = e2b_bench("run", "quickstart", "--runner", RUNNER, "-k", "ts01 or ts02", "--no-report",
                     "--results-dir", str(results), env={"E2B_BENCH_NODE": str(node)})  # fmt: skip

    output = done.stdout + done.stderr
    assert done.returncode == 3, output[-3000:]
    assert "Traceback" not in output
    assert f"runner {RUNNER} could not start: " in output
    assert "HARNESS ENVIRONMENT FAULT: a runner could not be built or started; 3 case(s) recorded" in output
    run = read_run(only_run_dir(results))
    assert run.footer is not None and run.footer["exit_code"] == 3
    cases = [case for case in run.cases if case.suite == "quickstart"]
    assert [case.case for case in cases] == ["ts01_create", "ts02_run_echo"]
    for case in cases:
        assert case.outcome == "error" and not case.conformant
        assert case.error is not None and case.error.startswith("not run: the runner could not start (")
    # The endpoint never heard from the runner: no exchange in its wire log, no sandbox left.
    wire = run.path / "wire" / f"{RUNNER}.jsonl"
    assert not wire.exists() or wire.read_text() == ""
    (leak,) = [case for case in run.cases if case.case == "leak_check"]
    assert (leak.outcome, leak.details["survivors"]) == ("pass", [])
