"""Where the harness's data lives: the one module that knows the layout on disk.

From a checkout (an editable install) the data is the repository itself; from a wheel it is the copy
under `bench/_data/` (the same tree: `sandboxes/`, `frameworks/`, `reports/templates/`,
`expectations/`). Runner entry scripts, projects and manifests are named relative to `DATA_ROOT`.
What a user writes (results, reports, `endpoints.toml`) goes to the checkout, or to the working
directory when installed.
"""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
_CHECKOUT = PACKAGE_DIR.parent
# A checkout has the suites beside the package; an installed wheel carries them as package data.
FROM_CHECKOUT = (_CHECKOUT / "sandboxes" / "e2b" / "manifest.toml").is_file()
DATA_ROOT = _CHECKOUT if FROM_CHECKOUT else PACKAGE_DIR / "_data"
USER_ROOT = _CHECKOUT if FROM_CHECKOUT else Path.cwd()

SANDBOXES_DIR = DATA_ROOT / "sandboxes"
FRAMEWORKS_DIR = DATA_ROOT / "frameworks"
SUITE_DIRS = (SANDBOXES_DIR, FRAMEWORKS_DIR)  # where suite modules (`test_<suite>.py`) live
# the differential judgement's data (bench/differential/): the reference traces and the field-policy table
REFERENCE_TRACES_DIR = SANDBOXES_DIR / "e2b" / "reference"
FIELD_POLICY_PATH = SANDBOXES_DIR / "e2b" / "differential.toml"
MANIFEST_PATHS = (
    SANDBOXES_DIR / "e2b" / "manifest.toml",
    FRAMEWORKS_DIR / "manifest.toml",
    SANDBOXES_DIR / "code-interpreter" / "manifest.toml",
    SANDBOXES_DIR / "upstream" / "manifest.toml",
)
TEMPLATES_DIR = DATA_ROOT / "reports" / "templates"
EXPECTATIONS_DIR = DATA_ROOT / "expectations"


def _reference_dir() -> Path:
    """The reference folder (E2B's published definitions in `spec/`, its SDK sources in `e2b-sdk-source/`):
    `$E2B_BENCH_REFERENCE`, else `../shared/reference` beside the checkout, else beside the repository a local
    clone was made from (a CI clone elsewhere); the first place when none holds it."""
    configured = os.environ.get("E2B_BENCH_REFERENCE")
    if configured:
        return Path(configured).expanduser().resolve()
    beside = _CHECKOUT.parent / "shared" / "reference"
    places = [beside]
    with contextlib.suppress(OSError):
        origin = re.search(r'\[remote "origin"\][^\[]*?\burl\s*=\s*(\S+)', (_CHECKOUT / ".git" / "config").read_text())
        if origin and origin.group(1).startswith(("/", "file://")):
            places.append(Path(origin.group(1).removeprefix("file://")).parent / "shared" / "reference")
    return next((place for place in places if place.is_dir()), beside)


REFERENCE_DIR = _reference_dir()
SPEC_DIR = REFERENCE_DIR / "spec"  # E2B's OpenAPI files, envd.yaml and protos (the field table's definitions)
# E2B's SDK sources with their own tests (the upstream suite's default tree).
UPSTREAM_SOURCE = REFERENCE_DIR / "e2b-sdk-source"
PYTEST_INI = DATA_ROOT / "pyproject.toml" if FROM_CHECKOUT else PACKAGE_DIR / "pytest.ini"

# Every output of the harness goes under results/ (E2B_BENCH_RESULTS_DIR elsewhere, e.g. a CI workspace).
RESULTS_DIR = Path(os.environ.get("E2B_BENCH_RESULTS_DIR") or USER_ROOT / "results").expanduser().resolve()
REPORTS_OUT = RESULTS_DIR / "reports"  # `report`'s default --out
CONFIG_PATH = Path(os.environ.get("E2B_BENCH_ENDPOINTS") or USER_ROOT / "endpoints.toml").expanduser()

# The suites whose cases have references by default: the SDKs' own calls, whose answers hold what a client sees.
# The others' exchanges carry what the case itself varies (pids in listings, a sandbox's stalled output, a model's
# tool calls, kernel timing): a reference of theirs needs field rules of its own before it can judge without noise.
REFERENCED_SUITES = ("quickstart", "behaviours", "probes", "refusals")
