"""`./e2b-bench selftest -n N`: tests sharing a module's fixture, or one shared result (tests/shared_runs.py),
run on one worker, which sets it up once; the other tests are still spread over the workers."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

TESTS = Path(__file__).resolve().parent
SHARED_TESTS = 6
LONE_TESTS = 12
MODULE = textwrap.dedent(f"""
    import os
    import time

    import pytest


    def note(what):
        with open(os.environ["SETUPS"], "a") as log:
            log.write(f"{{what}} {{os.environ['PYTEST_XDIST_WORKER']}}\\n")


    @pytest.fixture(scope="module")
    def shared():
        note("setup")


    @pytest.mark.parametrize("n", range({SHARED_TESTS}))
    def test_shared(shared, n):
        note("shared")


    @pytest.mark.parametrize("n", range({LONE_TESTS}))
    def test_lone(tmp_path, n):
        time.sleep(0.2)  # long enough that both workers take some
        note("lone")
""")


def run_on_two_workers(
    tmp_path: Path, module: str, plugins: tuple[str, ...], kinds: tuple[str, ...]
) -> dict[str, list[str]]:
    """Run `module` on two pytest-xdist workers with `plugins` (tests/); which worker noted each of `kinds`."""
    (tmp_path / "test_module.py").write_text(module)
    setups = tmp_path / "setups.log"
    loaded = [arg for plugin in (*plugins, "no:cacheprovider") for arg in ("-p", plugin)]
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", "2", "--dist", "loadgroup", *loaded,
         "--rootdir", str(tmp_path), "-c", os.devnull, str(tmp_path)],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(TESTS), "SETUPS": str(setups)},
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip

    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    lines = [line.split() for line in setups.read_text().splitlines()]
    return {kind: [w for k, w in lines if k == kind] for kind in kinds}


def test_tests_sharing_a_module_fixture_share_one_worker_and_the_rest_are_spread(tmp_path: Path) -> None:
    workers = run_on_two_workers(tmp_path, MODULE, ("worker_groups",), ("setup", "shared", "lone"))
    assert len(workers["setup"]) == 1
    assert workers["shared"] == workers["setup"] * SHARED_TESTS
    assert len(workers["lone"]) == LONE_TESTS and set(workers["lone"]) == {"gw0", "gw1"}


READERS = 4
READERS_MODULE = textwrap.dedent(f"""
    import os
    import time

    import pytest
    from shared_runs import shares


    def note(what):
        with open(os.environ["SETUPS"], "a") as log:
            log.write(f"{{what}} {{os.environ['PYTEST_XDIST_WORKER']}}\\n")


    def make(directory):
        note("made")
        (directory / "result").write_text("made once")
        return directory / "result"


    @shares("one result")
    @pytest.mark.parametrize("n", range({READERS}))
    def test_reader(shared, n):
        assert shared.once("one result", make).read_text() == "made once"
        note("read")


    @pytest.mark.parametrize("n", range({LONE_TESTS}))
    def test_lone(n):
        time.sleep(0.2)
        note("lone")
""")


def test_tests_reading_one_shared_result_share_one_worker_which_makes_it_once(tmp_path: Path) -> None:
    workers = run_on_two_workers(tmp_path, READERS_MODULE, ("worker_groups", "shared_runs"), ("made", "read", "lone"))
    assert len(workers["made"]) == 1
    assert workers["read"] == workers["made"] * READERS
    assert len(workers["lone"]) == LONE_TESTS and set(workers["lone"]) == {"gw0", "gw1"}


UNGROUPED_MODULE = textwrap.dedent(f"""
    import os
    import time

    import pytest


    def note(what):
        with open(os.environ["SETUPS"], "a") as log:
            log.write(f"{{what}} {{os.environ['PYTEST_XDIST_WORKER']}}\\n")


    def make(directory):
        note("made")
        time.sleep(0.5)  # the other worker asks while it is being made
        (directory / "result").write_text("made once")
        return directory / "result"


    @pytest.mark.parametrize("n", range({LONE_TESTS}))
    def test_reader(shared, n):
        assert shared.once("one result", make).read_text() == "made once"
        time.sleep(0.2)  # long enough that both workers take some
        note("read")
""")


def test_a_shared_result_asked_for_on_two_workers_is_made_once_and_read_by_both(tmp_path: Path) -> None:
    workers = run_on_two_workers(tmp_path, UNGROUPED_MODULE, ("shared_runs",), ("made", "read"))
    assert len(workers["made"]) == 1
    assert len(workers["read"]) == LONE_TESTS and set(workers["read"]) == {"gw0", "gw1"}
