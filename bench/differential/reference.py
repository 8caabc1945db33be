"""The stored reference traces: `sandboxes/e2b/reference/<suite>/<runner>.jsonl`, one line per case.

Each line is `{"case": STEP, "runs": [TRACE, ...], "run_ids": [RUN, ...]}`: the case's trace
(bench/differential/trace.py) in each run it was recorded from, and that run's id (names a case made of it are
no difference), all of them passing runs of the faithful embedded endpoint. Several runs let the judgement tell a
value E2B gives every time (judged `exact`) from one that varies (judged by its shape). A run writes every case's
trace to `traces/<suite>.<runner>.jsonl` in its run directory; `e2b-bench reference --write` runs the suites RUNS
times against the embedded endpoint with the differential judgement off and writes these files from them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from bench.paths import REFERENCE_TRACES_DIR, RESULTS_DIR
from bench.results import atomic_write, json_line

from .capture import DIFFERENTIAL_ENV, RECORD

SCHEMA = "e2b-bench/reference/1"
TRACES = "traces"  # in a run directory: traces/<suite>.<runner>.jsonl


def reference_path(suite: str, runner: str, root: Path = REFERENCE_TRACES_DIR) -> Path:
    return root / suite / f"{runner}.jsonl"


def run_traces_path(run_dir: Path, suite: str, runner: str) -> Path:
    return run_dir / TRACES / f"{suite}.{runner}.jsonl"


def read_lines(path: Path) -> Iterable[dict[str, Any]]:
    try:
        text = path.read_text("utf-8")
    except OSError:
        return
    for line in text.splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict):
            yield entry


class References:
    """The reference traces of a run's cases, each file read once."""

    def __init__(self, root: Path = REFERENCE_TRACES_DIR) -> None:
        self.root = root
        self._loaded: dict[tuple[str, str], dict[str, list[tuple[list[dict[str, Any]], str | None]]]] = {}

    def runs(self, suite: str, runner: str, case: str) -> list[tuple[list[dict[str, Any]], str | None]]:
        """The reference runs' traces of a case, each with the id of its run (empty: no reference for it)."""
        key = (suite, runner)
        if key not in self._loaded:
            self._loaded[key] = {}
            for entry in read_lines(reference_path(suite, runner, self.root)):
                runs, ids = entry.get("runs") or [], entry.get("run_ids") or []
                ids = [str(made_by) if made_by else None for made_by in ids] + [None] * (len(runs) - len(ids))
                self._loaded[key][str(entry.get("case"))] = [
                    (run, made_by) for run, made_by in zip(runs, ids, strict=False) if isinstance(run, list)
                ]
        return self._loaded[key].get(case, [])


def write_references(run_dirs: list[Path], root: Path = REFERENCE_TRACES_DIR) -> list[Path]:
    """Reference files from the traces of `run_dirs`: a case's runs are its traces in the runs where it passed
    (a case that passed in none is left out). Files of the suites and runners the runs cover are rewritten
    whole; others are left as they are. Returns the files written."""
    gathered: dict[tuple[str, str], dict[str, list[tuple[Any, str]]]] = {}
    for run_dir in run_dirs:
        for path in sorted((run_dir / TRACES).glob("*.jsonl")):
            suite, _, runner = path.stem.partition(".")
            cases = gathered.setdefault((suite, runner), {})
            for entry in read_lines(path):
                if entry.get("outcome") == "pass" and isinstance(entry.get("trace"), list):
                    made_by = str(entry.get("run_id") or run_dir.name)
                    cases.setdefault(str(entry["case"]), []).append((entry["trace"], made_by))
    written = []
    for (suite, runner), cases in sorted(gathered.items()):
        target = reference_path(suite, runner, root)
        target.parent.mkdir(parents=True, exist_ok=True)
        lines = [
            json_line({"case": case, "runs": [run for run, _ in runs], "run_ids": [made_by for _, made_by in runs]})
            for case, runs in sorted(cases.items())
        ]
        atomic_write(target, "".join(f"{line}\n" for line in lines))
        written.append(target)
    return written


def record_runs(suites: list[str], runs: int, extra: list[str], results: Path = RESULTS_DIR / "reference") -> tuple[
        int, list[Path]]:  # fmt: skip
    """Run `e2b-bench run` `runs` times against the faithful embedded endpoint, traces recorded and no case judged
    against a reference (E2B_BENCH_DIFFERENTIAL=record); its exit code (the first not 0) and the run directories."""
    env = {**os.environ, DIFFERENTIAL_ENV: RECORD}
    made = []
    for _ in range(runs):
        argv = [sys.executable, "-m", "bench.cli", "run", "--endpoint", "local", "--profile", "e2b", "--no-report",
                "--results-dir", str(results), *extra, *suites]  # fmt: skip
        code = subprocess.run(argv, env=env, check=False).returncode
        try:
            made.append(Path(json.loads((results / "latest.json").read_text("utf-8"))["run_dir"]))
        except (OSError, ValueError, KeyError):
            return code or 2, made
        if code != 0:
            return code, made
    return 0, made
