"""Proof of detection (`e2b-bench detect`): each quirk of the embedded endpoint, switched on alone, is flagged
by exactly the probes and refusal cases tied to it, and by nothing else; with its declaration every case
conforms; the faithful profile flags nothing.

`bench.detection.DETECTED_BY` is the specification: which cases each documented deviation changes.
"""

from __future__ import annotations

import json
from dataclasses import fields
from html.parser import HTMLParser
from pathlib import Path

import pytest

from bench.detection import BASELINE, DETECTED_BY, IDENTITY_QUIRKS, QUIRKS, detect
from bench.expectations import Expectations, judge
from bench.localbox.mutations import MUTATIONS
from bench.localbox.quirks import OPTION_FIELDS, Quirks
from bench.report import render
from bench.results import Run, read_run

REPO = Path(__file__).resolve().parents[1]
B3OS = Expectations.load(REPO / "expectations" / "b3os-beta.toml")
QUIRK_CASES = {quirk: set(cases) for quirk, cases in DETECTED_BY.items()}
BEHAVIOURS = 45  # steps of the [behaviours.python] table, each run under the sync and the async client


@pytest.fixture(scope="module")
def detection(tmp_path_factory: pytest.TempPathFactory) -> Run:
    return read_run(detect(tmp_path_factory.mktemp("detect")))


def test_every_behavioural_quirk_and_refused_option_has_a_specification() -> None:
    behavioural = {f.name for f in fields(Quirks)} - set(IDENTITY_QUIRKS)

    assert {quirk.split("=")[0] for quirk in QUIRKS} == behavioural
    assert {quirk.split("=")[1] for quirk in QUIRKS if quirk.startswith("refuse_create_options=")} == set(OPTION_FIELDS)
    assert {quirk.split("=")[1] for quirk in QUIRKS if quirk.startswith("mutations=")} == set(MUTATIONS)


def test_the_faithful_profile_flags_nothing(detection: Run) -> None:
    (baseline,) = [c for c in detection.cases if c.case == BASELINE]
    baseline_run = read_run(detection.path / baseline.details["run_dir"])

    assert (baseline.outcome, baseline.details["flagged"]) == ("pass", [])
    # probes, refusals, the Python behaviours under both clients, the leak check
    assert len(baseline_run.cases) == 17 + 15 + 2 * BEHAVIOURS + 1


@pytest.mark.parametrize("quirk", sorted(QUIRK_CASES))
def test_each_quirk_alone_is_flagged_by_exactly_its_cases_and_conforms_once_declared(
    detection: Run, quirk: str
) -> None:
    (case,) = [c for c in detection.cases if c.case == quirk]

    assert (case.outcome, set(case.details["flagged"])) == ("pass", QUIRK_CASES[quirk])
    # The same observations, judged against what b3os-beta declares for them, all conform.
    for observed_case in read_run(detection.path / case.details["run_dir"]).cases:
        if f"{observed_case.suite}/{observed_case.case}" in QUIRK_CASES[quirk]:
            observed = observed_case.details.get("observed_outcome", observed_case.outcome)
            verdict = judge(observed, observed_case.details, observed_case.error, B3OS.for_case(observed_case.id))
            assert verdict.conformant, (observed_case.id, verdict.note, json.dumps(observed_case.details)[:500])


class DetectionRows(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.rows: dict[str, str] = {}

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if tag == "tr" and "data-quirk" in found:
            self.rows[str(found["data-quirk"])] = str(found["data-detected"])


def test_the_report_has_the_quirk_by_flagged_cases_table(detection: Run, tmp_path: Path) -> None:
    paths = render([detection.path], tmp_path)
    parser = DetectionRows()
    parser.feed(paths.html.read_text())

    assert parser.rows == {quirk: "true" for quirk in (BASELINE, *QUIRKS)}
    assert "### Quirk detection" in paths.markdown.read_text()
