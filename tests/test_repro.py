"""`e2b-bench repro`: a failing case of a recorded run becomes a directory that runs outside the checkout, in a fresh
environment of its own pins, with nothing of the harness: it fails (exit 1, the case's symptom) against the endpoint
with the quirk that failed the case and passes (exit 0) against the faithful one. One case per kind of runner:
Python and Node SDK runners, Python and Node framework runners."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from html import unescape
from pathlib import Path

import pytest

from bench.localbox.quirks import build
from bench.localbox.server import LocalEndpoint, LocalServer, in_thread
from bench.remote.slowness import scaled
from bench.repro.cli import slug
from bench.results import read_run
from bench.runners.envs import find_uv
from tests.run_cli import e2b_bench, only_run_dir

QUIRK = "mutations=exit_code_zeroed"
CASES = (
    "quickstart/py-e2b-2.63.0/py03_run_nonzero_exit_raises",
    "quickstart/js-e2b-2.51.0/ts03_run_exit_code_throws",
    "frameworks/ag2-1.2.1/fw02_exit_code",
    "frameworks/mastra-0.8.0/fw02_exit_code",
)
# a proof task the quirk leaves passing: its repro replays the transcript's tool calls with no model
REPLAYED = "frameworks/ag2-1.2.1/fw01_proof_task"
REPRO_S = 300.0  # a repro's install and run on a quiet host, at most


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One run of the cases against the embedded endpoint with the quirk (served by the run itself)."""
    results = tmp_path_factory.mktemp("results")
    selection = [arg for case in (*CASES, REPLAYED) for arg in ("--case", case)]
    done = e2b_bench("run", "--quirk", QUIRK, "--results-dir", str(results), "--no-report", *selection, timeout=900)
    assert done.returncode == 1, done.stdout + done.stderr
    return only_run_dir(results)


@pytest.fixture(scope="module")
def quirky() -> Iterator[LocalEndpoint]:
    with in_thread(LocalServer(quirks=build("e2b", [QUIRK]), pool_size=0)) as local:
        yield local


def install(directory: Path) -> list[str]:
    """A fresh environment of the repro's own pins, in its directory; the command that runs it."""
    if (directory / "repro.py").is_file():
        uv = str(find_uv())
        env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}
        subprocess.run([uv, "venv", "-q", "--python", sys.executable, ".venv"], cwd=directory, env=env, check=True)
        subprocess.run(
            [uv, "pip", "install", "-q", "--python", ".venv/bin/python", "-r", "requirements.txt"],
            cwd=directory, env=env, check=True, timeout=scaled(REPRO_S),
        )  # fmt: skip
        return [".venv/bin/python", "repro.py"]
    npm = shutil.which("npm")
    assert npm is not None
    subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=directory, check=True, capture_output=True,
                   timeout=scaled(REPRO_S))  # fmt: skip
    return ["node", "repro.mjs"]


