"""A clean run leaves no sandbox of its own: a case is recorded as soon as its runner reports it, and the run
waits for each runner to kill its own sandboxes before it counts any as "left by this run" (#27: the
isolation probes' and every suite's last sandboxes were listed as left, and killed under their runner)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from run_cli import e2b_bench, only_run_dir

from bench.housekeeping import tagged_sandboxes
from bench.localbox.server import LocalEndpoint
from bench.results import read_run

RUNNER = "py-e2b-2.63.0"


@pytest.mark.parametrize(("suite", "selection"), [("isolation", []), ("quickstart", ["-k", "py01 or py02 or py05"])])
def test_a_clean_run_leaves_no_sandbox_of_its_own(
    suite: str, selection: list[str], endpoint: LocalEndpoint, tmp_path: Path
) -> None:
    done = e2b_bench("run", suite, "--runner", RUNNER, *selection, "--no-report", "--results-dir", str(tmp_path),
                     env={**endpoint.env(), "E2B_BENCH_ENDPOINT": "env"}, timeout=900)  # fmt: skip

    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "left by this run" not in done.stdout + done.stderr
    run = read_run(only_run_dir(tmp_path))
    assert run.footer is not None and run.footer["left_by_run"] == {}
    (leak,) = [case for case in run.cases if case.case == "leak_check"]
    assert (leak.outcome, leak.details["survivors"]) == ("pass", [])
    with httpx.Client(base_url=endpoint.api_url, headers={"X-API-KEY": endpoint.api_key}) as client:
        assert tagged_sandboxes(client, run.run_id) == []  # the endpoint's own list, a second path
