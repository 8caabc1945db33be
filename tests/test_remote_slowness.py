"""Deadlines that hold on a busy host: the host's slowness is measured (or set), and the embedded endpoint's
waits stretch with it, so a code-interpreter sandbox starts beside a CPU hog of twice as many busy
processes as the host has cores."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import pytest
from run_cli import REPO

from bench.localbox.server import LocalEndpoint
from bench.localbox.template import ensure_template
from bench.remote.slowness import SLOWNESS_ENV, measure

HOGS = 2 * (os.cpu_count() or 1)  # busy processes beside the test: a load of at least twice the cores


@pytest.fixture
def cpu_hog() -> Iterator[None]:
    """HOGS processes that only burn CPU, for the test's duration (killed after, whatever happens)."""
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(HOGS)]
    try:
        yield
    finally:
        for hog in hogs:
            hog.kill()
        for hog in hogs:
            hog.wait()


def slowness_in_a_fresh_process(value: str | None) -> float:
    env = {k: v for k, v in os.environ.items() if k != SLOWNESS_ENV} | ({SLOWNESS_ENV: value} if value else {})
    code = "from bench.remote.slowness import slowness, scaled; print(slowness(), scaled(10))"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, check=True)
    factor, ten = map(float, out.stdout.split())
    assert ten == pytest.approx(10 * factor)
    return factor


def test_a_host_whose_cores_are_shared_by_busy_processes_measures_slower(cpu_hog: None) -> None:
    # This process competes with at least HOGS busy ones for os.cpu_count() cores: it gets a third of a core
    # at most, so its loop takes at least ~3 times its CPU time (whatever else the host is running).
    assert measure() >= 1.5


def test_the_slowness_can_be_set_and_is_never_below_one() -> None:
    assert slowness_in_a_fresh_process("3") == 3.0
    assert slowness_in_a_fresh_process("0.2") == 1.0
    assert slowness_in_a_fresh_process("not a number") >= 1.0  # measured instead


def test_a_code_interpreter_starts_and_runs_a_cell_beside_a_cpu_hog(endpoint: LocalEndpoint, cpu_hog: None) -> None:
    from e2b_code_interpreter import Sandbox

    ensure_template(name="code-interpreter-v1")
    sandbox = Sandbox.create(timeout=600, request_timeout=600)
    try:
        execution = sandbox.run_code("6 * 7", timeout=600, request_timeout=600)
    finally:
        sandbox.kill()

    assert [result.text for result in execution.results] == ["42"]
