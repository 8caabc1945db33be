"""What changed: a run against a baseline (`report --baseline BASE RUN`) and N runs as a history (`--history DIR`).

A diff lists new failures, fixed cases, changed symptoms, new and removed cases, durations that moved by
more than a factor, and pin and endpoint changes. A history is a per-case timeline, the cases that flipped
while nothing they depend on changed (flaky), and the benchmark ratios across the runs.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TextIO

from .redaction import Redactor
from .report import (
    SYMBOLS,
    TEMPLATES,
    ReportPaths,
    bench_comparison,
    bench_documents,
    publish,
    render,
    run_stamp,
    template_environment,
)
from .results import CaseRecord, Run, RunError, read_run
from .verdict import run_problem, verdict

DURATION_FACTOR = 2.0  # a case this many times slower (or faster) than in the baseline is listed
DURATION_FLOOR_MS = 200.0  # ... when it also moved by at least this much: jitter of quick cases is noise
NEW_FAILURE = "new failure"
# How a diff is listed: what breaks a gate first, pins last.
ORDER = ("new failure", "fixed", "symptom changed", "new case", "removed case", "endpoint changed", "slower", "faster")
# Sandbox ids, ports, pids and timings differ in every run (status codes do not): compared without them.
_VOLATILE = re.compile(r"\b[a-z0-9]{20}\b|\d+\.\d+|\d{4,}")


@dataclass(frozen=True)
class Change:
    kind: str
    subject: str
    before: str = ""
    after: str = ""


@dataclass(frozen=True)
class Diff:
    baseline: str
    run: str
    changes: list[Change]

    @property
    def new_failures(self) -> list[Change]:
        return [change for change in self.changes if change.kind == NEW_FAILURE]

    def to_model(self) -> dict[str, Any]:
        return {"baseline": self.baseline, "run": self.run, "rows": [asdict(change) for change in self.changes]}


def symptom(case: CaseRecord) -> str:
    first = (case.error or "").strip().splitlines()[0] if (case.error or "").strip() else ""
    declared = "" if case.conformant else f" (declared {case.expected})"
    return f"{case.outcome}{declared}" + (f": {first}" if first else "")


def _same_symptom(a: CaseRecord, b: CaseRecord) -> bool:
    return _VOLATILE.sub("#", symptom(a)) == _VOLATILE.sub("#", symptom(b))


def _last(run: Run) -> dict[str, CaseRecord]:
    """The run's cases by id; a case recorded twice (a retry) by its last record."""
    return {case.id: case for case in run.cases}


def _case_changes(old: dict[str, CaseRecord], new: dict[str, CaseRecord], factor: float) -> list[Change]:
    changes: list[Change] = []
    for key in sorted(old.keys() | new.keys()):
        before, after = old.get(key), new.get(key)
        if after is None:
            assert before is not None
            changes.append(Change("removed case", key, symptom(before), ""))
        elif before is None:
            changes.append(Change(NEW_FAILURE if not after.conformant else "new case", key, "", symptom(after)))
        elif before.conformant and not after.conformant:
            changes.append(Change(NEW_FAILURE, key, symptom(before), symptom(after)))
        elif not before.conformant and after.conformant:
            changes.append(Change("fixed", key, symptom(before), symptom(after)))
        elif not after.conformant and not _same_symptom(before, after):
            changes.append(Change("symptom changed", key, symptom(before), symptom(after)))
        else:
            changes.extend(_duration_change(key, before, after, factor))
    return changes


def _duration_change(key: str, before: CaseRecord, after: CaseRecord, factor: float) -> list[Change]:
    if before.duration_ms is None or after.duration_ms is None:
        return []
    slow, fast = max(before.duration_ms, after.duration_ms), min(before.duration_ms, after.duration_ms)
    if slow - fast < DURATION_FLOOR_MS or slow < fast * factor:
        return []
    kind = "slower" if after.duration_ms > before.duration_ms else "faster"
    return [Change(kind, key, f"{before.duration_ms:.0f} ms", f"{after.duration_ms:.0f} ms")]


def _pin_changes(old: dict[str, dict[str, str]], new: dict[str, dict[str, str]]) -> list[Change]:
    changes = []
    for runner in sorted(old.keys() | new.keys()):
        if runner not in old:
            changes.append(Change("runner added", runner, "", f"{len(new[runner])} pins"))
            continue
        if runner not in new:
            changes.append(Change("runner removed", runner, f"{len(old[runner])} pins", ""))
            continue
        before, after = old[runner], new[runner]
        for package in sorted(before.keys() | after.keys()):
            if before.get(package) != after.get(package):
                kind = (
                    "pin added" if package not in before else "pin removed" if package not in after else "pin changed"
                )
                changes.append(Change(kind, f"{runner}: {package}", before.get(package, ""), after.get(package, "")))
    return changes


def endpoint_identity(run: Run) -> str:
    """What names the endpoint across runs (a local endpoint's port differs in every run)."""
    endpoint = run.header["endpoint"]
    return f"{endpoint['name']} ({endpoint['kind']})"


def diff(baseline: Run, run: Run, factor: float = DURATION_FACTOR) -> Diff:
    changes: list[Change] = []
    problem = run_problem(run)
    if problem is not None and run_problem(baseline) is None:
        changes.append(Change(NEW_FAILURE, "run", "finished", problem))
    if endpoint_identity(baseline) != endpoint_identity(run):
        changes.append(Change("endpoint changed", "endpoint", endpoint_identity(baseline), endpoint_identity(run)))
    changes += _case_changes(_last(baseline), _last(run), factor)
    changes.sort(key=lambda change: ORDER.index(change.kind))
    changes += _pin_changes(baseline.header["pins"], run.header["pins"])
    return Diff(baseline.run_id, run.run_id, changes)


