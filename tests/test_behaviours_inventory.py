"""The behaviour inventory (sandboxes/e2b/behaviours.toml) and the step manifest agree: every case an entry
names exists, every case of the behaviours suites is named by an entry, and every entry is checked or says
why not. The Python and npm suites check the same behaviours, and every Python body runs in both flavours.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from bench.runners.manifest import MANIFEST_PATH, load_manifest

INVENTORY = MANIFEST_PATH.parent / "behaviours.toml"
NEW_SUITES = ("behaviours", "properties")
SOURCE_KINDS = ("python", "npm", "openapi", "envd")


def inventory() -> list[dict]:
    with INVENTORY.open("rb") as handle:
        return tomllib.load(handle)["behaviour"]


def manifest_cases() -> dict[str, set[str]]:
    """`suite/step` ids by suite, over every language table."""
    cases: dict[str, set[str]] = {}
    for suite, tables in load_manifest([MANIFEST_PATH]).items():
        for table in tables.values():
            for step in table.get("steps", ()):
                cases.setdefault(suite, set()).add(f"{suite}/{step['id']}")
    return cases


def test_every_named_case_exists_in_the_manifest() -> None:
    known = set().union(*manifest_cases().values())
    named = {case for entry in inventory() for case in entry["cases"]}

    assert sorted(named - known) == []


def test_every_case_of_the_behaviours_suites_is_named_by_a_behaviour() -> None:
    cases = manifest_cases()
    named = {case for entry in inventory() for case in entry["cases"]}

    assert sorted(set().union(*(cases[suite] for suite in NEW_SUITES)) - named) == []


def test_every_entry_is_checked_or_says_why_not() -> None:
    entries = inventory()
    ids = [entry["id"] for entry in entries]

    assert len(ids) == len(set(ids))
    assert [e["id"] for e in entries if not e["cases"] and not e.get("gap")] == []
    assert [e["id"] for e in entries if e["cases"] and e.get("gap")] == []
    for entry in entries:
        assert entry["text"].strip() and entry["sources"], entry["id"]
        assert {s.split(":")[0] for s in entry["sources"]} <= set(SOURCE_KINDS), entry["id"]


def _steps(language: str) -> list[str]:
    return [step["id"] for step in load_manifest([MANIFEST_PATH])["behaviours"][language]["steps"]]


def test_each_python_behaviour_runs_under_both_clients_and_in_npm() -> None:
    python = _steps("python")
    sync = {s.removeprefix("sync_") for s in python if s.startswith("sync_")}
    asynchronous = {s.removeprefix("async_") for s in python if s.startswith("async_")}
    npm = {s.removeprefix("js_") for s in _steps("ts")}

    assert len(python) == len(sync) + len(asynchronous)
    assert sync == asynchronous
    # The npm SDK has no commands.stream_input, and the REST statuses and options and envd's raw selectors are the
    # same whatever the language: every other behaviour is checked in both languages.
    assert sync - npm == {"stream_input", "rest_statuses", "rest_options", "process_selectors"}
    assert npm <= sync


@pytest.mark.parametrize(
    ("script", "pattern", "prefixes"),
    [
        ("python/behaviours.py", r'@behaviour\("([a-z0-9_]+)"\)', ("sync_", "async_")),
        ("ts/behaviours.mjs", r"^behaviour\('([a-z0-9_]+)'", ("js_",)),
    ],
)
def test_every_step_of_a_runner_script_is_in_the_manifest_and_back(
    script: str, pattern: str, prefixes: tuple[str, ...]
) -> None:
    source = (Path(MANIFEST_PATH.parent) / script).read_text()
    bodies = re.findall(pattern, source, re.MULTILINE)
    language = "python" if script.startswith("python") else "ts"

    assert len(bodies) == len(set(bodies))
    assert sorted(f"{prefix}{body}" for prefix in prefixes for body in bodies) == sorted(_steps(language))
