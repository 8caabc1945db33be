"""junit.xml for CI systems, written from the run's own case records (so it is redacted like them)."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

from .results import CaseRecord, read_run


def junit_xml(cases: list[CaseRecord], name: str) -> str:
    suites: dict[str, list[CaseRecord]] = defaultdict(list)
    for case in cases:
        suites[f"{case.suite}.{case.runner}"].append(case)
    root = ET.Element("testsuites", name=name)
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
                suite, "testcase", classname=suite_name, name=case.case, time=f"{(case.duration_ms or 0) / 1000:.3f}"
            )
            message = f"{case.outcome} (declared {case.expected})" + (f": {case.error}" if case.error else "")
            if not case.conformant:
                tag = "error" if case.outcome == "error" else "failure"
                ET.SubElement(element, tag, message=message[:500], type=case.outcome).text = case.note or message
            elif case.outcome == "skip":
                ET.SubElement(element, "skipped", message=(case.error or "skipped")[:500])
            elif case.outcome != "pass":
                ET.SubElement(element, "system-out").text = f"as declared: {message}"
    ET.indent(root)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def write_junit(run_path: Path) -> str:
    run = read_run(run_path, allow_truncated=True)
    return junit_xml(run.cases, run.path.name)
