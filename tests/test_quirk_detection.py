"""Proof of detection: each quirk of the embedded endpoint, switched on alone, is flagged by exactly the
probes and refusal cases tied to it, and by nothing else; with its declaration every case conforms.

QUIRK_CASES is the specification: which observable behaviour each documented deviation changes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.expectations import Expectations, judge
from bench.results import read_run

REPO = Path(__file__).resolve().parents[1]
SUITES = ["sandboxes/e2b/test_probes.py::test_probes", "sandboxes/e2b/test_probes.py::test_refusals"]
RUNNER = "py-e2b-2.63.0"
B3OS = Expectations.load(REPO / "expectations" / "b3os-beta.toml")

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
    "refuse_create_options=mcp": {"refusals/rf01_create_mcp"},
    "refuse_create_options=pauseWithoutMemory": {"refusals/rf07_pause_without_memory"},
    "refuse_create_options=mcp,autoResume,volumeMounts,iam,network,onTimeoutFilesystem,pauseWithoutMemory,"
    "connectReboot": {
        f"refusals/{case}"
        for case in (
            "rf01_create_mcp",
            "rf02_create_auto_resume",
            "rf03_create_volume_mounts",
            "rf04_create_iam",
            "rf05_create_network_rules",
            "rf06_create_on_timeout_filesystem",
            "rf07_pause_without_memory",
            "rf08_connect_on_resume_reboot",
        )
    },  # fmt: skip
}


# The 2.5 MB output and 20 MiB round-trip probes relate to no quirk; the faithful run still covers them.
HEAVY = "not pr13_large_output and not pr14_binary_round_trip"


def run(tmp_path: Path, *quirks: str) -> Path:
    results = tmp_path / "results"
    done = subprocess.run(
        [sys.executable, "-m", "bench.cli", "run", *SUITES, "--runner", RUNNER, "--results-dir", str(results),
         "--no-report", *(f"--quirk={q}" for q in quirks), *(["-k", HEAVY] if quirks else [])],
        cwd=REPO, capture_output=True, text=True, timeout=300, env=os.environ, check=False,
    )  # fmt: skip
    assert done.returncode in (0, 1), done.stdout[-2000:] + done.stderr[-2000:]
    (run_dir,) = [p for p in results.iterdir() if p.is_dir()]
    return run_dir


def flagged(run_dir: Path) -> set[str]:
    return {f"{c.suite}/{c.case}" for c in read_run(run_dir).cases if not c.conformant}


def test_the_faithful_profile_flags_nothing(tmp_path: Path) -> None:
    run_dir = run(tmp_path)

    assert flagged(run_dir) == set()
    assert len(read_run(run_dir).cases) == 16 + 15 + 1


@pytest.mark.parametrize("quirk", sorted(QUIRK_CASES))
def test_each_quirk_alone_is_flagged_by_exactly_its_cases_and_conforms_once_declared(
    tmp_path: Path, quirk: str
) -> None:
    run_dir = run(tmp_path, quirk)

    assert flagged(run_dir) == QUIRK_CASES[quirk]
    # The same observations, judged against what b3os-beta declares for them, all conform.
    for case in read_run(run_dir).cases:
        if f"{case.suite}/{case.case}" in QUIRK_CASES[quirk]:
            observed = case.details.get("observed_outcome", case.outcome)
            verdict = judge(observed, case.details, case.error, B3OS.for_case(case.id))
            assert verdict.conformant, (case.id, verdict.note, json.dumps(case.details)[:500])
