"""Where the harness's data lives: the one module that knows the layout on disk.

From a checkout (an editable install) the data is the repository itself; from a wheel it is the copy
under `bench/_data/` (the same tree: `sandboxes/`, `frameworks/`, `reports/templates/`,
`expectations/`). Runner entry scripts, projects and manifests are named relative to `DATA_ROOT`.
What a user writes (results, reports, `endpoints.toml`) goes to the checkout, or to the working
directory when installed.
"""

from __future__ import annotations

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
MANIFEST_PATHS = (
    SANDBOXES_DIR / "e2b" / "manifest.toml",
    FRAMEWORKS_DIR / "manifest.toml",
    SANDBOXES_DIR / "code-interpreter" / "manifest.toml",
    SANDBOXES_DIR / "upstream" / "manifest.toml",
)
TEMPLATES_DIR = DATA_ROOT / "reports" / "templates"
EXPECTATIONS_DIR = DATA_ROOT / "expectations"
# E2B's SDK sources with their own tests (the upstream suite's default tree): the reference copy beside a checkout.
UPSTREAM_SOURCE = _CHECKOUT.parent / "shared" / "reference" / "e2b-sdk-source"
PYTEST_INI = DATA_ROOT / "pyproject.toml" if FROM_CHECKOUT else PACKAGE_DIR / "pytest.ini"

RESULTS_DIR = USER_ROOT / "results"
REPORTS_OUT = USER_ROOT / "reports" / "out"
CONFIG_PATH = USER_ROOT / "endpoints.toml"