def run_repro(command: list[str], directory: Path, endpoint: LocalEndpoint) -> subprocess.CompletedProcess[str]:
    """The repro against `endpoint`, with only the three variables of the harness's environment (no checkout)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("E2B_", "PYTHON", "VIRTUAL_ENV"))}
    env.update(endpoint.env())
    return subprocess.run(command, cwd=directory, env=env, capture_output=True, text=True, timeout=scaled(REPRO_S))


@pytest.mark.parametrize("case_id", CASES)
def test_a_repro_fails_against_the_quirk_and_passes_against_the_faithful_endpoint(
    case_id: str, recorded: Path, quirky: LocalEndpoint, endpoint: LocalEndpoint, tmp_path: Path
) -> None:
    record = next(case for case in read_run(recorded).cases if case.id == case_id)
    assert record.outcome == "fail" and record.error
    out = tmp_path / "repro"
    done = e2b_bench("repro", str(recorded), "--case", case_id, "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert str(out) in done.stdout

    readme = (out / "README.md").read_text()
    for name in ("E2B_API_KEY", "E2B_API_URL", "E2B_SANDBOX_URL", record.error, "Wire excerpt"):
        assert name in readme, name
    assert record.evidence and f"{record.evidence[0]['method']} {record.evidence[0]['path']}" in readme
    assert not (out / "runner" / "bench").exists()  # the harness itself is no part of it
    case = json.loads((out / "case.json").read_text())
    assert case["task"]["steps"][-1] == record.case

    command = install(out)
    failing = run_repro(command, out, quirky)
    assert failing.returncode == 1, failing.stdout + failing.stderr
    assert f"REPRODUCED: {record.case} fail: {record.error}" in failing.stdout
    passing = run_repro(command, out, endpoint)
    assert passing.returncode == 0, passing.stdout + passing.stderr
    assert f"OK: {record.case} behaves as E2B does" in passing.stdout


def test_a_proof_task_repro_replays_the_transcript_through_the_backend_without_a_model(
    recorded: Path, endpoint: LocalEndpoint, tmp_path: Path
) -> None:
    transcript = json.loads((recorded / "ag2-1.2.1.json").read_text())
    calls = transcript["attempts"][0]["tool_calls"]
    out = tmp_path / "repro"
    assert e2b_bench("repro", str(recorded), "--case", REPLAYED, "--out", str(out)).returncode == 0
    task = json.loads((out / "case.json").read_text())["task"]
    assert [c["arguments"] for c in task["options"]["replay"]] == [c["arguments"] for c in calls]
    done = run_repro(install(out), out, endpoint)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "OK: fw01_proof_task behaves as E2B does" in done.stdout


def test_a_repro_without_the_variables_says_which_to_set(recorded: Path, tmp_path: Path) -> None:
    out = tmp_path / "repro"
    assert e2b_bench("repro", str(recorded), "--case", CASES[0], "--out", str(out)).returncode == 0
    env = {k: v for k, v in os.environ.items() if not k.startswith("E2B_")}
    done = subprocess.run([sys.executable, "repro.py"], cwd=out, env=env, capture_output=True, text=True)
    assert done.returncode == 2
    assert "set E2B_API_KEY, E2B_API_URL, E2B_SANDBOX_URL" in done.stderr


def test_repro_of_a_case_the_run_lacks_is_one_sentence_and_exit_2(recorded: Path, tmp_path: Path) -> None:
    done = e2b_bench("repro", str(recorded), "--case", "quickstart/py-e2b-2.63.0/nope", "--out", str(tmp_path / "r"))
    assert done.returncode == 2
    assert done.stderr.strip() == f"e2b-bench repro: {recorded} has no case quickstart/py-e2b-2.63.0/nope"
    assert not (tmp_path / "r").exists()


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory, served: dict[str, str]) -> Path:
    """The same cases against the faithful endpoint (this worker's, pointed at as a remote one)."""
    results = tmp_path_factory.mktemp("reference")
    selection = [arg for case in CASES[:2] for arg in ("--case", case)]
    done = e2b_bench("run", "--results-dir", str(results), "--no-report", *selection, env=served, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    return only_run_dir(results)


@pytest.mark.parametrize("case_id", CASES[:2])
def test_diff_shows_the_first_exchange_the_quirk_changed_side_by_side(
    case_id: str, reference: Path, recorded: Path
) -> None:
    done = e2b_bench("diff", str(reference), str(recorded), "--case", case_id)
    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert re.fullmatch(rf"{re.escape(case_id)}: exchange \d+ of \d+ \(A\) differs from \d+ of \d+ \(B\)", lines[0])
    marked = [line for line in lines if line.startswith("≠")]
    # the one differing field is the command's stream: its end event, exit code 3 on E2B's side and 0 on the other
    assert len(marked) == 1 and marked[0].startswith("≠ frames: ")
    left = " ".join(line[2:].split(" | ")[0] for line in lines[2:])
    right = " ".join(line.split(" | ", 1)[1] for line in lines[2:] if " | " in line)
    assert "exit status 3" in left and "exit status 0" in right and "exit status 3" not in right
    assert "request: POST /process.Process/Start" in lines[2]
    assert lines[1].split() == ["A:", read_run(reference).run_id, "|", "B:", read_run(recorded).run_id]
    shown = "\n".join(lines[2:])
    for run in (reference, recorded):  # ids and run ids normalized away
        assert read_run(run).run_id not in shown
        logs = "".join(path.read_text() for path in (run / "wire").glob("*.jsonl"))
        ids = set(re.findall(r'sandboxID\\+": \\+"(\w+)', logs))
        assert ids and not any(sandbox in shown for sandbox in ids)


def test_diff_of_a_run_with_itself_finds_nothing(recorded: Path) -> None:
    done = e2b_bench("diff", str(recorded), str(recorded), "--case", CASES[0])
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip() == f"{CASES[0]}: the same exchanges in both runs"


def test_a_run_given_a_reference_lists_repro_and_diff_under_each_failing_case(reference: Path, tmp_path: Path) -> None:
    results = tmp_path / "results"
    case = CASES[0]
    done = e2b_bench(
        "run", "--quirk", QUIRK, "--results-dir", str(results), "--reference", str(reference), "--case", case,
        timeout=900,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    run_dir = only_run_dir(results)
    lines = done.stdout.splitlines()
    rerun = next(index for index, line in enumerate(lines) if line.strip().startswith(f"{case}  re-run: "))
    assert lines[rerun + 1].strip() == f"repro: ./e2b-bench repro {run_dir} --case {case}"
    assert lines[rerun + 2].strip() == f"diff:  ./e2b-bench diff {reference} {run_dir} --case {case}"

    html = unescape((run_dir / "report.html").read_text())
    differing = e2b_bench("diff", str(reference), str(run_dir), "--case", case).stdout.splitlines()
    marked = next(line for line in differing if line.startswith("≠"))
    assert marked in html  # the first difference, as `diff` prints it, under the case
    assert f"./e2b-bench repro {run_dir} --case {case}" in html
    summary = (run_dir / "summary.md").read_text()
    assert f"repro: `./e2b-bench repro {run_dir} --case {case}`" in summary

    # the printed repro command writes the repro the test above runs
    assert e2b_bench(*shlex.split(lines[rerun + 1].split("repro: ", 1)[1])[1:]).returncode == 0
    assert (run_dir / "repro" / slug(case) / "repro.py").is_file()


def test_run_refuses_a_reference_that_is_no_run(tmp_path: Path) -> None:
    done = e2b_bench("run", "--reference", str(tmp_path), "--case", CASES[0])
    assert done.returncode == 2
    assert done.stderr.strip() == f"e2b-bench run: --reference {tmp_path} is not a run directory (no run.json)"


@pytest.mark.parametrize(
    ("runner", "test", "expected"),
    [
        ("py-upstream", "tests/sync/sandbox_sync/test_kill.py::test_kill",
         "pytest -p no:cacheprovider tests/sync/sandbox_sync/test_kill.py::test_kill"),
        ("js-upstream", "tests/sandbox/kill.test.ts > kill > kills",
         "npx vitest@{vitest} run tests/sandbox/kill.test.ts -t 'kill kills'"),
    ],
)  # fmt: skip
def test_an_upstream_case_gets_its_test_runners_own_command_line_with_pins(
    runner: str, test: str, expected: str, tmp_path: Path
) -> None:
    from bench.repro.standalone import write_repro
    from bench.results import CaseRecord, Run
    from bench.runners.catalog import available_runners

    runners = available_runners()
    record = CaseRecord(
        id=f"upstream/{runner}/{test}", suite="upstream", runner=runner, case=test, outcome="fail",
        expected="pass", conformant=False, error="AssertionError: the sandbox is still running",
    )  # fmt: skip
    header = {"run_id": "20261206T000000Z-upstream-local", "endpoint": {"name": "local"}, "argv": []}
    written = write_repro(Run(tmp_path, header, None, [record]), record.id, tmp_path / "repro", runners)
    readme = (written.directory / "README.md").read_text()
    assert sorted(p.name for p in written.directory.iterdir()) == ["README.md"]  # no script: E2B's own runner
    assert expected.format(vitest=runners[runner].pins.get("vitest")) in readme
    for name, version in runners[runner].pins.items():
        assert f"{name}=={version}" in readme or name == "vitest"
    assert "AssertionError: the sandbox is still running" in readme


def test_a_repro_whose_step_hangs_is_stopped_and_says_where(recorded: Path, tmp_path: Path) -> None:
    """The symptom endpoints' users met by hand (`commands.run` never returning): against an endpoint that never
    ends a command's stream, the repro stops after REPRO_TIMEOUT_S of silence, naming the step (exit 1)."""
    out = tmp_path / "repro"
    assert e2b_bench("repro", str(recorded), "--case", CASES[0], "--out", str(out)).returncode == 0
    command = install(out)
    silence_s = min(scaled(10.0), 40.0)  # shorter than the SDK's own 60 s request timeout, whatever the host
    with in_thread(LocalServer(quirks=build("e2b", ["stream_stall"]), pool_size=0)) as stalling:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("E2B_", "PYTHON", "VIRTUAL_ENV"))}
        env.update(stalling.env(), REPRO_TIMEOUT_S=str(silence_s))
        done = subprocess.run(command, cwd=out, env=env, capture_output=True, text=True, timeout=scaled(REPRO_S))
    assert done.returncode == 1, done.stdout + done.stderr
    step = CASES[0].rsplit("/", 1)[1]
    assert f"REPRODUCED: no answer in {silence_s:.0f} s in step {step}" in done.stdout