# --- history -------------------------------------------------------------------------------------


def find_runs(root: Path) -> list[Run]:
    """Every run directory under `root` (any depth), oldest first; directories that are not runs are skipped."""
    runs = []
    for run_json in root.rglob("run.json"):
        try:
            runs.append(read_run(run_json.parent, allow_truncated=True))
        except RunError:
            continue
    return sorted(runs, key=lambda run: str(run.header["started_at"]))


def _context(run: Run, runner: str) -> tuple[str, dict[str, str]]:
    return endpoint_identity(run), run.header["pins"].get(runner, {})


def flaky(runs: Sequence[Run]) -> list[dict[str, Any]]:
    """Cases that flipped at least twice (bad and back) between consecutive runs with the same endpoint and pins.

    One flip is a regression or a fix; a second one under unchanged conditions is a flake.
    """
    found: dict[str, list[str]] = {}
    previous: dict[str, tuple[Run, CaseRecord]] = {}
    for run in runs:
        for key, case in _last(run).items():
            if key in previous:
                old_run, old = previous[key]
                same = _context(old_run, case.runner) == _context(run, case.runner)
                if same and old.conformant != case.conformant:
                    found.setdefault(key, []).append(f"{old_run.run_id} → {run.run_id}")
            previous[key] = (run, case)
    return [
        {"case": key, "flips": len(pairs), "between": pairs} for key, pairs in sorted(found.items()) if len(pairs) > 1
    ]


def changed(key: str, cases: Sequence[dict[str, CaseRecord]]) -> bool:
    """Did the case's outcome (or whether it conformed) differ between the runs that recorded it?"""
    return len({(by_id[key].outcome, by_id[key].conformant) for by_id in cases if key in by_id}) > 1


def history_model(runs: Sequence[Run], redactor: Redactor, every_case: bool = False) -> dict[str, Any]:
    """The timeline keeps the cases whose outcome changed between runs (`every_case`: all of them)."""
    cases = [_last(run) for run in runs]
    keys = sorted(set().union(*cases))
    shown = keys if every_case else [key for key in keys if changed(key, cases)]
    timeline = [
        {
            "case": key,
            "cells": [
                None
                if key not in by_id
                else {
                    "symbol": SYMBOLS[by_id[key].outcome],
                    "outcome": by_id[key].outcome,
                    "conformant": by_id[key].conformant,
                    "title": symptom(by_id[key]),
                }
                for by_id in cases
            ],
        }
        for key in shown
    ]
    columns = []
    for run in runs:
        gate = verdict([run])
        columns.append(
            {"run_id": run.run_id, "label": f"{endpoint_identity(run)} · {run_stamp(run)}", "passed": gate.passed}
        )
    documents = bench_documents(runs)
    model: dict[str, Any] = redactor.redact_obj(
        {
            "columns": columns,
            "timeline": timeline,
            "flaky": flaky(runs),
            "symbols": SYMBOLS,
            "every_case": every_case,
            "case_count": len(keys),
        }
    )
    model["bench"] = bench_comparison(documents, redactor)
    return model


def render_history(
    runs: Sequence[Run], out_dir: Path, redactor: Redactor | None = None, every_case: bool = False
) -> ReportPaths:
    redactor = redactor or Redactor()
    model = history_model(runs, redactor, every_case)
    environment = template_environment(TEMPLATES)
    paths = ReportPaths(html=out_dir / "history.html", markdown=out_dir / "history.md")
    for template, path in (("history.html.j2", paths.html), ("history.md.j2", paths.markdown)):
        publish(path, redactor.redact_text(environment.get_template(template).render(**model)))
    return paths


# --- the `report` command ------------------------------------------------------------------------


def report_command(
    run_dirs: Sequence[Path],
    out: Path,
    *,
    baseline: Path | None = None,
    history: Path | None = None,
    every_case: bool = False,
    fail_on_new: bool = False,
    factor: float = DURATION_FACTOR,
    stdout: TextIO = sys.stdout,
) -> int:
    """`e2b-bench report`: 0, or 1 when `fail_on_new` and the run has a new failure; RunError for bad input."""
    if history is not None:
        if run_dirs or baseline is not None:
            raise RunError("--history renders every run under DIR: give no run directory and no --baseline with it")
        runs = find_runs(history)
        if not runs:
            raise RunError(f"{history}: no run directory (no run.json) found under it")
        paths = render_history(runs, out, every_case=every_case)
        print(f"history of {len(runs)} run(s): {paths.html}", file=stdout)
        print(f"summary: {paths.markdown}", file=stdout)
        return 0
    if every_case:
        raise RunError("--all applies to --history DIR only: give --history, or drop --all")
    if not run_dirs:
        raise RunError("give the run directories to render (or --history DIR)")
    if baseline is None:
        paths = render(run_dirs, out)
        print(f"report: {paths.html}", file=stdout)
        print(f"summary: {paths.markdown}", file=stdout)
        return 0
    if len(run_dirs) != 1:
        raise RunError("--baseline compares one run with the baseline: give exactly one run directory after it")
    result = diff(read_run(baseline, allow_truncated=True), read_run(run_dirs[0], allow_truncated=True), factor)
    paths = render(run_dirs, out, changes=result.to_model())
    for change in result.changes:
        moved = f": {change.before or '—'} → {change.after or '—'}" if change.before or change.after else ""
        print(f"{change.kind}: {change.subject}{moved}", file=stdout)
    print(
        f"{len(result.new_failures)} new failure(s), {len(result.changes)} change(s) since {result.baseline}",
        file=stdout,
    )
    print(f"report: {paths.html}", file=stdout)
    print(f"summary: {paths.markdown}", file=stdout)
    return 1 if fail_on_new and result.new_failures else 0
