"""`e2b-bench detect`: proof that the harness detects each deviation the embedded endpoint can have.

Runs the probes and refusal cases once against the faithful profile and once per quirk switched on
alone, each judged by the faithful endpoint's declarations, and records one case per quirk: the cases it
flagged (`details.flagged`) and the run directory that shows them. A quirk that flags nothing is `fail`:
the harness would not notice that deviation; the faithful baseline must flag nothing.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from .endpoints import resolve
from .exits import ExitCode
from .lifecycle import Lifecycle
from .localbox.quirks import OPTION_FIELDS
from .paths import SANDBOXES_DIR
from .results import CaseRecord, case_id, read_run

PROBES = SANDBOXES_DIR / "e2b" / "test_probes.py"
SUITES = (f"{PROBES}::test_probes", f"{PROBES}::test_refusals")
RUNNER = "py-e2b-2.63.0"
# The 2.5 MB output and 20 MiB round-trip probes relate to no quirk; the faithful baseline still runs them.
HEAVY = "not pr13_large_output and not pr14_binary_round_trip"
BASELINE = "none (faithful)"
STOP_GRACE_S = 60  # for a run told to stop to kill its sandboxes and write its footer

# Which cases each behavioural quirk (as `--quirk` takes it), switched on alone, flags, and no other:
# the specification `detect` proves and tests/test_quirk_detection.py checks. Identity quirks (token and
# id prefixes, the 401 text) change no behaviour a case asserts: the token probes record them instead.
IDENTITY_QUIRKS = ("token_prefix", "sandbox_id_prefix", "token_error")
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
DETECTED_BY: dict[str, tuple[str, ...]] = {
    "cwd_override=/workspace": ("probes/pr01_default_cwd", "probes/pr02_login_profile", "probes/pr12_relative_paths"),
    "session_leader": ("probes/pr03_setsid",),
    "end_on_exit": ("probes/pr16_output_after_exit",),
    "refuse_stdin": ("probes/pr05_stdin", "refusals/rf10_envd_stdin"),
    "refuse_pty": ("probes/pr06_pty", "refusals/rf11_envd_pty"),
    "refuse_gzip_upload": ("probes/pr07_gzip", "refusals/rf12_gzip_upload"),
    "refuse_signed_urls": ("probes/pr08_signed_urls",),
    "watch_dir_404": ("probes/pr09_watch_dir", "refusals/rf14_envd_watch_dir"),
    "metrics_404": ("probes/pr10_metrics", "refusals/rf15_get_metrics"),
    "template_build_501": ("probes/pr11_template_build", "refusals/rf13_template_build"),
    **{f"refuse_create_options={option}": (f"refusals/{OPTION_CASES[option]}",) for option in OPTION_FIELDS},
}  # fmt: skip
QUIRKS: tuple[str, ...] = tuple(DETECTED_BY)


def run_one(results: Path, quirk: str | None) -> Path:
    """One recorded run of the probes and refusals; returns its run directory."""
    results.mkdir(parents=True, exist_ok=True)
    before = {p for p in results.iterdir() if p.is_dir()}
    command = [sys.executable, "-m", "bench.cli", "run", *SUITES, "--runner", RUNNER, "--results-dir", str(results)]
    command += ["--no-report"] + ([f"--quirk={quirk}", "-k", HEAVY] if quirk else [])
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as child:
        try:
            output = child.communicate(timeout=600)[0]
        except BaseException:  # Ctrl-C, SIGTERM or a hung run: the child stops its runners and writes its footer
            child.send_signal(signal.SIGTERM)
            child.communicate(timeout=STOP_GRACE_S)
            raise
    made = sorted({p for p in results.iterdir() if p.is_dir()} - before)
    if child.returncode not in (ExitCode.OK, ExitCode.NONCONFORMANT) or len(made) != 1:
        raise RuntimeError(f"run with quirk {quirk!r} ended with {child.returncode}: {output[-1500:]}")
    return made[0]


def flagged(run_dir: Path) -> list[str]:
    return sorted(f"{c.suite}/{c.case}" for c in read_run(run_dir).cases if not c.conformant)


def detect(results_root: Path, quirks: tuple[str, ...] = QUIRKS, report: bool = False) -> Path:
    """Run the baseline and every quirk (each run serves its own embedded endpoint); returns the run directory."""
    life = Lifecycle(resolve("local"), results_dir=results_root, report=report)
    run = life.open("detection", {})
    runs_dir = run.path / "runs"
    all_detected = True
    try:
        for quirk in (None, *quirks):
            started = time.monotonic()
            run_dir = run_one(runs_dir, quirk)
            found = flagged(run_dir)
            detected = not found if quirk is None else bool(found)
            all_detected = all_detected and detected
            name = quirk or BASELINE
            run.record(
                CaseRecord(
                    id=case_id("detection", "harness", name),
                    suite="detection",
                    runner="harness",
                    case=name,
                    outcome="pass" if detected else "fail",
                    expected="pass",
                    conformant=detected,
                    duration_ms=round((time.monotonic() - started) * 1000, 1),
                    error=None if detected else ("flags cases" if quirk is None else "flags no case"),
                    details={"flagged": found, "run_dir": str(run_dir.relative_to(run.path))},
                )
            )
    except KeyboardInterrupt:
        life.finish("interrupted", ExitCode.INTERRUPTED)
        raise
    except Exception:
        life.finish("aborted", ExitCode.USAGE)
        raise
    life.finish("completed", ExitCode.OK if all_detected else ExitCode.NONCONFORMANT)
    return run.path


def main(results_root: Path) -> int:
    path = detect(results_root, report=True)
    cases = read_run(path).cases
    width = max(len(c.case) for c in cases)
    for case in cases:
        verdict = "detected" if case.conformant else "NOT DETECTED"
        print(f"{case.case:{width}}  {verdict}: {', '.join(case.details['flagged']) or '-'}")
    print(f"run directory: {path}")
    if (path / "report.html").is_file():
        print(f"report: {path / 'report.html'}")
    return ExitCode.OK if all(c.conformant for c in cases) else ExitCode.NONCONFORMANT
