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

from .results import CaseRecord, Run

PREFLIGHT_JSON = "preflight.json"
# Where each suite's pytest items `test_<suite>[<runner>/<step>]` live, so `-k` can select one case.
SUITE_FILES = {
    "quickstart": "sandboxes/e2b/test_quickstart.py",
    "probes": "sandboxes/e2b/test_probes.py",
    "refusals": "sandboxes/e2b/test_probes.py",
    "tokens": "sandboxes/e2b/test_probes.py",
    "frameworks": "frameworks/test_frameworks.py",
    "code-interpreter": "sandboxes/code-interpreter/test_code_interpreter.py",
    "computer": "sandboxes/e2b/test_computer.py",
}
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
)
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
    if not run.cases:
        return "no case ran (the selection matched nothing)"
    return None


def verdict(runs: Sequence[Run], cases: Sequence[CaseRecord] | None = None) -> Verdict:
    """GATE PASSED or FAILED over `runs` (`cases`: the records to count, default every run's own)."""
    # A case recorded twice (a retry) counts by its last record.
    records = list(cases) if cases is not None else [c for run in runs for c in {x.id: x for x in run.cases}.values()]
    problems = [f"{run.run_id}: {problem}" for run in runs if (problem := run_problem(run)) is not None]
    nonconformant = sum(not case.conformant for case in records)
    passed = not problems and nonconformant == 0 and bool(records)
    counts = f"{len(records)} case(s), {len(records) - nonconformant} conformant, {nonconformant} non-conformant"
    suffix = f"; {len(problems)} run(s) did not finish normally" if problems else ""
    return Verdict(passed, f"GATE {'PASSED' if passed else 'FAILED'}: {counts}{suffix}", problems)


def _flags(argv: Sequence[str]) -> list[str]:
    """The endpoint-deciding flags of a recorded `run` command line, in order, as `--flag value` pairs."""
    kept: list[str] = []
    items = list(argv)
    for index, item in enumerate(items):
        name, equals, value = item.partition("=")
        if name not in ENDPOINT_FLAGS:
            continue
        if equals:
            kept += [name, value]
        elif index + 1 < len(items):
            kept += [name, items[index + 1]]
    return kept


def rerun_command(run: Run, case: CaseRecord) -> str:
    """A command that runs just this case again against the same endpoint, as the run did."""
    argv = [str(item) for item in run.header.get("argv", [])]
    flags = _flags(argv)
    if "--endpoint" not in flags:
        endpoint = run.header["endpoint"]
        flags = ["--endpoint", "local" if endpoint.get("kind") == "local" else endpoint["name"], *flags]
    command = ["./e2b-bench", "run", *flags]
    if case.suite in SUITE_FILES:
        selection = f"test_{case.suite.replace('-', '_')}[{case.runner}/{case.case}]"
        command += ["--runner", case.runner, "--include-slow", SUITE_FILES[case.suite], "-k", selection]
    return shlex.join(command)
