"""junit.xml for CI systems, written from the run's own case records (so it is redacted like them).

Test suites are named `<suite>.<runner>`; classnames are the same with the runner's dots made underscores,
so CI viewers do not split a version number into packages. A run that did not finish normally gets a failing
`e2b-bench.run` testcase (`preflight` or `not run`) carrying the reason, so its JUnit never reads as green.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

from .results import CaseRecord, Run, read_run
from .verdict import preflight_error, rerun_command, run_problem

MESSAGE_LIMIT = 500
RUN_SUITE = "e2b-bench.run"


def classname(suite: str, runner: str) -> str:
    return f"{suite}.{runner.replace('.', '_')}"


def _symptom(case: CaseRecord) -> str:
    """One line: what happened against what was declared, then the first line of the error."""
    first = (case.error or "").strip().splitlines()[0] if (case.error or "").strip() else ""
    return f"{case.outcome} (declared {case.expected})" + (f": {first}" if first else "")


def _body(run: Run, case: CaseRecord) -> str:
    """Everything a CI viewer needs without opening the report: symptom, note, error, details, re-run."""
    parts = [f"outcome: {case.outcome}, declared: {case.expected}"]
    if case.note:
        parts.append(f"note: {case.note}")
    if case.error:
        parts.append(f"error:\n{case.error}")
    if case.details:
        parts.append("details:\n" + json.dumps(case.details, indent=2, sort_keys=True, ensure_ascii=False))
    parts.append(f"re-run: {rerun_command(run, case)}")
    return "\n\n".join(parts)


def _run_suite(root: ET.Element, run: Run, status: str | None) -> None:
    # No status and no footer yet: the writer is finishing the run now (junit.xml comes before the footer).
    problem = run_problem(run, status or (run.status if run.footer is not None else "completed"))
    if problem is None:
        return
    name = "preflight" if preflight_error(run.path) is not None else "not run"
    suite = ET.SubElement(root, "testsuite", name=RUN_SUITE, tests="1", failures="1", errors="0", skipped="0")
    suite.set("time", "0.000")
    element = ET.SubElement(suite, "testcase", classname=RUN_SUITE, name=name, time="0.000")
    ET.SubElement(element, "failure", message=problem[:MESSAGE_LIMIT], type=name).text = problem


def junit_xml(run: Run, name: str, status: str | None = None) -> str:
    """The run's cases as JUnit; `status` is the one the footer is about to get (junit.xml is written first)."""
    suites: dict[str, list[CaseRecord]] = defaultdict(list)
    for case in run.cases:
        suites[f"{case.suite}.{case.runner}"].append(case)
    root = ET.Element("testsuites", name=name)
    _run_suite(root, run, status)
    for suite_name, members in suites.items():
        failures = sum(not c.conformant and c.outcome != "error" for c in members)
        errors = sum(not c.conformant and c.outcome == "error" for c in members)
        skipped = sum(c.conformant and c.outcome == "skip" for c in members)
        seconds = sum((c.duration_ms or 0) for c in members) / 1000
        suite = ET.SubElement(
            root,
            "testsuite",
            name=suite_name,
            tests=str(len(members)),
            failures=str(failures),
            errors=str(errors),
            skipped=str(skipped),
            time=f"{seconds:.3f}",
        )
        for case in members:
            element = ET.SubElement(
                suite,
                "testcase",
                classname=classname(case.suite, case.runner),
                name=case.case,
                time=f"{(case.duration_ms or 0) / 1000:.3f}",
            )
            if not case.conformant:
                tag = "error" if case.outcome == "error" else "failure"
                ET.SubElement(element, tag, message=_symptom(case)[:MESSAGE_LIMIT], type=case.outcome).text = _body(
                    run, case
                )
            elif case.outcome == "skip":
                ET.SubElement(element, "skipped", message=(case.error or "skipped")[:MESSAGE_LIMIT])
            elif case.outcome != "pass":
                ET.SubElement(element, "system-out").text = f"as declared: {_symptom(case)}"
    ET.indent(root)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def write_junit(run_path: Path, status: str | None = None) -> str:
    """junit.xml of the run at `run_path`; pass the `status` the footer is about to get, if known."""
    run = read_run(run_path, allow_truncated=True)
    return junit_xml(run, run.path.name, status)
