"""Exit codes that say who is at fault (#27): a fault of the harness's own environment (here a wrong
`E2B_BENCH_NODE`) is exit 3 with one sentence naming it, never a traceback, and the cases that could run
are recorded with JUnit, report and `latest.json` naming this run."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from run_cli import e2b_bench, only_run_dir

from bench.results import read_run
from bench.runners.envs import RunnerEnvError
from bench.runners.node import find_node

SELECTION = ("--runner", "py-e2b-2.63.0", "--runner", "js-e2b-2.51.0", "sandboxes/e2b/test_quickstart.py")


def test_a_wrong_e2b_bench_node_exits_3_with_one_sentence_and_keeps_the_python_cases(tmp_path: Path) -> None:
    wrong = str(tmp_path / "no-such-node")

    done = e2b_bench("run", "--results-dir", str(tmp_path / "results"), *SELECTION, env={"E2B_BENCH_NODE": wrong})

    output = done.stdout + done.stderr
    assert done.returncode == 3, output[-3000:]
    assert "Traceback" not in output and "INTERNALERROR" not in output
    sentence = (
        f"runner environment js-e2b-2.51.0 could not be built: E2B_BENCH_NODE={wrong} cannot be run "
        "(No such file or directory): point E2B_BENCH_NODE at Node.js 20 or newer"
    )
    assert sentence in output
    run = read_run(only_run_dir(tmp_path / "results"))
    assert {c.outcome for c in run.cases if c.runner == "py-e2b-2.63.0"} == {"pass"}
    assert {c.outcome for c in run.cases if c.runner == "js-e2b-2.51.0"} == {"error"}
    assert all(c.error == sentence for c in run.cases if c.runner == "js-e2b-2.51.0")
    assert run.footer is not None and run.footer["exit_code"] == 3
    assert (run.path / "junit.xml").is_file()
    latest = json.loads((tmp_path / "results" / "latest.json").read_text())
    assert (latest["run_dir"], latest["exit_code"]) == (str(run.path.resolve()), 3)


def test_e2b_bench_node_must_answer_as_node_20_or_newer(tmp_path: Path) -> None:
    refusals = []
    for node in ("/bin/true", str(tmp_path)):  # an executable that is not Node.js, a directory
        with pytest.raises(RunnerEnvError) as refused:
            find_node({"E2B_BENCH_NODE": node})
        refusals.append(str(refused.value))

    fix = "point E2B_BENCH_NODE at Node.js 20 or newer"
    assert refusals[0].startswith("E2B_BENCH_NODE=/bin/true is not Node.js (`--version` said 'true (GNU coreutils)")
    assert refusals[0].endswith(f"'): {fix}")
    assert refusals[1] == f"E2B_BENCH_NODE={tmp_path} cannot be run (Permission denied): {fix}"
    assert find_node({}).name == "node"  # the node on PATH answers as Node.js 20 or newer


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB file system mounted for the test: the results directory of a run that has no room."""
    mount = tmp_path / "small"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=True)


def test_a_results_directory_without_room_exits_3_with_one_sentence_and_latest_json_names_this_run(
    small_disk: Path,
) -> None:
    (small_disk / "latest.json").write_text(json.dumps({"run_dir": "/elsewhere/previous-run", "exit_code": 0}))

    done = e2b_bench(
        "run", "--results-dir", str(small_disk), "--runner", "py-e2b-2.63.0", "sandboxes/e2b/test_quickstart.py"
    )

    output = done.stdout + done.stderr
    assert done.returncode == 3, output[-3000:]
    assert "Traceback" not in output and "INTERNALERROR" not in output
    assert f"HARNESS ENVIRONMENT FAULT: the results directory {small_disk} has " in output
    assert "MB free, less than the 64 MB a run needs: free some space or choose another --results-dir" in output
    run = read_run(only_run_dir(small_disk))
    assert run.cases == [] and run.footer is not None and run.footer["exit_code"] == 3
    assert (run.path / "junit.xml").is_file()
    latest = json.loads((small_disk / "latest.json").read_text())
    assert (latest["run_dir"], latest["exit_code"]) == (str(run.path.resolve()), 3)
