"""`run --list`: the selection a run would make, printed, and nothing run (no run directory, no endpoint started).

That it selects what the run runs is tests/test_docs_commands.py's `test_list_names_the_cases_the_run_ran`."""

from __future__ import annotations

import subprocess
from pathlib import Path

from run_cli import checkout_cli, own_environment

from bench.exits import ExitCode

REPO = Path(__file__).resolve().parents[1]


def run_list(results: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return checkout_cli("run", *args, env=own_environment(results))


def test_an_endpoint_not_embedded_is_preflighted_and_nothing_is_recorded(tmp_path: Path) -> None:
    done = run_list(tmp_path, "--list", "--endpoint", "env", "--case", "quickstart/py-e2b-2.63.0/py02_run_echo")

    assert done.returncode == ExitCode.USAGE, done.stdout + done.stderr
    assert done.stdout.splitlines()[-1] == "quickstart/py-e2b-2.63.0/py02_run_echo"
    assert "endpoint unusable: E2B_API_KEY is not set" in done.stderr
    assert not tmp_path.exists() or list(tmp_path.iterdir()) == []


def test_collect_only_lists_as_list_does_and_an_empty_selection_exits_5(tmp_path: Path) -> None:
    listed = run_list(tmp_path, "--list", "-k", "py02 or ts02", "quickstart")
    collected = run_list(tmp_path, "--co", "-k", "py02 or ts02", "quickstart")
    empty = run_list(tmp_path, "--list", "--case", "quickstart/*/no_such_case")

    assert listed.returncode == collected.returncode == ExitCode.OK, listed.stderr + collected.stderr
    assert listed.stdout == collected.stdout
    assert sorted(listed.stdout.splitlines()[-2:]) == [
        "quickstart/js-e2b-2.51.0/ts02_run_echo",
        "quickstart/py-e2b-2.63.0/py02_run_echo",
    ]
    assert empty.returncode == ExitCode.NO_CASES
    assert "--case 'quickstart/*/no_such_case' matched none" in empty.stderr
    assert not tmp_path.exists() or list(tmp_path.iterdir()) == []
