"""`./e2b-bench selftest --slow`: CI's selection plus the slow-marked tests, seen by collecting (nothing runs); and
the checkout's modules the self-tests' processes import, compiled before they start."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
from pathlib import Path

from run_cli import REPO

# Modules holding tests of each kind: slow, benchmarks, and neither.
MODULES = ("tests/test_remote_conditions.py", "tests/test_bench.py")
# A plugin that writes down every collected test with its markers, and whether the selection kept it.
SEEN_PLUGIN = """
import json, os
import pytest

seen = {}

@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):
    seen["all"] = {item.nodeid: sorted(mark.name for mark in item.iter_markers()) for item in items}

def pytest_collection_finish(session):
    seen["kept"] = [item.nodeid for item in session.items]
    with open(os.environ["SEEN_TO"], "w") as out:
        json.dump(seen, out)
"""


def selftest(tmp_path: Path, *args: str, **environ: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "seen_plugin.py").write_text(SEEN_PLUGIN)
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "SEEN_TO": str(tmp_path / "seen.json"), **environ}
    return subprocess.run(
        [str(REPO / "e2b-bench"), "selftest", "--collect-only", "-q", "-p", "seen_plugin", *args, *MODULES],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def test_slow_selects_cis_tests_and_the_slow_ones_but_no_benchmark(tmp_path: Path) -> None:
    done = selftest(tmp_path, "--slow")
    seen = json.loads((tmp_path / "seen.json").read_text())
    every, kept = seen["all"], set(seen["kept"])
    slow = {test for test, marks in every.items() if "slow" in marks and "bench" not in marks}
    benchmarks = {test for test, marks in every.items() if "bench" in marks}

    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert slow and benchmarks and set(every) - slow - benchmarks  # each kind is there to be told apart
    assert kept == set(every) - benchmarks


def test_slow_with_a_marker_expression_of_its_own_is_refused_in_one_sentence(tmp_path: Path) -> None:
    done = selftest(tmp_path, "--slow", "-m", "slow")

    assert done.returncode == 4  # pytest's usage error, before anything is collected
    assert "ERROR: --slow is a selection of its own (-m 'not bench'): give it or -m, not both" in done.stderr
    assert not (tmp_path / "seen.json").exists()


def test_selftest_compiles_the_checkouts_modules_that_no_process_would_keep(tmp_path: Path) -> None:
    # under PYTHONDONTWRITEBYTECODE no process writes what it compiles: each run, runner and test compiled these again
    sources = [
        REPO / "bench" / "exits.py",
        REPO / "sandboxes" / "e2b" / "python" / "driver.py",
        REPO / "tests" / "loopback.py",
    ]
    compiled = [Path(importlib.util.cache_from_source(str(source))) for source in sources]
    for path in compiled:
        path.unlink(missing_ok=True)

    done = selftest(tmp_path, PYTHONDONTWRITEBYTECODE="1")

    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert [path.is_file() for path in compiled] == [True, True, True]
    assert all(path.stat().st_mtime >= source.stat().st_mtime for path, source in zip(compiled, sources, strict=True))


# Records the options a selftest ends up with, then stops before anything is collected or any worker starts.
OPTIONS_PLUGIN = """
import json, os
import pytest

@pytest.hookimpl(trylast=True)
def pytest_configure(config):
    with open(os.environ["OPTIONS_TO"], "w") as out:
        json.dump({"n": config.option.numprocesses, "m": config.option.markexpr, "timeout": config.option.timeout,
                   "dist": config.option.dist}, out)
    pytest.exit("options recorded", returncode=0)
"""


def selftest_options(tmp_path: Path, *args: str) -> dict[str, object]:
    (tmp_path / "options_plugin.py").write_text(OPTIONS_PLUGIN)
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "OPTIONS_TO": str(tmp_path / "options.json")}
    done = subprocess.run(
        [str(REPO / "e2b-bench"), "selftest", "-p", "options_plugin", *args],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return json.loads((tmp_path / "options.json").read_text())


def test_selftest_alone_runs_what_ci_runs_on_two_workers_per_core_and_a_path_runs_as_given(tmp_path: Path) -> None:
    workers = min(2 * (os.cpu_count() or 1), 8)

    assert selftest_options(tmp_path) == {
        "n": workers,
        "m": "not slow and not bench",
        "timeout": 900.0,
        "dist": "loadgroup",
    }
    assert selftest_options(tmp_path, "-n", "1")["n"] == 1
    assert selftest_options(tmp_path, "--slow")["m"] == "not bench"
    # a file runs as given: serially, every test of it, no timeout added
    assert selftest_options(tmp_path, "tests/test_bench.py") == {
        "n": None,
        "m": "",
        "timeout": None,
        "dist": "loadgroup",
    }
