"""Proof of detection (`e2b-bench detect`): each quirk of the embedded endpoint, switched on alone, is flagged
by exactly the probes and refusal cases tied to it, and by nothing else; with its declaration every case
conforms; the faithful profile flags nothing.

QUIRK_CASES is the specification: which observable behaviour each documented deviation changes.
"""

from __future__ import annotations

import json
from html.parser import HTMLParser
from pathlib import Path

import pytest

from bench.detection import BASELINE, QUIRKS, detect
from bench.expectations import Expectations, judge
from bench.report import render
from bench.results import Run, read_run

REPO = Path(__file__).resolve().parents[1]
B3OS = Expectations.load(REPO / "expectations" / "b3os-beta.toml")
OPTION_CASES = {
    "mcp": "rf01_create_mcp",
    "autoResume": "rf02_create_auto_resume",
    "volumeMounts": "rf03_create_volume_mounts",
    "iam": "rf04_create_iam",
    "network": "rf05_create_network_rules",
    "onTimeoutFilesystem": "rf06_create_on_timeout_filesystem",
    "pauseWithoutMemory": "rf07_pause_without_memory",
    "connectReboot": "rf08_connect_on_resume_reboot",
}
QUIRK_CASES: dict[str, set[str]] = {
    "cwd_override=/workspace": {
        "probes/pr01_default_cwd",
        "probes/pr02_login_profile",
        "probes/pr12_relative_paths",
    },
    "session_leader": {"probes/pr03_setsid"},
    "end_on_exit": {"probes/pr16_output_after_exit"},
    "refuse_stdin": {"probes/pr05_stdin", "refusals/rf10_envd_stdin"},
    "refuse_pty": {"probes/pr06_pty", "refusals/rf11_envd_pty"},
    "refuse_gzip_upload": {"probes/pr07_gzip", "refusals/rf12_gzip_upload"},
    "refuse_signed_urls": {"probes/pr08_signed_urls"},
    "watch_dir_404": {"probes/pr09_watch_dir", "refusals/rf14_envd_watch_dir"},
    "metrics_404": {"probes/pr10_metrics", "refusals/rf15_get_metrics"},
    "template_build_501": {"probes/pr11_template_build", "refusals/rf13_template_build"},
    **{f"refuse_create_options={option}": {f"refusals/{case}"} for option, case in OPTION_CASES.items()},
}


@pytest.fixture(scope="module")
def detection(tmp_path_factory: pytest.TempPathFactory) -> Run:
    return read_run(detect(tmp_path_factory.mktemp("detect")))


def test_every_quirk_has_a_specification() -> None:
    assert set(QUIRKS) == set(QUIRK_CASES)


def test_the_faithful_profile_flags_nothing(detection: Run) -> None:
    (baseline,) = [c for c in detection.cases if c.case == BASELINE]
    baseline_run = read_run(detection.path / baseline.details["run_dir"])

    assert (baseline.outcome, baseline.details["flagged"]) == ("pass", [])
    assert len(baseline_run.cases) == 17 + 15 + 1


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
