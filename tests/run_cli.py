"""`e2b-bench` as a user runs it, for the tests that drive the whole command: its `main` in the checkout, forked
from a process that has imported the harness once (`bench.preload`, as `detect` runs its runs), so a call costs no
interpreter start and no imports. `tests/test_preload.py` shows a fork answers as `python -m bench.cli` does; the
tests of the start itself (tests/test_startup_imports.py, the wheel, signals, `serve`) start a process of their own.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from bench.localbox.template import ensure_template
from bench.preload import run_forked
from bench.remote.slowness import measure, scaled, slowness

QUIET_COMMAND_S = 300  # what a command of a test may take on a quiet host

REPO = Path(__file__).resolve().parents[1]
STOP_GRACE_S = 60.0  # for a command past its time to stop its runners and write its footer, on a quiet host


def e2b_bench(
    *args: str, env: dict[str, str] | None = None, timeout: float | None = None
) -> subprocess.CompletedProcess[str]:
    """`e2b-bench ARGS...` with this environment plus `env`; its output captured, its exit code not checked.
    Past `timeout` (by default 300 s of a quiet host, stretched by how slow the host is as the command starts)
    it is stopped as SIGTERM stops it and `bench.preload.StillRunning` is raised."""
    environment = {**os.environ, **(env or {})}
    if timeout is None:
        timeout = QUIET_COMMAND_S * max(measure(), slowness())
    done = run_forked(args, timeout_s=timeout, grace_s=scaled(STOP_GRACE_S), env=environment, cwd=REPO)
    return subprocess.CompletedProcess(
        [sys.executable, "-m", "bench.cli", *args], done.returncode, done.stdout, done.stderr
    )


def served_with(served: dict[str, str], *templates: str) -> dict[str, str]:
    """`served` (tests/conftest.py) once these built-in templates are built, as a run builds those its suites
    create from before serving its own endpoint (a cold build outlasts a create's wait)."""
    for template in templates:
        ensure_template(name=template)
    return served


def only_run_dir(results: Path) -> Path:
    """The one run directory a command wrote under `results`."""
    runs = [p for p in results.iterdir() if p.is_dir()]
    assert len(runs) == 1, runs
    return runs[0]


def own_environment(results: Path) -> dict[str, str]:
    """This environment as a newcomer's shell has it: none of the caller's E2B_* variables (the harness's own
    E2B_BENCH_* kept, but for the endpoint it names), every output under `results`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("E2B_") or k.startswith("E2B_BENCH_")}
    env.pop("E2B_BENCH_ENDPOINT", None)
    env["E2B_BENCH_RESULTS_DIR"] = str(results)
    return env


def checkout_cli(*args: str, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """The checkout's `./e2b-bench ARGS...` with exactly `env`, as a shell runs it; bounded by `timeout` (scaled)."""
    return subprocess.run([str(REPO / "e2b-bench"), *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=scaled(timeout), check=False)  # fmt: skip
