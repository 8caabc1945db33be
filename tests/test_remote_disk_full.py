"""A disk that fills while a run is recorded (cases.jsonl, the wire logs, JUnit, the footer, latest.json) ends
the run with exit 3 and one sentence naming the file, no traceback; what was recorded stays valid, and
`latest.json` is not left naming the previous run as the latest (#27). A real, small file system (tmpfs)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from run_cli import REPO, only_run_dir

from bench.results import read_run

RUNNER = "py-e2b-2.63.0"


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 72 MiB file system: room for a run to start (64 MB), filled once its first case is recorded."""
    mount = tmp_path / "small"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=72m", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=True)


def fill(disk: Path) -> None:
    """Write zeros until the file system has no room left."""
    with (disk / "filler").open("wb") as out:
        try:
            while True:
                out.write(b"\0" * 2**20)
                out.flush()
        except OSError:
            pass


def test_a_disk_that_fills_mid_run_ends_it_with_exit_3_and_one_sentence(small_disk: Path) -> None:
    (small_disk / "latest.json").write_text(json.dumps({"run_dir": "/elsewhere/previous-run", "exit_code": 0}))
    results = small_disk
    process = subprocess.Popen(
        [sys.executable, "-m", "bench.cli", "run", "quickstart", "--runner", RUNNER, "-k", "py0", "--no-report",
         "--results-dir", str(results)],
        cwd=REPO, env=dict(os.environ), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 600
    while not any(path.stat().st_size for path in results.glob("*/cases.jsonl")):
        assert process.poll() is None and time.monotonic() < deadline, process.communicate()[0][-3000:]
        time.sleep(0.02)
    fill(small_disk)
    output = process.communicate(timeout=600)[0]

    assert process.returncode == 3, output[-3000:]
    assert "Traceback" not in output and "INTERNALERROR" not in output
    run_dir = only_run_dir(results)
    fault = [line for line in output.splitlines() if line.startswith("e2b-bench: harness environment fault: ")]
    assert fault and fault[-1].startswith(f"e2b-bench: harness environment fault: {run_dir}/"), output[-3000:]
    assert fault[-1].endswith("no space left on device (0.0 MB free)")
    # What was recorded before the disk filled is still a valid record: every line whole, at least one case.
    run = read_run(run_dir, allow_truncated=True)
    assert [case.suite for case in run.cases][:1] == ["quickstart"]
    lines = (run_dir / "cases.jsonl").read_text().splitlines()
    assert all(json.loads(line)["id"] for line in lines)
    # No pointer names the previous run as the latest one (there is no room for one naming this run).
    latest = results / "latest.json"
    assert not latest.exists() or json.loads(latest.read_text())["run_dir"] == str(run_dir.resolve())
