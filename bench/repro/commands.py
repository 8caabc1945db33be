"""What the terminal and the report print under a failing case besides its re-run: the `repro` command that writes
its standalone reproduction and, for a run given `--reference RUN`, the `diff` command and its first difference."""

from __future__ import annotations

import functools
import shlex
from pathlib import Path
from typing import Any

from bench.paths import USER_ROOT
from bench.results import CaseRecord, Run
from bench.runners.manifest import load_manifest

REFERENCE_FLAG = "--reference"
MAX_DIFFS = 20  # first differences computed for one report (each reads two wire logs)


@functools.lru_cache(maxsize=4)
def _read(path: Path) -> Run:
    from bench.results import read_run

    return read_run(path, allow_truncated=True)


def reference_of(run: Run) -> Path | None:
    """The reference run named on the run's command line (`run --reference RUN`), when it is still there."""
    argv = [str(item) for item in run.header.get("argv", [])]
    for index, item in enumerate(argv):
        name, equals, value = item.partition("=")
        if name == REFERENCE_FLAG:
            given = value if equals else (argv[index + 1] if index + 1 < len(argv) else "")
            for path in (Path(given), USER_ROOT / given):  # as given, or from the checkout `./e2b-bench` runs in
                if (path / "run.json").is_file():
                    return path.resolve()
            return None
    return None


def reproducible(case: CaseRecord) -> bool:
    """A case of a suite with steps (not the leak check, a benchmark measure or a missing shard)."""
    return case.suite in load_manifest()


def repro_command(run: Run, case: CaseRecord) -> str | None:
    if not reproducible(case):
        return None
    return shlex.join(["./e2b-bench", "repro", str(run.path), "--case", case.id])


def diff_command(run: Run, case: CaseRecord) -> str | None:
    reference = reference_of(run)
    if reference is None or not reproducible(case):
        return None
    return shlex.join(["./e2b-bench", "diff", str(reference), str(run.path), "--case", case.id])


def follow_up_lines(run: Run, case: CaseRecord) -> list[str]:
    """The terminal's lines under a failing case's re-run."""
    lines = []
    repro = repro_command(run, case)
    if repro:
        lines.append(f"repro: {repro}")
    diff = diff_command(run, case)
    if diff:
        lines.append(f"diff:  {diff}")
    return lines


def follow_ups(run: Run, case: CaseRecord, conformant: bool) -> dict[str, Any]:
    """A report cell's `repro`, `diff` and `first_difference` (a failing case's; None for the others)."""
    if conformant:
        return {"repro": None, "diff": None, "first_difference": None}
    return {
        "repro": repro_command(run, case),
        "diff": diff_command(run, case),
        "first_difference": first_difference_lines(run, case),
    }


def first_difference_lines(run: Run, case: CaseRecord) -> list[str] | None:
    """The case's first exchange that differs from the reference run's, side by side (None: no reference, or
    the reference lacks the case)."""
    reference = reference_of(run)
    if reference is None or not reproducible(case):
        return None
    from bench.results import RunError

    from .diff import DiffError, first_difference

    try:
        other = _read(reference)
        found = first_difference(other, run, case.id)
    except (RunError, DiffError):
        return None
    if found is None:
        return [f"{case.id}: the same exchanges as the reference run"]
    return found.lines((f"reference: {other.run_id}", f"this run: {run.run_id}"))
