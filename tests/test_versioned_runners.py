"""Any release as a runner (`--runner BASE@VERSION`, `BASE@PACKAGE==VERSION`): the run's case ids and header name
the release, and the SDK that talks on the wire is that release (its own version header), for an SDK runner of a
Node project and for a framework runner whose lock pins another `e2b`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.results import read_run
from tests.run_cli import e2b_bench, only_run_dir


def sdk_versions_on_the_wire(run_dir: Path) -> set[str]:
    """What the SDK said its version was on every API request (the E2B SDKs' `package_version` header)."""
    seen = set()
    for log in (run_dir / "wire").glob("*.jsonl"):
        for line in log.read_text().splitlines():
            headers = {k.lower(): v for k, v in (json.loads(line).get("request_headers") or {}).items()}
            if "package_version" in headers:
                seen.add(headers["package_version"])
    return seen


@pytest.mark.parametrize(
    ("runner", "case", "made", "package", "version"),
    [
        ("js-e2b@2.49.0", "quickstart/*/ts01_create", "js-e2b-2.49.0", "e2b", "2.49.0"),
        ("ag2@e2b==2.61.0", "frameworks/*/fw02_exit_code", "ag2-1.2.1+e2b-2.61.0", "e2b", "2.61.0"),
    ],
)
def test_a_release_runs_as_a_runner_of_its_own(
    runner: str, case: str, made: str, package: str, version: str, served: dict[str, str], tmp_path: Path
) -> None:
    done = e2b_bench("run", "--runner", runner, "--case", case, "--results-dir", str(tmp_path), "--no-report",
                     env=served, timeout=900)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    run = read_run(only_run_dir(tmp_path))
    ids = [c.id for c in run.cases if c.suite != "housekeeping"]
    assert ids == [case.replace("*", made)]
    assert run.header["pins"][made][package] == version
    assert sdk_versions_on_the_wire(run.path) == {version}


def test_an_unknown_base_is_one_sentence_and_exit_2(tmp_path: Path) -> None:
    done = e2b_bench("run", "--runner", "nosuch@1.0.0", "--case", "quickstart/*/py01_create")
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "e2b-bench run: runner 'nosuch@1.0.0': no runner is named 'nosuch' (see `e2b-bench runners`)"
    )
