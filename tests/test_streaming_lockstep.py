"""Cases that judge how output arrives run in lockstep with its receipt (docs/ARCHITECTURE.md, "Output streamed in
lockstep"): an endpoint stopped again and again while a command writes (a host that starves it) still gets each
line to the client on its own, and one that holds a command's output back until the command ends fails them, the
reason named."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

from test_localbox_serve import serve_until_done

from bench.exits import ExitCode
from bench.results import CaseRecord, read_run
from tests.run_cli import e2b_bench, only_run_dir

STEPS = ("--case=quickstart/*/py0[14]_*", "--case=quickstart/*/ts0[15]_*")  # each streaming step and its create
STREAMING = ("py04_run_streaming_callbacks", "ts05_run_streaming_onStdout")
STOPPED_S, RUNNING_S = 0.4, 0.1  # the old steps' lines came 0.2 s apart: two of them met in most stops


def streaming_cases(results: Path) -> dict[str, CaseRecord]:
    return {case.case: case for case in read_run(only_run_dir(results)).cases if case.case in STREAMING}


def test_an_endpoint_starved_while_a_command_writes_still_sends_each_line_on_its_own(tmp_path: Path) -> None:
    with serve_until_done() as (server, exports):
        done = threading.Event()

        def starve() -> None:  # the server's process stopped 80% of the time, as a host at a high load may
            while not done.wait(RUNNING_S):
                os.kill(server.pid, signal.SIGSTOP)
                done.wait(STOPPED_S)
                os.kill(server.pid, signal.SIGCONT)

        starving = threading.Thread(target=starve)
        starving.start()
        try:
            run = e2b_bench(
                "run",
                *STEPS,
                "--results-dir",
                str(tmp_path),
                "--no-report",
                env={**exports, "E2B_BENCH_ENDPOINT": "env"},
            )
        finally:
            done.set()
            starving.join()
            os.kill(server.pid, signal.SIGCONT)

    cases = streaming_cases(tmp_path)
    assert run.returncode == ExitCode.OK, run.stdout[-2000:]
    assert {name: (case.outcome, case.details["chunks"]) for name, case in cases.items()} == {
        name: ("pass", ["1\n", "2\n", "3\n"]) for name in STREAMING
    }


def test_an_endpoint_that_holds_output_back_until_the_end_fails_the_streaming_steps_and_is_named(
    tmp_path: Path,
) -> None:
    run = e2b_bench("run", *STEPS, "--quirk=mutations=output_held", "--results-dir", str(tmp_path), "--no-report")

    cases = streaming_cases(tmp_path)
    assert run.returncode == ExitCode.NONCONFORMANT, run.stdout[-2000:]
    assert {name: (case.outcome, case.details["chunks"]) for name, case in cases.items()} == {
        name: ("fail", ["1\n2\n3\n"]) for name in STREAMING
    }
    for case in cases.values():
        said = case.details["stderr"].splitlines()
        assert [line.rsplit(" ", 2)[0] for line in said] == [
            "line 1 not received by the client within",
            "line 2 not received by the client within",
        ]
        assert case.error is not None and case.error.startswith(
            f"output was not sent as it came: {said[0]}; {said[1]} ("
        )
