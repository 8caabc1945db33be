"""`e2b-bench range --package NAME [--from V] [suites…]`: the endpoint's compatibility with every release of a package
(the newest patch of each minor release by default), as the validated SDK range an endpoint publishes.

Each release is one `run --runner BASE@NAME==V` of the suites (or `--case` patterns) with the endpoint flags given,
under `<results>/<stamp>-range-<name>/runs/<version>/`. Per release: the cases, how many are not conformant and the
causes (bench/triage/causes.find_causes, keyed by signature); per cause: the first and last release it affects.
`range.json` holds both, `range.md` the table to publish.
"""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.results import atomic_write, read_run
from bench.runners.catalog import available_runners
from bench.runners.envs import RunnerEnvError
from bench.runners.versioned import released_versions, version_key, versioned
from bench.triage.causes import find_causes, signature

from .bisect import BisectError

RUN_TIMEOUT_S = 3600


def base_for(package: str, runner: str | None) -> str:
    """The runner whose pin of `package` is varied: `--runner`, else the first that pins it (naming it first)."""
    runners = available_runners()
    if runner is not None:
        if runner not in runners or package not in runners[runner].pins:
            raise BisectError(f"--runner {runner} is no runner that pins {package}")
        return runner
    pinning = [r for r in runners.values() if package in r.pins]
    naming = [r for r in pinning if next(iter(r.pins)) == package]
    if not (naming or pinning):
        raise BisectError(f"no runner pins {package} (see `e2b-bench runners`)")
    return (naming or pinning)[0].name


def minor_releases(versions: list[str], start: str | None, end: str, every: bool) -> list[str]:
    """The releases from `start` to `end`: all of them with `every`, else the newest patch of each minor."""
    chosen = [v for v in versions if version_key(v) <= version_key(end)]
    if start is not None:
        chosen = [v for v in chosen if version_key(v) >= version_key(start)]
    if every:
        return chosen
    newest: dict[tuple[int, ...], str] = {}
    for version in chosen:
        newest[version_key(version)[:2]] = version
    return sorted(newest.values(), key=version_key)


def release_row(version: str, runs: Path, runner: str) -> dict[str, Any]:
    """One release's verdict from its run directory."""
    dirs = sorted(p for p in runs.iterdir() if p.is_dir()) if runs.is_dir() else []
    if not dirs:
        return {"version": version, "runner": runner, "status": "error", "cases": 0, "failing": 0, "causes": []}
    run = read_run(dirs[-1], allow_truncated=True)
    cases = [case for case in run.cases if case.runner == runner]
    failing = [case for case in cases if not case.conformant]
    causes = find_causes(failing)
    unusable = len(failing) == len(cases) > 0 and all(_not_run(case.error or "") for case in failing)
    return {
        "version": version,
        "runner": runner,
        "run_dir": str(run.path),
        "status": "pass" if not failing else ("error" if unusable else "fail"),
        "cases": len(cases),
        "failing": len(failing),
        "causes": [
            {"signature": signature(c.representative), "cases": len(c.cases), "example": c.representative.id}
            for c in causes
        ],
    }


def _not_run(error: str) -> bool:
    """A case the release never got to judge: its environment could not be built, or it did not run."""
    return error.startswith("not run") or "could not be built" in error


def compatibility(
    package: str,
    start: str | None,
    runner: str | None,
    targets: list[str],
    flags: list[str],
    results: Path,
    every: bool = False,
    last: str | None = None,
    progress: Any = print,
) -> tuple[dict[str, Any], Path]:
    base = base_for(package, runner)
    spec = available_runners()[base]
    end = last or spec.pins[package]
    try:
        listed = released_versions(package, spec.language)
    except RunnerEnvError as exc:
        raise BisectError(str(exc)) from None
    versions = minor_releases(sorted({*listed, end}, key=version_key), start, end, every)
    if not versions:
        raise BisectError(f"no release of {package} from {start} to {end}")
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    directory = results / f"{stamp}-range-{package.replace('/', '_').strip('@')}"
    progress(f"{package}: {len(versions)} release(s) {versions[0]} .. {versions[-1]} with base runner {base}; "
             f"runs under {directory}")  # fmt: skip
    known = {name: r.spec for name, r in available_runners().items()}
    rows = []
    for version in versions:
        name = f"{base}@{package}=={version}"
        try:
            made = versioned(name, known).name
        except RunnerEnvError as exc:
            rows.append({"version": version, "status": "error", "cases": 0, "failing": 0, "causes": [],
                         "error": str(exc)[:300]})  # fmt: skip
            continue
        runs = directory / "runs" / version
        argv = [sys.executable, "-m", "bench.cli", "run", *flags, "--runner", name, "--results-dir", str(runs),
                "--no-report", "-q", *targets]  # fmt: skip
        subprocess.run(argv, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False)
        row = release_row(version, runs, made)
        rows.append(row)
        progress(f"  {package} {version}: {row['status']}, {row['failing']} of {row['cases']} case(s) not conformant")
    document = {
        "schema": "e2b-bench/range/1",
        "package": package,
        "base_runner": base,
        "endpoint_flags": flags,
        "targets": targets,
        "releases": rows,
        "causes": cause_spans(rows),
    }
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "range.json"
    atomic_write(path, json.dumps(document, indent=2) + "\n")
    atomic_write(directory / "range.md", "\n".join(markdown(document)) + "\n")
    return document, path


def cause_spans(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each cause's first and last release (in the order tried) and how many releases it affects."""
    spans: dict[str, dict[str, Any]] = {}
    for row in rows:
        for cause in row["causes"]:
            span = spans.setdefault(cause["signature"], {"signature": cause["signature"], "first": row["version"],
                                                         "releases": 0, "example": cause["example"]})  # fmt: skip
            span["last"] = row["version"]
            span["releases"] += 1
    return list(spans.values())


def markdown(document: dict[str, Any]) -> list[str]:
    """The table an endpoint publishes as its validated range, then each cause's span."""
    package = document["package"]
    passing = [row["version"] for row in document["releases"] if row["status"] == "pass"]
    lines = [
        f"## Validated {package} releases",
        "",
        f"Compatible: {', '.join(passing) if passing else 'none of the releases tried'}.",
        "",
        "| release | verdict | cases | not conformant |",
        "|---|---|---|---|",
        *(f"| {r['version']} | {r['status']} | {r['cases']} | {r['failing']} |" for r in document["releases"]),
    ]
    if document["causes"]:
        lines += ["", "| cause | first release | last release | releases |", "|---|---|---|---|"]
        for span in document["causes"]:
            words = str(span["signature"]).replace("|", "\\|")[:160]
            lines.append(f"| {words} | {span['first']} | {span['last']} | {span['releases']} |")
    return lines
