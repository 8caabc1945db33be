"""`e2b-bench bisect --case ID --package NAME [--good V] [--bad V]`: the first release of a package with which a case
fails on the endpoint, as cargo-bisect-rustc finds the first nightly of a regression.

The case's runner part may be a pattern (`quickstart/py-e2b-*/py01_create`): the base runner is the first (the
newest) that matches. The versions are the final releases the registry lists (bench/runners/versioned.py), from
`--good` (default: the oldest release of `--bad`'s major line) to `--bad` (default: the base runner's pin). Each
version is one `run --runner BASE@NAME==V --case ...` of this harness with the endpoint flags given (so each
runner environment is built once and cached), under `<results>/<stamp>-bisect-<name>/runs/`. Both ends are
checked first: `--good` must pass and `--bad` fail; the symptom is the bad end's failure signature
(bench/triage/causes.signature), and a version that fails with another one is no verdict on this regression
(`other`, left out of the search as `git bisect skip` does). `bisect.json` records first_bad, last_good and every
version tried with its outcome.
"""

from __future__ import annotations

import fnmatch
import json
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.results import CaseRecord, atomic_write, read_run
from bench.runners.catalog import available_runners
from bench.runners.envs import RunnerEnvError
from bench.runners.versioned import base_name, released_versions, version_key, versioned
from bench.triage.causes import signature

RUN_TIMEOUT_S = 1800


class BisectError(Exception):
    """The bisection cannot start or cannot conclude (one sentence: exit 2)."""


