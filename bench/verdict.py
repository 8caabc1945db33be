"""The gate's verdict on a run: passed only when it finished, ran cases and every one conformed.

Shared by the report, the Markdown summary and junit.xml so that all three say the same thing, and
by `report --baseline`: a run that did not finish never reads as green anywhere.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .benchdoc import read_bench
from .results import CaseRecord, Run, RunError
from .runners.manifest import load_manifest

PREFLIGHT_JSON = "preflight.json"
# `run` flags that decide what a case meets: repeated in the re-run command as the run used them.
ENDPOINT_FLAGS = (
    "--endpoint",
    "--profile",
    "--quirk",
    "--expectations",
    "--step-timeout",
    "--model-base-url",
    "--model",
    "--model-key-env",
    "--attempts",
    "--results-dir",
    "--upstream-source",
)
WIRE_BODIES = "--wire-bodies"  # what the wire log keeps, repeated too
STATUS_REASONS = {
    "interrupted": "interrupted (Ctrl-C or SIGTERM) before every selected case ran",
    "aborted": "aborted before every selected case ran",
    "truncated": "no footer: the run did not finish (killed, or still running)",
}


@dataclass(frozen=True)
class Verdict:
    passed: bool
    headline: str
    problems: list[str]
    missed_targets: int = 0  # benchmark targets missed without `--gate`: passed, but never "GATE PASSED"


def preflight_error(run_path: Path) -> str | None:
    """The preflight's error message, when the endpoint was found unusable before any case ran."""
    try:
        document = json.loads((run_path / PREFLIGHT_JSON).read_text("utf-8"))
    except (FileNotFoundError, ValueError):
        return None
    error = document.get("error") if isinstance(document, dict) else None
    return str(error) if error else None


def run_problem(run: Run, status: str | None = None) -> str | None:
    """Why this run cannot count as a pass regardless of its cases, or None when it finished normally."""
    status = status or run.status
    preflight = preflight_error(run.path)
    if preflight is not None:
        return f"preflight failed, no case ran: {preflight}"
    if status in STATUS_REASONS:
        return f"{STATUS_REASONS[status]}; {len(run.cases)} case(s) recorded"
    if not run.cases and not empty_shard(run):
        return "no case ran (the selection matched nothing)"
    return None


def verdict(runs: Sequence[Run], cases: Sequence[CaseRecord] | None = None) -> Verdict:
    """GATE PASSED or FAILED over `runs` (`cases`: the records to count, default every run's own)."""
    # A case recorded twice (a retry) counts by its last record.
    records = list(cases) if cases is not None else [c for run in runs for c in {x.id: x for x in run.cases}.values()]
    problems = [f"{run.run_id}: {problem}" for run in runs if (problem := run_problem(run)) is not None]
    nonconformant = sum(not case.conformant for case in records)
    # no case at all fails the gate (run_problem), but for a shard dealt none: empty by design, its merge is judged
    passed = not problems and nonconformant == 0 and (bool(records) or (bool(runs) and all(map(empty_shard, runs))))
    counts = f"{len(records)} case(s), {len(records) - nonconformant} conformant, {nonconformant} non-conformant"
    suffix = f"; {len(problems)} run(s) did not finish normally" if problems else ""
    missed = sum(missed_targets(run.path) for run in runs)
    if passed and missed:
        return Verdict(passed, f"TARGETS MISSED (not gated): {missed} target(s) missed; {counts}", problems, missed)
    return Verdict(passed, f"GATE {'PASSED' if passed else 'FAILED'}: {counts}{suffix}", problems, missed)


def empty_shard(run: Run) -> bool:
    """A shard of a sharded run that was dealt no case (more shards than the selection has groups)."""
    shard = run.header.get("shard")
    return isinstance(shard, dict) and shard.get("cases") == 0


def missed_targets(run_path: Path) -> int:
    """How many of a benchmark run's performance targets were missed (0 for any other run)."""
    try:
        document = read_bench(run_path)
    except (OSError, ValueError, RunError):
        return 0
    if document is None:
        return 0
    measures = [doc for entry in document.get("runners", {}).values() for doc in entry.get("measures", {}).values()]
    return sum(1 for doc in measures if doc.get("target") is not None and doc["target"].get("met") is False)


def _flags(argv: Sequence[str]) -> list[str]:
    """The endpoint-deciding flags of a recorded `run` command line, in order, as `--flag value` pairs."""
    kept: list[str] = []
    items = list(argv)
    for index, item in enumerate(items):
        name, equals, value = item.partition("=")
        if name == WIRE_BODIES:  # its BYTES are optional: kept only when given
            following = items[index + 1] if index + 1 < len(items) else ""
            kept += [name, value] if equals else [name, following] if following.isdigit() else [name]
            continue
        if name not in ENDPOINT_FLAGS:
            continue
        if equals:
            kept += [name, value]
        elif index + 1 < len(items):
            kept += [name, items[index + 1]]
    return kept


def case_suites() -> set[str]:
    """The suites whose cases `run --case` selects: those with steps in a manifest (or from a source tree)."""
    return {
        suite
        for suite, tables in load_manifest().items()
        if any(isinstance(table, dict) and (table.get("steps") or "steps_from" in table) for table in tables.values())
    }


def rerun_command(run: Run, case: CaseRecord) -> str:
    """A command that runs just this case again (`--case <id>`, which also picks its runner and lets a slow case
    run) against the same endpoint, with the flags the run used. A case no suite holds (the leak check, a
    benchmark measure, a missing shard) comes from the whole command: that command again."""
    argv = [str(item) for item in run.header.get("argv", [])]
    if case.suite not in case_suites():
        return shlex.join(["./e2b-bench", *argv[1:]]) if len(argv) > 1 else "./e2b-bench run"
    return shlex.join(["./e2b-bench", "run", *endpoint_flags(run), "--case", case.id])


def endpoint_flags(run: Run) -> list[str]:
    """The flags of `run`'s command line that decide what its cases meet (`--endpoint` always named)."""
    flags = _flags([str(item) for item in run.header.get("argv", [])])
    if "--endpoint" not in flags:
        endpoint = run.header["endpoint"]
        flags = ["--endpoint", "local" if endpoint.get("kind") == "local" else endpoint["name"], *flags]
    return flags
