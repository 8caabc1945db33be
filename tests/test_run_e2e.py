"""`e2b-bench run` end to end, as a user types it: exit codes, run directories, secrets."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from loopback import closed_port
from run_cli import REPO, e2b_bench, only_run_dir

from bench.localbox.server import serving
from bench.remote.slowness import scaled
from bench.results import read_run, validate
from bench.runners.manifest import load_steps

PY_RUNNER = "py-e2b-2.63.0"
QUICKSTART = "sandboxes/e2b/test_quickstart.py"
CANARY = "e2b_canary0123456789abcdef0123456789abcdef"


def test_run_against_the_embedded_endpoint_passes_all_eleven_python_steps(tmp_path: Path) -> None:
    done = e2b_bench("run", QUICKSTART, "--runner", PY_RUNNER, "--results-dir", str(tmp_path))

    assert done.returncode == 0, done.stdout + done.stderr
    run = read_run(only_run_dir(tmp_path))
    quickstart = [c for c in run.cases if c.suite == "quickstart"]
    assert [c.case for c in quickstart] == [step.id for step in load_steps("quickstart", "python")]
    assert len(quickstart) == 11
    assert {c.outcome for c in quickstart} == {"pass"}
    assert all(c.conformant and c.duration_ms is not None for c in quickstart)
    assert run.footer["status"] == "completed" and run.footer["exit_code"] == 0
    assert run.header["pins"][PY_RUNNER]["e2b"] == "2.63.0"
    assert "connectrpc" in run.header["pins"][PY_RUNNER]  # the whole resolved environment, not only the pin
    leak = [c for c in run.cases if c.case == "leak_check"]
    assert [(c.outcome, c.details["survivors"]) for c in leak] == [("pass", [])]
    junit = ET.parse(run.path / "junit.xml").getroot()
    assert {s.get("name"): s.get("tests") for s in junit.iter("testsuite")} == {
        f"quickstart.{PY_RUNNER}": "11",
        "housekeeping.harness": "1",
    }
    wire = (run.path / "wire" / f"{PY_RUNNER}.jsonl").read_text().splitlines()
    assert len(wire) > 20
    for line in wire:
        validate("wire", json.loads(line))
    assert "report: " in done.stdout and (run.path / "report.html").exists()
    coverage = json.loads((run.path / "coverage.json").read_text())
    assert run.footer["coverage"] == {"spec_percent": coverage["spec"]["percent"], "sdk_percent": {}}
    assert 0 < coverage["spec"]["percent"] < 100  # the quickstart reaches some of the spec's operations
    assert json.loads((tmp_path / "latest.json").read_text()) == {
        "run_dir": str(run.path.resolve()),
        "status": "completed",
        "exit_code": 0,
        "junit": str(run.path.resolve() / "junit.xml"),
        "report": str(run.path.resolve() / "report.html"),
        "summary": str(run.path.resolve() / "summary.md"),
    }


def test_an_unreachable_endpoint_exits_2_with_one_clear_message_and_a_valid_run_dir(tmp_path: Path) -> None:
    port = closed_port()
    url = f"http://127.0.0.1:{port}"
    env = {"E2B_API_KEY": "e2b_" + "0" * 40, "E2B_API_URL": url, "E2B_SANDBOX_URL": url}

    done = e2b_bench("run", "--endpoint", "env", "--runner", PY_RUNNER, "--results-dir", str(tmp_path), env=env)

    assert done.returncode == 2
    assert url in done.stdout + done.stderr
    assert "refused" in (done.stdout + done.stderr).lower()
    run = read_run(only_run_dir(tmp_path))
    assert run.footer["status"] == "aborted" and run.footer["exit_code"] == 2
    assert run.cases == []


def test_a_missing_key_exits_2_naming_the_variable(tmp_path: Path) -> None:
    env = {"E2B_API_URL": "http://127.0.0.1:9", "E2B_SANDBOX_URL": "http://127.0.0.1:9", "E2B_API_KEY": ""}

    done = e2b_bench("run", "--endpoint", "env", "--runner", PY_RUNNER, "--results-dir", str(tmp_path), env=env)

    assert done.returncode == 2
    assert "E2B_API_KEY" in done.stdout + done.stderr


def test_the_api_key_and_envd_tokens_never_reach_disk(tmp_path: Path) -> None:
    results, reports = tmp_path / "results", tmp_path / "reports"
    with serving(api_key=CANARY) as local:
        env = {"E2B_API_KEY": CANARY, "E2B_API_URL": local.api_url, "E2B_SANDBOX_URL": local.sandbox_url}
        # Every suite of the runner: probes and token rules carry signed URLs and raw tokens too.
        done = e2b_bench(
            "run", "--endpoint", "env", "--expectations", "expectations/local.toml", "--runner", PY_RUNNER,
            "--results-dir", str(results), env=env,
        )  # fmt: skip
    rendered = e2b_bench("report", str(only_run_dir(results)), "--out", str(reports))

    assert done.returncode == 0, done.stdout + done.stderr
    assert rendered.returncode == 0
    written = [p for p in [*results.rglob("*"), *reports.rglob("*")] if p.is_file()]
    assert len(written) >= 6
    for path in written:
        text = path.read_text(errors="replace")
        assert CANARY not in text, path
        assert CANARY[4:] not in text, path
        for line in text.splitlines():
            if '"envdAccessToken"' in line:
                assert '"envdAccessToken": "[REDACTED]"' in line or '"envdAccessToken":"[REDACTED]"' in line
    assert CANARY not in done.stdout + done.stderr


@pytest.mark.parametrize("signum", [signal.SIGINT])
def test_ctrl_c_leaves_a_valid_run_dir_marked_interrupted(tmp_path: Path, signum: int) -> None:
    process = subprocess.Popen(
        [sys.executable, "-m", "bench.cli", "run", QUICKSTART, "--runner", PY_RUNNER, "--results-dir", str(tmp_path)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        runs = [p for p in tmp_path.iterdir() if p.is_dir()] if tmp_path.exists() else []
        if runs and (runs[0] / "wire" / f"{PY_RUNNER}.jsonl").exists():
            break
        time.sleep(0.05)
    process.send_signal(signum)
    interrupted_at = time.monotonic()
    out, err = process.communicate(timeout=120)

    assert process.returncode == 130, out + err
    assert time.monotonic() - interrupted_at < scaled(30)  # a busy host stops its runners more slowly
    run = read_run(only_run_dir(tmp_path))
    assert run.footer["status"] == "interrupted"
    leak = [c for c in run.cases if c.case == "leak_check"]
    assert [(c.outcome, c.details["survivors"]) for c in leak] == [("pass", [])]
