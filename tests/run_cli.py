"""`e2b-bench` as a user runs it, for the tests that drive the whole command: a subprocess in the checkout."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

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


def only_run_dir(results: Path) -> Path:
    """The one run directory a command wrote under `results`."""
    runs = [p for p in results.iterdir() if p.is_dir()]
    assert len(runs) == 1, runs
    return runs[0]
