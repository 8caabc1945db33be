"""Runners as data: every folder under sandboxes/ and frameworks/ holding a `runner.toml` is a runner
(or, with a list of `pins`, one runner per pin set), as a conformance harness discovers its implementations.

runner.toml: `language` (python | js), `entry` (the default entry script, relative to the folder; the
manifest's suite tables may name others), `prefix` (the runner is `<prefix>-<version of the first pin>`),
and either `pins` (a table, or a list of tables: exact versions installed as given) or `project = true`
with `pinned` (the folder is the pinned environment: requirements.txt or package.json + lock; the
versions of the `pinned` packages are read from it). A framework adds `family` (its manifest table).
`name` names a runner whose first pin says nothing of what it runs; `source = "python-sdk"` also installs
the python-sdk of E2B's source tree (bench/upstream/source.py) into its environment.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any

from bench.paths import DATA_ROOT, SUITE_DIRS
from bench.runners.envs import RunnerEnvError, RunnerSpec
from bench.runners.frameworks import lock_pins

RUNNER_TOML = "runner.toml"
LANGUAGES = ("python", "js")


@cache
def discover() -> tuple[RunnerSpec, ...]:
    """Every runner, SDK runners first (newest pin first per language), then the frameworks."""
    found = [spec for root in SUITE_DIRS for path in sorted(root.rglob(RUNNER_TOML)) for spec in specs_of(path)]
    names = [spec.name for spec in found]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise RunnerEnvError(f"runner {twice[0]} is defined twice (runner.toml files under {DATA_ROOT})")
    return tuple(sorted(found, key=_order))


def specs_of(path: Path, root: Path = DATA_ROOT) -> list[RunnerSpec]:
    """The runners one runner.toml defines (entry and project named relative to `root`)."""
    with path.open("rb") as handle:
        data: dict[str, Any] = tomllib.load(handle)
    folder = path.parent
    if data.get("language") not in LANGUAGES:
        raise RunnerEnvError(f"{path}: language must be one of {', '.join(LANGUAGES)}")
    entry = Path(os.path.normpath(folder / str(data["entry"]))).relative_to(root).as_posix()
    project = folder.relative_to(root).as_posix() if data.get("project") else None
    if project is not None:
        pin_sets: list[Mapping[str, str]] = [lock_pins(folder, tuple(data["pinned"]))]
    else:
        pins = data["pins"]
        pin_sets = list(pins) if isinstance(pins, list) else [pins]
    return [
        RunnerSpec(
            name=str(data.get("name") or f"{data['prefix']}-{next(iter(pins.values()))}"),
            language=str(data["language"]),
            pins=dict(pins),
            entry=entry,
            family=data.get("family"),
            project=project,
            source=data.get("source"),
        )
        for pins in pin_sets
    ]


def version_key(spec: RunnerSpec) -> tuple[int, ...]:
    """The runner's version (what names it) as numbers, for `newest first`."""
    version = spec.name.rsplit("-", 1)[1]
    return tuple(int(part) if part.isdigit() else 0 for part in version.split("."))


def _order(spec: RunnerSpec) -> tuple[Any, ...]:
    return (spec.family is not None, LANGUAGES.index(spec.language), spec.family or "", [-n for n in version_key(spec)])