@dataclass
class Tried:
    version: str
    outcome: str  # good | bad | other | error
    case_outcome: str | None
    message: str | None
    run_dir: str | None
    runner: str | None = None  # the name of the runner it made

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class Bisection:
    case: str  # suite/<base runner pattern>/step as given
    package: str
    base: str  # the base runner
    flags: list[str]  # the endpoint flags each run gets
    results: Path
    directory: Path = field(init=False)
    tried: dict[str, Tried] = field(default_factory=dict)
    symptom: str | None = None
    progress: Any = print

    def __post_init__(self) -> None:
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
        self.directory = self.results / f"{stamp}-bisect-{self.package.replace('/', '_').strip('@')}"

    def runner_name(self, version: str) -> str:
        return f"{self.base}@{self.package}=={version}"

    def attempt(self, version: str) -> Tried:
        """Run the case with `version` of the package (once per version)."""
        if version in self.tried:
            return self.tried[version]
        suite, _, step = self.case.split("/", 2)
        known = {name: runner.spec for name, runner in available_runners().items()}
        try:
            spec = versioned(self.runner_name(version), known)
        except RunnerEnvError as exc:
            self.tried[version] = Tried(version, "error", None, str(exc)[:300], None)
            return self.tried[version]
        runs = self.directory / "runs" / version
        argv = [sys.executable, "-m", "bench.cli", "run", *self.flags, "--runner", self.runner_name(version),
                "--case", f"{suite}/{spec.name}/{step}", "--results-dir", str(runs), "--no-report", "-q"]  # fmt: skip
        done = subprocess.run(argv, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False)
        record, run_dir = _case_of(runs, f"{suite}/{spec.name}/{step}")
        if record is None:
            said = (done.stderr.strip() or done.stdout.strip()).splitlines()[-1:] or [f"exit {done.returncode}"]
            tried = Tried(version, "error", None, said[0][:300], None)
        elif record.outcome == "pass":
            tried = Tried(version, "good", record.outcome, None, str(run_dir))
        else:
            words = record.error or record.note
            same = self.symptom is None or signature(record) == self.symptom
            tried = Tried(version, "bad" if same else "other", record.outcome, words, str(run_dir))
            if record.error and "environment" in record.error and "could not be built" in record.error:
                tried.outcome = "error"
            elif self.symptom is None:
                self.symptom = signature(record)
        tried.runner = spec.name
        self.tried[version] = tried
        self.progress(f"  {self.package} {version}: {tried.outcome}" + (f" ({tried.message})" if tried.message else ""))
        return tried

    def run(self, versions: list[str], good: str, bad: str) -> tuple[str, str]:
        """first bad, last good: both ends verified, then a binary search over the versions between them."""
        self.directory.mkdir(parents=True, exist_ok=True)
        end = self.attempt(bad)
        if end.outcome != "bad":
            raise BisectError(f"--bad {bad} does not fail: {self.case} is {end.case_outcome or end.outcome} with it")
        start = self.attempt(good)
        if start.outcome != "good":
            detail = f" ({start.message})" if start.message else ""
            raise BisectError(f"--good {good} does not pass: {start.case_outcome or start.outcome}{detail}")
        low, high = versions.index(good), versions.index(bad)  # versions[low] good, versions[high] bad
        candidates = versions[low : high + 1]
        while True:
            middle = [v for v in candidates[1:-1] if self.tried.get(v, Tried(v, "", None, None, None)).outcome not in
                      ("other", "error")]  # fmt: skip
            if not middle:
                return candidates[-1], candidates[0]
            probe = middle[len(middle) // 2]
            outcome = self.attempt(probe).outcome
            if outcome == "good":
                candidates = candidates[candidates.index(probe) :]
            elif outcome == "bad":
                candidates = candidates[: candidates.index(probe) + 1]

    def document(self, first_bad: str | None, last_good: str | None, error: str | None = None) -> dict[str, Any]:
        return {
            "schema": "e2b-bench/bisect/1",
            "case": self.case,
            "package": self.package,
            "base_runner": self.base,
            "endpoint_flags": self.flags,
            "symptom": self.symptom,
            "first_bad": first_bad,
            "last_good": last_good,
            "error": error,
            "tried": [t.as_dict() for t in sorted(self.tried.values(), key=lambda t: version_key(t.version))],
        }

    def write(self, document: dict[str, Any]) -> Path:
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / "bisect.json"
        atomic_write(path, json.dumps(document, indent=2) + "\n")
        return path


def _case_of(results: Path, case_id: str) -> tuple[CaseRecord | None, Path | None]:
    runs = sorted(p for p in results.iterdir() if p.is_dir()) if results.is_dir() else []
    for run_dir in reversed(runs):
        try:
            run = read_run(run_dir, allow_truncated=True)
        except Exception:  # a run that could not start writes no run.json: the caller says so
            continue
        found = next((case for case in run.cases if case.id == case_id), None)
        if found is not None:
            return found, run_dir
    return None, None


def base_runner(case: str) -> tuple[str, str]:
    """(base runner name, its language) of `suite/<runner pattern>/step`: the first runner the pattern matches."""
    parts = case.split("/")
    if len(parts) != 3:
        raise BisectError(f"--case {case}: give suite/runner/case, the runner part a name or a pattern")
    for name, runner in available_runners().items():
        if fnmatch.fnmatchcase(name, parts[1]) or base_name(name) == parts[1]:
            if not runner.has_suite(parts[0]):
                continue
            return name, runner.language
    raise BisectError(f"--case {case}: no runner with the {parts[0]} suite matches {parts[1]}")


def plan(versions: list[str], good: str | None, bad: str) -> tuple[list[str], str]:
    """The listed versions from good to bad (good defaults to the oldest release of bad's major line)."""
    if bad not in versions:
        versions = sorted({*versions, bad}, key=version_key)
    if good is None:
        major = bad.split(".")[0]
        good = next(v for v in versions if v.split(".")[0] == major)
    if good not in versions:
        raise BisectError(f"--good {good} is not a release the registry lists")
    if version_key(good) >= version_key(bad):
        raise BisectError(f"--good {good} is not older than --bad {bad}")
    return versions, good


def report_lines(document: dict[str, Any]) -> list[str]:
    """The verdict line, both ends' outcomes and a block to paste into an issue."""
    tried = {t["version"]: t for t in document["tried"]}
    suite, _, step = document["case"].split("/", 2)
    first_case = f"{suite}/{tried.get(document['first_bad'], {}).get('runner', '*')}/{step}"
    package, first, last = document["package"], document["first_bad"], document["last_good"]
    lines = [f"first bad {package} {first} (last good {last})"]
    for label, version in (("last good", last), ("first bad", first)):
        entry = tried.get(version) or {}
        said = f": {entry.get('message')}" if entry.get("message") else ""
        lines.append(f"  {label} {version}: {entry.get('case_outcome')}{said}")
    lines += [
        "",
        "paste into an issue:",
        "```",
        f"Regression in {package} {first}: {document['case']} (e2b-bench) fails from {package} {first} on;",
        f"it passes with {package} {last}, the release before.",
        f"symptom: {document['symptom']}",
        "versions tried (registry order): " + ", ".join(f"{t['version']} {t['outcome']}" for t in document["tried"]),
        f"endpoint flags: {' '.join(document['endpoint_flags']) or '(default)'}",
        "reproduce: "
        + shlex.join(
            [
                "e2b-bench",
                "run",
                *document["endpoint_flags"],
                "--runner",
                f"{document['base_runner']}@{package}=={first}",
                "--case",
                first_case,
            ]
        ),
        "```",
    ]
    return lines


def bisect(
    case: str, package: str, good: str | None, bad: str | None, flags: list[str], results: Path
) -> tuple[dict[str, Any], Path]:
    base, language = base_runner(case)
    pins = available_runners()[base].pins
    bad = bad or pins.get(package)
    if bad is None:
        raise BisectError(f"runner {base} does not pin {package}: give --bad")
    try:
        listed = released_versions(package, language)
    except RunnerEnvError as exc:
        raise BisectError(str(exc)) from None
    versions, good = plan(listed, good, bad)
    bisection = Bisection(case, package, base, flags, results)
    print(f"bisecting {case} over {package} {good} .. {bad} ({versions.index(bad) - versions.index(good) + 1} "
          f"releases), base runner {base}; runs under {bisection.directory}")  # fmt: skip
    try:
        first_bad, last_good = bisection.run(versions, good, bad)
    except (BisectError, RunnerEnvError) as exc:
        document = bisection.document(None, None, str(exc))
        path = bisection.write(document)
        raise BisectError(f"{exc} (what was tried: {path})") from None
    document = bisection.document(first_bad, last_good)
    return document, bisection.write(document)
