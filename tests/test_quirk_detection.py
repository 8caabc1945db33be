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


def both(*bodies: str) -> set[str]:
    """A behaviour's cases under the sync and the async Python client."""
    return {f"behaviours/{flavour}_{body}" for body in bodies for flavour in ("sync", "async")}


# Each wire mutation (bench/localbox/mutations.py) breaks one documented behaviour; these cases notice.
MUTATION_CASES: dict[str, set[str]] = {
    "list_ignores_metadata": {*both("list_filters_paging")},
    "list_ignores_state": {*both("list_filters_paging", "rest_statuses")},
    "list_ignores_limit": {*both("list_filters_paging")},
    "list_ignores_next_token": {*both("list_filters_paging")},
    "get_drops_metadata": {*both("create_envs_metadata")},
    "get_state_always_running": {*both("pause_connect", "rest_statuses")},
    "create_ignores_timeout": {*both("create_timeout_end_at")},
    "create_ignores_envs": {*both("create_envs_metadata")},
    "create_ignores_internet_access": {*both("create_internet_access")},
    "set_timeout_ignored": {*both("rest_statuses", "set_timeout")},
    "pause_ignored": {*both("list_filters_paging", "pause_connect", "rest_statuses")},
    "kill_ignored": {*both("kill", "rest_statuses"), "housekeeping/leak_check"},
    "not_found_as_400": {*both("errors", "kill", "rest_statuses")},
    "bad_key_as_403": {*both("errors", "rest_statuses")},
    "metrics_empty": {*both("metrics"), "probes/pr10_metrics"},
    "start_ignores_envs": {*both("background_list_kill", "run_envs_cwd_user")},
    "start_ignores_cwd": {
        *both("background_list_kill", "run_envs_cwd_user"),
        "probes/pr01_default_cwd",
        "probes/pr02_login_profile",
    },
    "start_ignores_user": {*both("host_and_mcp", "run_envs_cwd_user")},
    "output_truncated": {*both("output_sizes")},
    "output_chunks_repeated": {*both("output_sizes")},
    "stderr_dropped": {*both("run_streams")},
    "exit_code_zeroed": {
        *both("pty_resize_kill", "run_exit_code"),
        "probes/pr03_setsid",
        "probes/pr04_exit_codes",
        "probes/pr06_pty",
    },
    "connect_drops_end": {*both("connect_command", "pty_connect_input")},
    "process_list_empty": {*both("background_list_kill")},
    "pty_resize_ignored": {*both("pty_resize_kill")},
    "list_dir_ignores_depth": {*both("list_depth")},
    "stat_owner_root": {*both("entry_info")},
    "stat_mtime_epoch": {*both("entry_info")},
    "stat_drops_symlink_target": {*both("entry_info")},
    "remove_ignored": {*both("remove", "remove_missing")},
    "watch_not_recursive": {"behaviours/async_watch_recursive"},
    "watcher_not_recursive": {"behaviours/sync_watch_recursive"},
    "watch_drops_removes": {"behaviours/async_watch_recursive"},
    "watcher_drops_removes": {"behaviours/sync_watch_recursive"},
    "download_truncated": {*both("gzip", "write_read_sizes")},
    "download_drops_last_byte": {
        *both(
            "gzip", "host_and_mcp", "read_formats", "rest_statuses", "run_exit_code", "signed_urls", "write_read_sizes"
        ),
        "probes/pr07_gzip",
        "probes/pr08_signed_urls",
    },
    "upload_ignores_user": {*both("write_as_user")},
    "upload_drops_metadata": {*both("file_metadata", "file_metadata_replaced")},
    "upload_ignores_gzip": {*both("gzip"), "probes/pr07_gzip"},
}

QUIRK_CASES: dict[str, set[str]] = {
    "cwd_override=/workspace": {
        "probes/pr01_default_cwd",
        "probes/pr02_login_profile",
        "probes/pr12_relative_paths",
        *both("run_envs_cwd_user"),
    },
    "session_leader": {"probes/pr03_setsid"},
    "end_on_exit": {"probes/pr16_output_after_exit"},
    "refuse_stdin": {"probes/pr05_stdin", "refusals/rf10_envd_stdin", *both("stdin", "stream_input")},
    "refuse_pty": {"probes/pr06_pty", "refusals/rf11_envd_pty", *both("pty_resize_kill", "pty_connect_input")},
    "refuse_gzip_upload": {"probes/pr07_gzip", "refusals/rf12_gzip_upload", *both("gzip")},
    "refuse_signed_urls": {"probes/pr08_signed_urls", *both("signed_urls")},
    "watch_dir_404": {"probes/pr09_watch_dir", "refusals/rf14_envd_watch_dir", *both("watch_recursive")},
    "metrics_404": {"probes/pr10_metrics", "refusals/rf15_get_metrics", *both("metrics", "rest_statuses")},
    "template_build_501": {"probes/pr11_template_build", "refusals/rf13_template_build"},
    **{f"refuse_create_options={option}": {f"refusals/{case}"} for option, case in OPTION_CASES.items()},
    **{f"mutations={name}": cases for name, cases in MUTATION_CASES.items()},
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
    # probes, refusals, the Python behaviours under both clients, the leak check
    assert len(baseline_run.cases) == 17 + 15 + 2 * 45 + 1


@pytest.mark.parametrize("quirk", sorted(QUIRK_CASES))
def test_each_quirk_alone_is_flagged_by_exactly_its_cases_and_conforms_once_declared(
    detection: Run, quirk: str
) -> None:
    (case,) = [c for c in detection.cases if c.case == quirk]

    assert (case.outcome, set(case.details["flagged"])) == ("pass", QUIRK_CASES[quirk])
    if quirk.startswith("mutations="):
        return  # wire mutations belong to no documented endpoint: nothing declares them
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
