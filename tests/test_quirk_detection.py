"""Proof of detection (`e2b-bench detect`): each quirk of the embedded endpoint, switched on alone, is flagged
by the cases tied to it; a quirk of a documented endpoint conforms once that endpoint's declarations judge
it; the faithful profile flags nothing.

`bench.detection.DETECTED_BY` is the specification: which cases each deviation changes. Every quirk is one
test with a run of just its cases (`detection.run_one`), so the test workers share the runs. That a quirk
flags nothing else needs a whole run per quirk (about 40 s each, 70 quirks): `e2b-bench detect` proves it
for all of them; here it is proven over whole runs for two quirks.
"""

from __future__ import annotations

import json
from dataclasses import fields
from html.parser import HTMLParser
from pathlib import Path

import pytest
from shared_runs import Shared, profile_key, quirk_params, quirk_run, shares, whole_run

from bench.detection import (
    BASELINE,
    CONDITION_QUIRKS,
    DETECTED_BY,
    HOSTILE_MUTATIONS,
    HOSTILE_QUIRKS,
    IDENTITY_QUIRKS,
    JS_RUNNER,
    QUIRKS,
    RUNNER,
    SERVER_ONLY_QUIRKS,
    detect,
    flagged,
)
from bench.expectations import Expectations, judge
from bench.localbox.mutations import MUTATIONS
from bench.localbox.quirks import OPTION_FIELDS, PROFILES, Quirks
from bench.report import render
from bench.results import read_run

REPO = Path(__file__).resolve().parents[1]
B3OS = Expectations.load(REPO / "expectations" / "b3os-beta.toml")
QUIRK_CASES = {quirk: set(cases) for quirk, cases in DETECTED_BY.items()}
BEHAVIOURS = 59  # steps of the [behaviours.python] table, each run under the sync and the async client
COMPUTER = 9  # steps of the [computer.ts] table, (a)-(i) of the agent computer contract


def in_b3os_beta(quirk: str) -> bool:
    """Does the documented b3os-beta endpoint have this quirk (so its declarations must cover it)?"""
    name, _, value = quirk.partition("=")
    held = getattr(PROFILES["b3os-beta"], name)
    if isinstance(held, frozenset):
        return value in held
    return held == value if value else bool(held)


def test_every_behavioural_quirk_and_refused_option_has_a_specification() -> None:
    behavioural = {f.name for f in fields(Quirks)} - {
        *IDENTITY_QUIRKS,
        *SERVER_ONLY_QUIRKS,
        *CONDITION_QUIRKS,
        *HOSTILE_QUIRKS,
    }

    assert {quirk.split("=")[0] for quirk in QUIRKS} == behavioural
    assert {quirk.split("=")[1] for quirk in QUIRKS if quirk.startswith("refuse_create_options=")} == set(OPTION_FIELDS)
    assert {quirk.split("=")[1] for quirk in QUIRKS if quirk.startswith("mutations=")} == set(MUTATIONS) - set(
        HOSTILE_MUTATIONS
    )


def faithful_run(shared: Shared) -> Path:
    """The baseline: the faithful profile's whole default run, which the shipped profiles' test reads too (both
    tests below read it)."""
    return whole_run(shared, "e2b")[1]


@shares(profile_key("e2b"))
def test_the_faithful_profile_flags_nothing(shared: Shared) -> None:
    baseline = faithful_run(shared)
    cases = read_run(baseline).cases

    assert flagged(baseline) == []
    # every case a quirk flags ran in it: the Python behaviours under both clients, the probes, the refusals, the
    # computer suite (Node), the leak check
    assert set().union(*QUIRK_CASES.values()) <= {f"{case.suite}/{case.case}" for case in cases}
    assert len([case for case in cases if case.suite == "behaviours" and case.runner == RUNNER]) == 2 * BEHAVIOURS
    assert len([case for case in cases if case.suite == "computer" and case.runner == JS_RUNNER]) == COMPUTER


@pytest.mark.parametrize("quirk", quirk_params(sorted(QUIRK_CASES)))
def test_each_quirk_alone_is_flagged_by_its_cases_and_conforms_once_declared(shared: Shared, quirk: str) -> None:
    # Its cases (and those sharing their names) only: that no other case flags it is what `e2b-bench detect`
    # proves over every case, and the last test here over whole runs for two quirks.
    run_dir = quirk_run(shared, quirk)

    assert set(flagged(run_dir)) == QUIRK_CASES[quirk]
    if not in_b3os_beta(quirk):
        return  # no documented endpoint has it: nothing declares it
    # The same observations, judged against what b3os-beta declares for them, all conform.
    for observed_case in read_run(run_dir).cases:
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


@shares(profile_key("e2b"))
def test_detect_flags_exactly_each_quirks_cases_over_whole_runs_and_the_report_shows_the_table(
    shared: Shared, tmp_path: Path
) -> None:
    quirks = ("kill_returns_early", "mutations=stderr_dropped")

    detection = read_run(detect(tmp_path / "detect", quirks=quirks, baseline=faithful_run(shared)))
    paths = render([detection.path], tmp_path)
    parser = DetectionRows()
    parser.feed(paths.html.read_text())

    assert {case.case: set(case.details["flagged"]) for case in detection.cases} == {
        BASELINE: set(),
        **{quirk: QUIRK_CASES[quirk] for quirk in quirks},
    }
    assert parser.rows == {quirk: "true" for quirk in (BASELINE, *quirks)}
    assert "### Quirk detection" in paths.markdown.read_text()
    # the baseline given is copied in whole, with the time it took
    (baseline,) = [case for case in detection.cases if case.case == BASELINE]
    copied = read_run(detection.path / baseline.details["run_dir"])
    assert copied.cases == read_run(faithful_run(shared)).cases and baseline.duration_ms
