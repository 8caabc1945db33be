"""`e2b-bench detect`: proof that the harness detects each deviation the embedded endpoint can have.

Runs the probes, the refusal cases and the Python behaviours once against the faithful profile and once
per quirk switched on alone (two runs at a time), each judged by the faithful endpoint's declarations,
and records one case per quirk: the cases it flagged (`details.flagged`) and the run directory that
shows them. A quirk that flags nothing is `fail`: the harness would not notice that deviation; the
faithful baseline must flag nothing.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from .localbox.mutations import MUTATIONS
from .localbox.quirks import OPTION_FIELDS
from .redaction import Redactor
from .results import CaseRecord, RunDir, case_id, make_header, read_run

REPO_ROOT = Path(__file__).resolve().parents[1]
SUITES = (
    "sandboxes/e2b/test_probes.py::test_probes",
    "sandboxes/e2b/test_probes.py::test_refusals",
    "sandboxes/e2b/test_behaviours.py",
)
RUNNER = "py-e2b-2.63.0"
# The 2.5 MB output and 20 MiB round-trip probes relate to no quirk; the faithful baseline still runs them.
HEAVY = "not pr13_large_output and not pr14_binary_round_trip"
BASELINE = "none (faithful)"

# Every behavioural quirk, as `--quirk` takes it. Identity quirks (token and id prefixes, the 401 text)
# change no behaviour a case asserts, so they are recorded by the probes rather than flagged.
QUIRKS: tuple[str, ...] = (
    "cwd_override=/workspace",
    "session_leader",
    "end_on_exit",
    "refuse_stdin",
    "refuse_pty",
    "refuse_gzip_upload",
    "refuse_signed_urls",
    "watch_dir_404",
    "metrics_404",
    "template_build_501",
    *(f"refuse_create_options={option}" for option in OPTION_FIELDS),
    *(f"mutations={name}" for name in MUTATIONS),
)
PARALLEL = 2  # quirk runs at a time: each has its own embedded endpoint


def run_one(results: Path, quirk: str | None) -> Path:
    """One recorded run of the probes and refusals; returns its run directory."""
    results.mkdir(parents=True, exist_ok=True)
    before = {p for p in results.iterdir() if p.is_dir()}
    command = [sys.executable, "-m", "bench.cli", "run", *SUITES, "--runner", RUNNER, "--results-dir", str(results)]
    command += ["--no-report"] + ([f"--quirk={quirk}", "-k", HEAVY] if quirk else [])
    done = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=600, check=False)
    made = sorted({p for p in results.iterdir() if p.is_dir()} - before)
    if done.returncode not in (0, 1) or len(made) != 1:
        raise RuntimeError(f"run with quirk {quirk!r} ended with {done.returncode}: {done.stdout[-1500:]}")
    return made[0]


def flagged(run_dir: Path) -> list[str]:
    return sorted(f"{c.suite}/{c.case}" for c in read_run(run_dir).cases if not c.conformant)


def detect(results_root: Path, quirks: tuple[str, ...] = QUIRKS) -> Path:
    """Run the baseline and every quirk; returns the detection run directory."""
    redactor = Redactor()
    endpoint = {"name": "local", "kind": "local", "api_url": "", "sandbox_url": "", "key_env": "(embedded)"}
    run = RunDir.create(results_root, "detection", "local", make_header(endpoint, {}, sys.argv), redactor)
    runs_dir = run.path / "runs"
    all_detected = True

    def timed(quirk: str | None) -> tuple[Path, float]:
        started = time.monotonic()
        run_dir = run_one(runs_dir / re.sub(r"[^A-Za-z0-9_.-]+", "-", quirk or "baseline"), quirk)
        return run_dir, round((time.monotonic() - started) * 1000, 1)

    try:
        with ThreadPoolExecutor(max_workers=PARALLEL) as pool:
            runs = list(pool.map(timed, (None, *quirks)))
        for quirk, (run_dir, duration_ms) in zip((None, *quirks), runs, strict=True):
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
                    duration_ms=duration_ms,
                    error=None if detected else ("flags cases" if quirk is None else "flags no case"),
                    details={"flagged": found, "run_dir": str(run_dir.relative_to(run.path))},
                )
            )
    except KeyboardInterrupt:
        run.finish("interrupted", 130)
        raise
    except Exception:
        run.finish("aborted", 2)
        raise
    run.finish("completed", 0 if all_detected else 1)
    return run.path


def main(results_root: Path) -> int:
    from .report import render

    os.chdir(REPO_ROOT)
    path = detect(results_root)
    paths = render([path], path)
    cases = read_run(path).cases
    width = max(len(c.case) for c in cases)
    for case in cases:
        verdict = "detected" if case.conformant else "NOT DETECTED"
        print(f"{case.case:{width}}  {verdict}: {', '.join(case.details['flagged']) or '-'}")
    print(f"run directory: {path}\nreport: {paths.html}")
    return 0 if all(c.conformant for c in cases) else 1
