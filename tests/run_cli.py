"""`e2b-bench` as a user runs it, for the tests that drive the whole command: a subprocess in the checkout."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from bench.localbox.template import ensure_template

REPO = Path(__file__).resolve().parents[1]


def e2b_bench(*args: str, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """`e2b-bench ARGS...` with this environment plus `env`; its output captured, its exit code not checked."""
    return subprocess.run(
        [sys.executable, "-m", "bench.cli", *args],
        cwd=REPO,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
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
