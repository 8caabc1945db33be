"""`bench.preload.run_forked`: `e2b-bench` forked from a process that imported it once (`detect`'s runs) behaves as
`python -m bench.cli` does: the same output and exit code, the caller's environment and working directory as they
are at the call, and a run past its time stopped as Ctrl-C stops it."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from run_cli import REPO

from bench.exits import ExitCode
from bench.preload import Finished, StillRunning, run_forked, stop_all
from bench.remote.slowness import scaled

BANNER = "# e2b-bench scripted model: base URL http://127.0.0.1:"


def test_a_forked_command_answers_as_the_command_itself() -> None:
    argv = ["run", "--endpoint", "no-such-endpoint", "quickstart"]
    executed = subprocess.run(
        [sys.executable, "-m", "bench.cli", *argv],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=scaled(120),
        check=False,
    )

    forked = run_forked(argv, timeout_s=scaled(120), grace_s=scaled(10), cwd=REPO)

    assert executed.returncode == ExitCode.USAGE
    assert (forked.returncode, forked.stdout, forked.stderr) == (executed.returncode, executed.stdout, executed.stderr)
    assert "unknown endpoint 'no-such-endpoint'" in forked.stderr


def test_each_fork_takes_the_callers_environment_and_directory_as_they_are_at_the_call(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    run_forked(["run", "--endpoint", "first-endpoint", "quickstart"], timeout_s=scaled(120), grace_s=scaled(10))
    # after the fork server has started: a later fork must see the change all the same
    monkeypatch.setenv("E2B_BENCH_ENDPOINT", "endpoint-from-the-environment")
    (tmp_path / "somerun").mkdir()
    (tmp_path / "somerun" / "run.json").write_text("garbage{")
    monkeypatch.chdir(tmp_path)

    from_environment = run_forked(["run", "quickstart"], timeout_s=scaled(120), grace_s=scaled(10))
    from_directory = run_forked(["report", "somerun"], timeout_s=scaled(120), grace_s=scaled(10))

    assert from_environment.returncode == ExitCode.USAGE
    assert "unknown endpoint 'endpoint-from-the-environment'" in from_environment.stderr
    given = run_forked(
        ["run", "quickstart"],
        timeout_s=scaled(120),
        grace_s=scaled(10),
        env={**os.environ, "E2B_BENCH_ENDPOINT": "given"},
    )
    assert "unknown endpoint 'given'" in given.stderr
    # the relative path is found from the caller's directory: its run.json is read, and is not JSON
    assert from_directory.returncode == ExitCode.USAGE
    assert "somerun/run.json: not JSON" in from_directory.stderr
    assert os.environ["E2B_BENCH_ENDPOINT"] == "endpoint-from-the-environment"


def test_a_command_past_its_time_is_stopped_as_sigterm_stops_it_and_says_how_it_ended() -> None:
    # the scripted model serves until it is told to stop; on SIGTERM it shuts down and exits 0 (SIGKILL: -9)
    with pytest.raises(StillRunning) as raised:
        run_forked(["model", "--port", "0"], timeout_s=scaled(5), grace_s=scaled(30))

    stopped = raised.value.stopped
    assert stopped.returncode == ExitCode.OK, stopped.output
    assert BANNER in stopped.stdout


def test_stop_all_stops_the_runs_under_way_as_sigterm_does(tmp_path: Path) -> None:
    # what `detect` does when it is interrupted while its threads wait on runs
    output = tmp_path / "model.log"
    ended: list[Finished | BaseException] = []

    def serve() -> None:
        try:
            ended.append(run_forked(["model", "--port", "0"], timeout_s=scaled(300), grace_s=scaled(30), stdout=output))
        except BaseException as exc:  # shown by the assertion below
            ended.append(exc)

    waiter = threading.Thread(target=serve)
    waiter.start()
    deadline = time.monotonic() + scaled(60)
    while BANNER not in (output.read_text() if output.exists() else ""):  # serving: its SIGTERM handler is in place
        assert time.monotonic() < deadline and not ended, ended
        time.sleep(0.05)

    told = stop_all()
    waiter.join(scaled(60))

    assert told == 1
    assert [type(result) for result in ended] == [Finished], ended
    (finished,) = ended
    assert isinstance(finished, Finished) and finished.returncode == ExitCode.OK, finished
    assert stop_all() == 0  # the ended run is no longer known
