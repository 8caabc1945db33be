"""The SDK version matrix: every registered pin against the embedded endpoint, in one run."""

from __future__ import annotations

import json
from pathlib import Path

from run_cli import e2b_bench, only_run_dir

from bench.results import read_run
from bench.runners.catalog import available_runners

# SDKs up to 2.50 create and connect through the v1 routes, from 2.51 through /v2.
V1_ROUTES = {"py-e2b-2.45.1", "py-e2b-2.31.0", "js-e2b-2.50.0"}


def test_every_pin_passes_its_steps_and_speaks_its_own_routes(tmp_path: Path, served: dict[str, str]) -> None:
    args = ("--matrix", "sandboxes/e2b/test_quickstart.py", "--results-dir", str(tmp_path), "--no-report")
    done = e2b_bench("run", *args, env=served, timeout=600)

    assert done.returncode == 0, done.stdout[-3000:]
    run = read_run(only_run_dir(tmp_path))
    runners = {name for name, runner in available_runners().items() if not runner.spec.family}  # SDK pins
    assert {c.runner for c in run.cases if c.suite == "quickstart"} == runners
    assert runners >= V1_ROUTES
    for case in run.cases:
        assert case.conformant, case
        assert case.outcome == "pass" or (case.outcome == "skip" and case.error.startswith("not in this SDK"))
    for runner in runners:
        creates = [
            json.loads(line)["url"].split("/", 3)[3]
            for line in (run.path / "wire" / f"{runner}.jsonl").read_text().splitlines()
            if json.loads(line)["method"] == "POST" and json.loads(line)["url"].endswith("sandboxes")
        ]
        expected = "sandboxes" if runner in V1_ROUTES else "v2/sandboxes"
        assert creates and set(creates) == {expected}, (runner, creates)
