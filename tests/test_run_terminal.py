"""What `e2b-bench run` says on the terminal: a header, progress, the causes with a re-run each and what to type
next, one verdict line; each preflight message once; `-q` only the verdict; an empty selection named; and the live bar
on a real terminal (tmux), looked at on its screen."""

from __future__ import annotations

import io
import json
import logging
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.triage.console import Console, verdict_line
from tests.run_cli import REPO, e2b_bench, only_run_dir

PY = "py-e2b-2.63.0"
RUNS = Path(__file__).parent / "fixtures" / "runs"
PROGRESS = re.compile(r"^e2b-bench: (\d+)/2 cases done, 0 failing, \d+s")


def test_a_run_prints_a_header_progress_lines_and_one_verdict_line(tmp_path: Path) -> None:
    done = e2b_bench(
        "run", "--case", f"quickstart/{PY}/py0[12]_*", "--results-dir", str(tmp_path),
        env={"E2B_BENCH_PROGRESS_S": "0.01"},  # a run that starts a runner and a sandbox outlasts a few of those
    )  # fmt: skip

    run = only_run_dir(tmp_path)
    lines = done.stdout.splitlines()
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert lines[:5] == [
        "e2b-bench run: endpoint local (embedded)",
        "  suites: quickstart",
        f"  runners: {PY}",
        "  cases: 2",
        f"  run directory: {run}",
    ]
    progress = [line for line in lines if PROGRESS.match(line)]
    assert len(progress) >= 2 and progress[-1].startswith("e2b-bench: 2/2 cases done")
    assert lines[-1] == f"CONFORMANT: 3 cases; gate passed; report: {run / 'report.html'}"
    assert done.stderr == ""


def test_quiet_prints_only_the_verdict_line_with_the_failures_counted(tmp_path: Path) -> None:
    done = e2b_bench(
        "run", "-q", "--quirk", "session_leader", "--case", f"probes/{PY}/pr0[13]_*", "--results-dir", str(tmp_path)
    )

    run = only_run_dir(tmp_path)
    assert (done.returncode, done.stderr) == (1, "")
    assert done.stdout == f"NOT CONFORMANT: 1 of 3 cases in 1 cause; gate FAILED; report: {run / 'report.html'}\n"


def test_a_failing_run_lists_its_causes_with_a_rerun_each_then_the_commands_to_type_next(tmp_path: Path) -> None:
    cases = (f"quickstart/{PY}/py03_run_nonzero_exit_raises", "quickstart/js-e2b-2.51.0/ts03_run_exit_code_throws")
    done = e2b_bench(
        "run", "--quirk", "mutations=exit_code_zeroed", *(f"--case={case}" for case in cases),
        "--results-dir", str(tmp_path),
    )  # fmt: skip

    run = only_run_dir(tmp_path)
    lines = done.stdout.splitlines()
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    causes = [line for line in lines if line.startswith("✘ cause ")]
    assert len(causes) == 2 and all(re.match(r"✘ cause [12]: 1 case\(s\), fail, in (py|js)-e2b-", c) for c in causes)
    assert any("instead of raising CommandExitException" in c for c in causes)
    reruns = [line.split("  re-run: ", 1) for line in lines if "  re-run: " in line]
    assert sorted(case.strip() for case, _ in reruns) == sorted(cases)
    assert all(
        f"--case {case.strip()}" in rerun and "--quirk mutations=exit_code_zeroed" in rerun for case, rerun in reruns
    )
    nexts = lines[lines.index("next:") + 1 :][:2]
    assert nexts[0].startswith(f"  e2b-bench report --causes {run}")
    assert nexts[1].startswith(f"  e2b-bench expectations {run} --write ")
    assert lines[-1].startswith("NOT CONFORMANT: 2 of 3 cases in 2 causes; gate FAILED")


def test_the_verdict_line_counts_causes_when_the_run_has_them(tmp_path: Path) -> None:
    run = tmp_path / "nightly-02"
    shutil.copytree(RUNS / "nightly-02", run)
    without = verdict_line(run, run / "report.html")
    (run / "causes.json").write_text(json.dumps([{"signature": "a"}, {"signature": "b"}]))

    assert without == f"NOT CONFORMANT: 3 of 6 cases; gate FAILED; report: {run / 'report.html'}"
    assert verdict_line(run, None) == f"NOT CONFORMANT: 3 of 6 cases in 2 causes; gate FAILED; run directory: {run}"


