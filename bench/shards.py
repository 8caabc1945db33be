"""Sharded runs: `run --shard K/N` runs a deterministic 1/N of the cases; `merge` joins the shards' run dirs.

A case belongs to a *group*, the (suite, runner) pair the plugin starts one runner process for; a group
never spans two shards, so each runner starts once in the whole sharded run. Groups are dealt largest
first to the shard with the fewest cases so far (ties to the lowest index), which depends only on the
set of cases, never on their order. Each shard's header carries `shard`: its index, the total, how many
cases it planned, and a digest of the whole selection, which is how `merge` tells the shards of one run
from a mix of runs.
"""

from __future__ import annotations

import hashlib
import re
import shutil
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .housekeeping import Sweep, leak_record
from .junit import write_junit
from .lifecycle import LATEST_JSON
from .redaction import Redactor
from .remote.budget import merged_cost, retries_figure
from .results import CaseRecord, Run, RunDir, RunError, case_id, read_run
from .triage.causes import CAUSES_JSON, write_causes

SHARD_SUITE = "shards"
HOUSEKEEPING = case_id("housekeeping", "harness", "leak_check")
OWN_FILES = {RunDir.RUN_JSON, RunDir.CASES, "junit.xml", "report.html", "summary.md", CAUSES_JSON}
EXIT_OK, EXIT_FAILED = 0, 1

if TYPE_CHECKING:
    import pytest


class ShardError(RunError):
    """A shard spec that is not K/N, or run directories that are not the shards of one run."""


@dataclass(frozen=True)
class Shard:
    """Shard `index` (1-based) of `total`."""

    index: int
    total: int

    @classmethod
    def parse(cls, text: str) -> Shard:
        match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text)
        if not match:
            raise ShardError(f"--shard takes K/N (e.g. 2/4), not {text!r}")
        index, total = int(match[1]), int(match[2])
        if total < 1 or not 1 <= index <= total:
            raise ShardError(f"--shard {text}: K must be between 1 and N, and N at least 1")
        return cls(index, total)

    def __str__(self) -> str:
        return f"{self.index}/{self.total}"


def partition(groups: Sequence[str], total: int) -> list[int]:
    """The shard (1..total) of each case, given each case's group: whole groups, balanced by case count."""
    if total < 1:
        raise ValueError(f"total must be at least 1, not {total}")
    sizes = Counter(groups)
    load = [0] * total
    shard_of: dict[str, int] = {}
    for group, size in sorted(sizes.items(), key=lambda item: (-item[1], item[0])):
        target = min(range(total), key=lambda i: (load[i], i))
        shard_of[group] = target + 1
        load[target] += size
    return [shard_of[group] for group in groups]


