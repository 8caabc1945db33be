"""The step manifests: one format, one table per suite and runner family.

`sandboxes/e2b/manifest.toml` holds the SDK suites, `frameworks/manifest.toml` the framework suite,
`sandboxes/code-interpreter/manifest.toml` the code-interpreter suite, `sandboxes/upstream/manifest.toml` E2B's
own tests; a suite lives in exactly one of them. A table with `steps_from` has no steps of its own: they are
the tests of a source tree (`upstream-python`, `upstream-js`: bench/upstream/source.py), listed when asked for.
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from bench.paths import MANIFEST_PATHS

MANIFEST_PATH, FRAMEWORKS_MANIFEST_PATH = MANIFEST_PATHS[:2]


class ManifestError(Exception):
    """The step manifest is malformed or does not know the requested suite or step."""


@dataclass(frozen=True)
class Step:
    id: str
    title: str
    depends: tuple[str, ...]
    slow: bool = False  # waits on purpose (e.g. a 60 s expiry): pytest marker `slow`
    expect_s: float | None = None  # how long the step takes on a quiet host when it is longer than most


def load_manifest(paths: Iterable[Path] = MANIFEST_PATHS) -> dict[str, Any]:
    """Every suite of the manifests, `{suite: {table: {...}}}`; a suite defined twice is an error.
    Each set of manifests is read once per process (treat the result as read-only)."""
    return _read(tuple(paths))


@cache
def _read(paths: tuple[Path, ...]) -> dict[str, Any]:
    suites: dict[str, Any] = {}
    for path in paths:
        if not path.is_file():
            continue
        with path.open("rb") as handle:
            manifest = tomllib.load(handle)
        for suite, tables in manifest.items():
            if suite in suites:
                raise ManifestError(f"suite {suite!r} is defined in more than one manifest ({path})")
            suites[suite] = tables
    return suites


def load_steps(suite: str, language: str, path: Path | None = None) -> list[Step]:
    """Steps of one suite for one language (or runner family), in run order."""
    manifest = load_manifest([path] if path is not None else MANIFEST_PATHS)
    try:
        table = manifest[suite][language]
    except KeyError:
        where = path or " or ".join(str(p) for p in MANIFEST_PATHS)
        raise ManifestError(f"{where} has no [{suite}.{language}] table") from None
    if "steps_from" in table:
        return source_steps(suite, language, table["steps_from"])
    steps = [
        Step(
            id=raw["id"],
            title=raw["title"],
            depends=tuple(raw.get("depends", ())),
            slow=bool(raw.get("slow")),
            expect_s=_seconds(raw, suite, language),
        )
        for raw in table.get("steps", ())
    ]
    known: set[str] = set()
    for step in steps:
        unknown = [dep for dep in step.depends if dep not in known]
        if unknown:
            raise ManifestError(f"step {step.id} depends on {unknown}, which do not come before it")
        known.add(step.id)
    return steps


def source_steps(suite: str, language: str, source: str) -> list[Step]:
    """The steps a source tree gives a `steps_from` table: one per upstream test, none depending on another."""
    from bench.upstream.source import SourceError, js_sdk, js_tests, python_sdk, python_tests

    listings = {"upstream-python": lambda: python_tests(python_sdk()), "upstream-js": lambda: js_tests(js_sdk())}
    if source not in listings:
        raise ManifestError(f"[{suite}.{language}]: unknown steps_from {source!r} (known: {', '.join(listings)})")
    try:
        return [Step(id=test, title=test, depends=()) for test in listings[source]()]
    except SourceError as exc:
        raise ManifestError(str(exc)) from None


def _seconds(raw: dict[str, Any], suite: str, language: str) -> float | None:
    value = raw.get("expect_s")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise ManifestError(f"[{suite}.{language}] step {raw.get('id')}: expect_s must be a positive number of seconds")
    return float(value)


def with_dependencies(steps: list[Step], requested: Iterable[str]) -> list[str]:
    """The requested step ids plus everything they depend on, in manifest order."""
    by_id = {step.id: step for step in steps}
    needed: set[str] = set()
    pending = list(requested)
    while pending:
        step_id = pending.pop()
        if step_id not in by_id:
            raise ManifestError(f"unknown step {step_id}")
        if step_id not in needed:
            needed.add(step_id)
            pending.extend(by_id[step_id].depends)
    return [step.id for step in steps if step.id in needed]


def task_steps(steps: list[Step], requested: Iterable[str]) -> dict[str, Any]:
    """A task's `steps` (the requested ones and their prerequisites, in manifest order) and `depends`."""
    ids = with_dependencies(steps, requested)
    return {"steps": ids, "depends": {step.id: list(step.depends) for step in steps if step.id in ids}}