def test_a_failed_preflight_is_said_once(tmp_path: Path) -> None:
    url = "http://127.0.0.1:9"
    env = {"E2B_API_KEY": "e2b_" + "0" * 40, "E2B_API_URL": url, "E2B_SANDBOX_URL": url}

    done = e2b_bench("run", "--endpoint", "env", "--runner", PY, "--results-dir", str(tmp_path), env=env)

    run = only_run_dir(tmp_path)
    error = json.loads((run / "preflight.json").read_text())["error"]
    assert done.returncode == 2
    assert (done.stdout + done.stderr).count(error) == 1
    assert done.stdout.splitlines()[-1] == (
        f"ENDPOINT UNUSABLE: {error}; nothing ran; gate FAILED; report: {run / 'report.html'}"
    )


EMPTY = {
    "--case": (["--case", "quickstart/*/no_such_case"], "--case 'quickstart/*/no_such_case' matched none of the"),
    "-k": (["quickstart", "-k", "no_such_case"], "-k 'no_such_case' and -m 'not slow and not bench' left none"),
    "--runner": (["isolation", "--runner", "js-e2b-2.51.0"], "have no case for js-e2b-2.51.0"),
    "a path": (["docs"], "the suites or paths given have no case for the default runners"),
}


@pytest.mark.parametrize("how", EMPTY)
def test_an_empty_selection_exits_5_naming_what_emptied_it(how: str, tmp_path: Path) -> None:
    args, named = EMPTY[how]

    done = e2b_bench("run", *args, "--results-dir", str(tmp_path))

    assert done.returncode == 5, done.stdout[-2000:] + done.stderr[-2000:]
    assert done.stderr.startswith("e2b-bench run: no case matched the selection: ")
    assert named in done.stderr and len(done.stderr.splitlines()) == 1
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_on_a_terminal_a_live_bar_shows_each_suite_and_runner_then_gives_way_to_the_verdict(tmp_path: Path) -> None:
    # Everything the run writes to the terminal is kept (a bar drawn between two looks at the screen is seen):
    # the command waits until tmux pipes the pane to a file. With -v each case's line redraws the bar below it,
    # however quickly the cases pass (unasked, it is redrawn once a second).
    session, written, go = f"e2b-bench-{tmp_path.name}", tmp_path / "terminal.out", tmp_path / "go"
    command = shlex.join(
        [sys.executable, "-m", "bench.cli", "run", "-v", "--case", f"quickstart/{PY}/py0[1-4]_*", "--results-dir",
         str(tmp_path / "results")]
    )  # fmt: skip
    waiting = f"until [ -e {go} ]; do sleep 0.05; done; {command}; sleep 600"
    subprocess.run(
        ["tmux", "new-session", "-d", "-s", session, "-x", "160", "-y", "40", "-c", str(REPO), waiting], check=True
    )
    screen = ""
    try:
        subprocess.run(["tmux", "pipe-pane", "-o", "-t", session, f"cat >> {shlex.quote(str(written))}"], check=True)
        go.touch()
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and "gate passed" not in screen:
            time.sleep(0.5)
            screen = subprocess.run(
                ["tmux", "capture-pane", "-p", "-t", session], capture_output=True, text=True, check=True
            ).stdout
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], check=False)

    lines = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", written.read_text(errors="replace")).replace("\r", "").splitlines()
    bars = [line for line in lines if re.search(r"\[[#-]{24}\] \d/4", line)]
    assert bars and all(line.startswith(f"  quickstart/{PY} [") for line in bars)
    assert re.search(r"\[#{24}\] 4/4", bars[-1])  # the last drawn: all four done
    final = screen.splitlines()
    assert not [line for line in final if re.search(r"\[[#-]{24}\]", line)]  # the bar is gone at the end
    assert any(line.startswith("CONFORMANT: 5 cases; gate passed; report: ") for line in final)


@pytest.mark.parametrize(("verbosity", "shown"), [(0, ""), (1, "e2b-bench: the disk still holds /dev/loop7\n")])
def test_a_harness_warning_reaches_the_terminal_only_with_verbose(verbosity: int, shown: str) -> None:
    out = io.StringIO()
    console = Console(verbosity=verbosity, stream=out, tty=False)
    localbox = logging.getLogger("e2b-bench.localbox")
    logging.getLogger("e2b-bench").addHandler(console.log)
    try:
        localbox.warning("e2b-bench: the disk still holds %s", "/dev/loop7")
    finally:
        logging.getLogger("e2b-bench").removeHandler(console.log)

    assert (out.getvalue(), console.log.hidden) == (shown, 0 if shown else 1)