def selection_digest(case_ids: Iterable[str]) -> str:
    """Names the whole selection (every shard computes the same one): sha256 of the sorted case ids."""
    return hashlib.sha256("\n".join(sorted(case_ids)).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Selection:
    """What `select` kept for one shard, and what its run header says about it."""

    keep: list[int]  # indexes of the kept cases
    header: dict[str, Any]


def select(case_ids: Sequence[str], groups: Sequence[str], shard: Shard) -> Selection:
    """The cases of `shard` among all selected ones (ids and groups in the same order)."""
    owners = partition(groups, shard.total)
    keep = [i for i, owner in enumerate(owners) if owner == shard.index]
    header = {
        "index": shard.index,
        "total": shard.total,
        "cases": len(keep),
        "selection": selection_digest(case_ids),
        "selected": len(case_ids),
    }
    return Selection(keep, header)


def deselect_items(config: pytest.Config, items: list[pytest.Item], shard: Shard) -> dict[str, Any]:
    """Keep only `shard`'s items (in place; the rest reported deselected); returns the header's `shard`."""
    ids, groups = [], []
    for item in items:
        callspec = getattr(item, "callspec", None)
        case = callspec.params.get("case") if callspec else None
        if isinstance(case, tuple):  # (suite, runner, step)
            suite, runner, step = case
            ids.append(case_id(suite, runner.name, step))
            groups.append(f"{suite}/{runner.name}")
        else:  # not a case of a runner: a group of its own
            ids.append(item.nodeid)
            groups.append(item.nodeid)
    chosen = select(ids, groups, shard)
    kept = set(chosen.keep)
    deselected = [item for i, item in enumerate(items) if i not in kept]
    items[:] = [item for i, item in enumerate(items) if i in kept]
    if deselected:
        config.hook.pytest_deselected(items=deselected)
    return chosen.header


# --- merge ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MergeResult:
    path: Path
    exit_code: int
    problems: list[str]  # shards missing or truncated


def _fingerprint(run: Run) -> tuple[Any, ...]:
    header = run.header
    shard = header.get("shard") or {}
    return (
        shard.get("total"),
        shard.get("selection"),
        header["endpoint"]["name"],
        header.get("git_sha"),
        header.get("harness_version"),
        header.get("expectations"),
    )


def _check_one_run(runs: Sequence[Run]) -> int:
    """The total N of the shards' run; raises `ShardError` unless every run is a distinct shard of it."""
    for run in runs:
        if not isinstance(run.header.get("shard"), dict):
            raise ShardError(f"{run.path}: not a shard (its header has no `shard`: run it with --shard K/N)")
    first = _fingerprint(runs[0])
    for run in runs[1:]:
        if _fingerprint(run) != first:
            names = ("total", "selection", "endpoint", "git sha", "harness version", "expectations")
            differing = [n for n, a, b in zip(names, first, _fingerprint(run), strict=True) if a != b]
            raise ShardError(
                f"{run.path} is not a shard of the same run as {runs[0].path}: they differ in {', '.join(differing)}"
            )
    seen: dict[int, Path] = {}
    for run in runs:
        index = int(run.header["shard"]["index"])
        if index in seen:
            raise ShardError(f"shard {index}/{first[0]} given twice: {seen[index]} and {run.path}")
        seen[index] = run.path
    return int(first[0])


def _shard_case(index: int, total: int, run: Run | None) -> CaseRecord:
    """One case per shard: `pass` when it finished with every case it planned, else `error` saying why."""
    problem: str | None = None
    details: dict[str, Any] = {"shard": f"{index}/{total}"}
    if run is None:
        problem = f"missing shard {index}/{total}: no run directory of it was given"
    else:
        planned = int(run.header["shard"]["cases"])
        recorded = sum(case.suite != "housekeeping" for case in run.cases)
        details.update(run_id=run.run_id, planned=planned, recorded=recorded, status=run.status)
        if run.truncated:
            problem = f"shard {index}/{total} is truncated: run.json has no footer ({recorded} of {planned} cases)"
        elif recorded < planned:
            problem = f"shard {index}/{total} is truncated: {recorded} of {planned} cases recorded ({run.status})"
    return CaseRecord(
        id=case_id(SHARD_SUITE, "harness", f"shard_{index}_of_{total}"),
        suite=SHARD_SUITE,
        runner="harness",
        case=f"shard_{index}_of_{total}",
        outcome="error" if problem else "pass",
        expected="pass",
        conformant=problem is None,
        error=problem,
        details=details,
    )


def _merged_leak_check(runs: Sequence[Run]) -> list[CaseRecord]:
    """The shards' leak checks as one: every survivor of every shard, every error."""
    checks = [case for run in runs for case in run.cases if case.id == HOUSEKEEPING]
    if not checks:
        return []
    found = Sweep(
        survivors=[s for case in checks for s in case.details.get("survivors", [])],
        deletes={k: v for case in checks for k, v in (case.details.get("deletes") or {}).items()},
        foreign=[s for case in checks for s in case.details.get("foreign", [])],
    )
    # the sweep's own findings are rebuilt from the details; only errors of another kind are carried over
    errors = [
        case.error for case in checks
        if case.error and not (case.details.get("survivors") or case.details.get("foreign"))
    ]  # fmt: skip
    duration = sum(case.duration_ms or 0 for case in checks)
    return [leak_record(found, "; ".join(errors) or None, round(duration, 1))]


def _spent(runs: Sequence[Run]) -> dict[str, Any]:
    """The shards' cost figures and retries, summed (those a shard's footer has: one cut short has none)."""
    footers = [run.footer for run in runs if run.footer]
    costs = [footer["cost"] for footer in footers if footer.get("cost")]
    spent: dict[str, Any] = {"cost": merged_cost(costs)} if costs else {}
    retried: Counter[str] = Counter()
    for footer in footers:
        retried.update((footer.get("retries") or {}).get("by_status") or {})
    if any(footer.get("retries") for footer in footers):
        spent["retries"] = retries_figure(retried)
    return spent


def _copy_files(runs: Sequence[Run], target: Path) -> None:
    """Every other file of each shard: JSON-lines logs are concatenated, anything else seen twice gets a suffix."""
    for run in runs:
        index = run.header["shard"]["index"]
        for source in sorted(p for p in run.path.rglob("*") if p.is_file()):
            relative = source.relative_to(run.path)
            if str(relative) in OWN_FILES or source.name.startswith("."):
                continue
            destination = target / relative
            destination.parent.mkdir(parents=True, exist_ok=True)
            if not destination.exists():
                shutil.copyfile(source, destination)
            elif source.suffix == ".jsonl":
                with destination.open("ab") as out:
                    out.write(source.read_bytes())
            else:
                shutil.copyfile(source, destination.with_name(f"{source.stem}.shard-{index}{source.suffix}"))


def _status(runs: Sequence[Run]) -> str:
    """How the shards that were given ended; a missing or short shard is a failing case, not an interruption."""
    statuses = {run.status for run in runs}
    if "aborted" in statuses:
        return "aborted"
    return "completed" if statuses == {"completed"} else "interrupted"


def _run_dirs(paths: Sequence[Path]) -> list[Path]:
    """The run directories among `paths`: a results directory's `latest.json` pointer (a glob over a
    downloaded shard artifact picks it up; it names a path on the shard's machine) is passed over."""
    dirs = []
    for path in paths:
        if path.is_dir():
            dirs.append(path)
        elif path.name != LATEST_JSON:
            raise ShardError(f"{path} is not a run directory: give the shards' run directories")
    return dirs


def merge(run_dirs: Sequence[Path], results_dir: Path, report: bool = True) -> MergeResult:
    """One run directory with every shard's cases, one case per shard, one leak check, JUnit and report.

    Raises `ShardError` (nothing written) when the directories are not distinct shards of one run.
    """
    run_dirs = _run_dirs(run_dirs)
    if not run_dirs:
        raise ShardError("merge needs the run directories of the shards")
    runs = sorted(
        (read_run(path, allow_truncated=True) for path in run_dirs), key=lambda r: int(r.header["shard"]["index"])
        if isinstance(r.header.get("shard"), dict) else 0,
    )  # fmt: skip
    total = _check_one_run(runs)
    by_index = {int(run.header["shard"]["index"]): run for run in runs}
    shard_cases = [_shard_case(index, total, by_index.get(index)) for index in range(1, total + 1)]
    problems = [case.error for case in shard_cases if case.error]
    first = runs[0]
    suites = sorted({s for run in runs for s in str(run.header["suite"]).split("+") if s != "none"})
    header = {
        key: value for key, value in first.header.items() if key not in ("run_id", "suite", "started_at", "shard")
    }
    header["pins"] = {name: pins for run in runs for name, pins in run.header["pins"].items()}
    header["shard"] = {
        "total": total,
        "selection": first.header["shard"]["selection"],
        "selected": first.header["shard"].get("selected"),
        "merged": [run.run_id for run in runs],
    }
    started = min(datetime.fromisoformat(str(run.header["started_at"]).replace("Z", "+00:00")) for run in runs)
    redactor = Redactor()
    merged = RunDir.create(
        results_dir, "+".join(suites) or "none", f"{header['endpoint']['name']}-merged", header, redactor, now=started
    )
    for run in runs:
        for case in run.cases:
            if case.id != HOUSEKEEPING:
                merged.record(case)
    for case in [*_merged_leak_check(runs), *shard_cases]:
        merged.record(case)
    _copy_files(runs, merged.path)
    cases = [case for run in runs for case in run.cases if case.id != HOUSEKEEPING]
    conformant = all(case.conformant for case in [*cases, *_merged_leak_check(runs), *shard_cases])
    exit_code = EXIT_OK if conformant and not problems else EXIT_FAILED
    merged.write_text("junit.xml", write_junit(merged.path))
    merged.finish(_status(runs), exit_code, **_spent(runs))  # type: ignore[arg-type]
    write_causes(merged.path, redactor)
    if report:
        from .report import render

        render([merged.path], merged.path, redactor)
    return MergeResult(merged.path, exit_code, problems)
