"""What a CLI start and a write-up load: every `e2b-bench` command pays for its imports, and self-tests and CI
jobs start hundreds of them. Observed through `sys.modules` in a fresh interpreter, never timed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.run_cli import REPO

# Heavy libraries no part of the CLI needs just to start, or to write a run up.
HEAVY = ("pandas", "numpy")  # the report imports pandas where it builds its matrix, not at import


def loaded_after(code: str, watched: tuple[str, ...]) -> list[str]:
    """Which of the `watched` modules a fresh interpreter (the checkout's `bench`) has loaded after `code`."""
    script = f"{code}\nimport json, sys\nprint(json.dumps([m for m in {watched!r} if m in sys.modules]))"
    # PYTEST_ADDOPTS (a self-test session's own, say --durations) is a run's pytest options too: not this one's
    env = {name: value for name, value in os.environ.items() if name != "PYTEST_ADDOPTS"}
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return list(json.loads(done.stdout.strip().splitlines()[-1]))


def test_importing_the_cli_and_building_its_parser_loads_no_heavy_library() -> None:
    assert loaded_after("import bench.cli\nbench.cli.build_parser()", HEAVY) == []


def test_building_the_cli_parser_loads_neither_the_load_run_nor_the_embedded_endpoint() -> None:
    # a run against another endpoint, a report or a merge never serves sandboxes: the `load` options are parsed
    # without importing the load run (its soak census holds the embedded endpoint's sandbox code)
    watched = ("bench.load", "bench.localbox.box", "bench.localbox.server")
    assert loaded_after("import bench.cli\nbench.cli.build_parser()", watched) == []


@pytest.mark.parametrize("module", ["bench.report", "bench.compare", "bench.lifecycle", "bench.shards"])
def test_the_write_up_modules_load_no_heavy_library(module: str) -> None:
    assert loaded_after(f"import {module}", HEAVY) == []


# Installed pytest plugins (entry points) of this environment a run has no use for.
OTHER_PLUGINS = ("anyio.pytest_plugin", "xdist.plugin", "pytest_timeout", "_hypothesis_pytestplugin")


def test_a_run_loads_neither_pandas_nor_the_environments_pytest_plugins(tmp_path: Path) -> None:
    # A selection that matches no case: pytest starts with the run's plugins, collects the suite, exits 5.
    run = ["run", "quickstart", "-k", "no_case_has_this_name", "--results-dir", str(tmp_path)]
    code = f"import bench.cli\nassert bench.cli.main({run!r}) == 5"
    watched = ("pandas", *OTHER_PLUGINS, "bench.plugin")
    assert loaded_after(code, watched) == ["bench.plugin"]  # the run's own plugin: pytest did start


def test_a_run_given_another_plugins_option_loads_the_environments_plugins(tmp_path: Path) -> None:
    # `--timeout` is pytest-timeout's: passed on to pytest, it is understood (not a usage error, exit 4)
    run = ["run", "quickstart", "-k", "no_case_has_this_name", "--timeout=600", "--results-dir", str(tmp_path)]
    code = f"import bench.cli\nassert bench.cli.main({run!r}) == 5"
    assert loaded_after(code, ("pytest_timeout", "xdist.plugin")) == ["pytest_timeout", "xdist.plugin"]


def test_a_run_with_no_framework_case_imports_no_model(tmp_path: Path) -> None:
    # the default runners include every framework: the scripted model is served only for a framework case
    run = ["run", "quickstart", "--case", "quickstart/py-e2b-2.63.0/py02_run_echo", "--no-report", "-q"]
    code = f"import bench.cli\nassert bench.cli.main({[*run, '--results-dir', str(tmp_path)]!r}) == 0"
    assert loaded_after(code, ("bench.model", "bench.conformance")) == ["bench.conformance"]


def test_the_embedded_endpoint_loads_the_envd_stubs_without_the_sdk_client() -> None:
    # every run, serve and bench process serves envd from the stubs alone (bench/localbox/stubs.py)
    watched = ("e2b.envd.process.process_connect", "e2b.sandbox_sync.main", "e2b.sandbox_async.main")
    assert loaded_after("import bench.localbox.server", watched) == ["e2b.envd.process.process_connect"]


def test_the_sdk_client_imported_after_the_endpoint_is_whole_and_shares_its_stubs() -> None:
    code = (
        "import bench.localbox.server\n"
        "from bench.localbox import envd\n"
        "import e2b\n"
        "from e2b import AsyncSandbox, Sandbox\n"
        "from e2b.envd.process import process_pb\n"
        "assert e2b.Sandbox is Sandbox and Sandbox.__module__ == 'e2b.sandbox_sync.main'\n"
        "assert envd.pb is process_pb and 'Sandbox' in e2b.__all__\n"
        "try:\n    e2b.no_such_name\nexcept AttributeError:\n    pass\nelse:\n    raise SystemExit('no error')\n"
    )
    assert loaded_after(code, ("e2b.sandbox_sync.main", "e2b.sandbox_async.main")) == [
        "e2b.sandbox_sync.main",
        "e2b.sandbox_async.main",
    ]
