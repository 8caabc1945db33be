"""The computer suite (the agent computer contract) end to end on the embedded endpoint, and a crashed client.

The suite is one `e2b-bench run computer`; the tests read what it recorded and check it against facts of their
own (the manifest's steps, the endpoint's key, what the REST API says now). Which cases each of its quirks flags
is proven with the other quirks' in tests/test_quirk_detection.py (`bench.detection.COMPUTER_CASES`).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from run_cli import e2b_bench, only_run_dir

from bench.localbox.server import LocalEndpoint
from bench.results import Run, read_run
from bench.runners.manifest import load_steps
from bench.runners.node import NODE_RUNNERS, ensure_node_runner, env_dir, project_of, runner_env

REPO = Path(__file__).resolve().parents[1]
RUNNER = "js-e2b-2.51.0"
ORPHAN = REPO / "sandboxes" / "e2b" / "ts" / "computer_orphan.mjs"
SCANNER = REPO / "sandboxes" / "e2b" / "ts" / "credential_scan.py"
STEPS = [step.id for step in load_steps("computer", "ts")]


def test_the_manifest_names_the_computer_script_and_every_step_is_implemented_in_its_order() -> None:
    source = (REPO / "sandboxes" / "e2b" / "ts" / "computer.mjs").read_text()

    assert re.findall(r"^step\('(\w+)',", source, flags=re.MULTILINE) == STEPS
    assert [step[:4] for step in STEPS] == [f"co0{n}" for n in range(1, 10)]  # (a)-(i) of the contract


@pytest.fixture(scope="module")
def faithful(
    tmp_path_factory: pytest.TempPathFactory, served: dict[str, str]
) -> tuple[subprocess.CompletedProcess[str], Run]:
    results = tmp_path_factory.mktemp("computer")
    done = e2b_bench("run", "computer", "--results-dir", str(results), "--no-report", env=served, timeout=900)
    return done, read_run(only_run_dir(results))


def test_every_step_passes_on_the_embedded_endpoint(faithful: tuple[subprocess.CompletedProcess[str], Run]) -> None:
    done, run = faithful

    assert done.returncode == 0, done.stdout[-3000:]
    assert {(c.suite, c.runner, c.case): c.outcome for c in run.cases} == {
        **{("computer", RUNNER, step): "pass" for step in STEPS},
        ("housekeeping", "harness", "leak_check"): "pass",
    }


def test_nothing_the_suite_made_outlives_it(faithful: tuple[subprocess.CompletedProcess[str], Run]) -> None:
    _, run = faithful
    cases = {c.case: c for c in run.cases}

    # The crashed client's sandbox was ended by its lifetime, the closed one at once; the sweep found nothing.
    assert cases["co08_release"].details["orphan_after_lifetime"] == 404
    assert cases["co08_release"].details["rest_get_after_close"] == 404
    assert cases["leak_check"].details.get("survivors", []) == []


def test_the_credential_scan_covered_the_files_the_run_wrote(
    faithful: tuple[subprocess.CompletedProcess[str], Run],
) -> None:
    _, run = faithful
    scan = next(c for c in run.cases if c.case == "co09_no_credentials_inside").details

    assert scan["secrets_checked"] == ["api key", "envd access token"]
    assert scan["scan_saw_the_seeds"] == 1
    # The 20 MiB, slot, 17 MiB and staged files of co06 at least, besides the seeds.
    assert scan["files_scanned"] >= 10
    assert scan["credentials_found"] == []


def test_a_crashed_clients_sandbox_is_ended_by_the_endpoint_at_its_lifetime(endpoint: LocalEndpoint) -> None:
    spec = NODE_RUNNERS[RUNNER]
    node = ensure_node_runner(spec)
    env = runner_env(env_dir(project_of(spec)), {**os.environ, **endpoint.env()})
    lifetime_ms = 6_000
    client = subprocess.Popen(
        [str(node), str(ORPHAN), str(lifetime_ms), json.dumps({"test": "computer-crash"})],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert client.stdout is not None
    line = client.stdout.readline()  # the computer is open: its sandbox id and end
    client.kill()  # SIGKILL: nothing of the client's closes anything
    client.wait(timeout=30)
    assert line, client.stderr.read() if client.stderr else ""
    opened = json.loads(line)
    end_at = datetime.fromisoformat(opened["endAt"].replace("Z", "+00:00")).timestamp()
    headers = {"X-API-KEY": endpoint.api_key}
    url = f"{endpoint.api_url}/sandboxes/{opened['sandboxId']}"
    with httpx.Client(headers=headers, timeout=30) as rest:
        seen = [(time.time(), rest.get(url))]
        # The event is the endpoint's 404; the bound only stops a broken reaper from hanging the test.
        while seen[-1][1].status_code == 200 and time.time() < end_at + 120:
            time.sleep(0.2)
            seen.append((time.time(), rest.get(url)))

    running = [answer.json() for _, answer in seen if answer.status_code == 200]
    gone_at, last = seen[-1]
    assert last.status_code == 404
    # It was left running by the crash, and the endpoint (same clock) ended it at its lifetime, not before.
    assert all(info["state"] == "running" and info["metadata"]["test"] == "computer-crash" for info in running)
    assert gone_at >= end_at - 1 or not running
    assert running or seen[0][0] >= end_at - 1


def scan(sandbox: Any, secrets: list[str], seeds: list[str]) -> list[str]:
    """Run the suite's credential scanner in `sandbox` as computer.mjs does: the findings as `<index> <where>`."""
    since = sandbox.get_info().started_at.timestamp() - 600
    pad = os.urandom(max(len(s) for s in secrets))
    masked = [bytes(a ^ b for a, b in zip(s.encode(), pad, strict=False)).hex() for s in secrets]
    script = shlex.quote(SCANNER.read_text())
    command = f"echo {' '.join(seeds)} | python3 -I -c {script} {since} {pad.hex()} {' '.join(masked)}"
    counts, *found = sandbox.commands.run(command, user="root").stdout.strip().split("\n")
    assert counts.split()[1] == "1", counts  # every seed was among the files scanned
    return sorted(line for line in found if line)


def test_the_credential_scanner_finds_a_planted_secret_in_a_file_an_environment_and_arguments(
    sandbox: Any, endpoint: LocalEndpoint
) -> None:
    key, absent = endpoint.api_key, "e2b_" + os.urandom(16).hex()
    sandbox.files.write("/home/user/notes/leaked.txt", f"config\nkey={key}\n")
    holder = sandbox.commands.run("exec sleep 300", background=True, envs={"LEAKED": key}, timeout=0, user="root")
    sandbox.commands.run(f"(exec -a {shlex.quote('x' + key)} sleep 300) >/dev/null 2>&1 &", user="root")

    found = scan(sandbox, [key, absent], ["/home/user/notes/leaked.txt"])

    holder.kill()
    assert "0 /home/user/notes/leaked.txt" in found
    assert f"0 /proc/{holder.pid}/environ" in found
    assert any(line.startswith("0 /proc/") and line.endswith("/cmdline") for line in found)
    assert not [line for line in found if line.startswith("1 ")]  # the secret that is not there is not found


def test_a_mutation_whose_answer_is_lost_every_time_is_a_deviation_exit_1_not_the_endpoints_moment(
    tmp_path: Path,
) -> None:
    # Every rename is applied and answered 503 (`drop_mutation_answer`): the case fails after a 503, runs again on a
    # fresh sandbox, fails the same way, and is the deviation it is (it was `error` "endpoint transient", exit 2).
    done = e2b_bench("run", "computer", "--quirk", "drop_mutation_answer", "--no-report",
                     "--results-dir", str(tmp_path), timeout=900)  # fmt: skip

    output = done.stdout + done.stderr
    assert done.returncode == 1, output[-3000:]
    run = read_run(only_run_dir(tmp_path))
    failing = [case for case in run.cases if not case.conformant]
    assert [case.case for case in failing] == ["co06_file_streams"]
    case = failing[0]
    # The wire log, a second path: the renames the endpoint answered, and what it said.
    exchanges = [json.loads(line) for line in (run.path / "wire" / f"{RUNNER}.jsonl").read_text().splitlines()]
    lost = [e for e in exchanges if e["url"].endswith("/filesystem.Filesystem/Move") and e["status"] == 503]
    said = {json.loads(e["response_excerpt"])["message"] for e in lost}
    assert len(said) == 1, said
    message = said.pop()
    # No rename of the run is answered otherwise (co03's renames of a skill are the adapter's refusals now: envd
    # renames as root), so the cause names the route the endpoint never answered.
    assert case.outcome == "fail"
    assert case.details["cause"].startswith("the endpoint refuses every POST /filesystem.Filesystem/Move")
    assert case.error is not None and case.error.endswith(f"(the endpoint answered 503 {message}, on the re-run too)")
    attempts = case.details["attempts"]  # the first, its re-run and, failed after a 503 again, one more
    assert [tried["outcome"] for tried in attempts] == ["fail", "fail", "fail"]
    for tried in attempts:
        assert [(a["path"], a["status"], a["message"]) for a in tried["answers"]] == [
            ("/filesystem.Filesystem/Move", 503, message)
        ]
    assert sum(tried["answers"][0]["times"] for tried in attempts) <= len(lost)
    assert "running again on a fresh sandbox, after a 429/502/503 answer: co06_file_streams (503)" in output
    assert "endpoint transient" not in output


def test_the_cases_a_declared_failure_keeps_from_running_conform_as_skips_naming_it(tmp_path: Path) -> None:
    # Without useradd the agent user cannot be made (co02 fails) and the steps needing it do not run: one
    # difference. Declared once, for co02 alone, it is the verdict of every case it kept from running.
    declarations = tmp_path / "declared.toml"
    declarations.write_text(
        '[endpoint]\nname = "local"\n\n[cases."computer/*/co02_template_agent_user"]\noutcome = "fail"\n'
        'reason = "the template has no useradd"\n'
    )
    done = e2b_bench("run", "computer", "--quirk", "no_useradd", "--expectations", str(declarations), "--no-report",
                     "--results-dir", str(tmp_path / "results"), timeout=900)  # fmt: skip

    run = read_run(only_run_dir(tmp_path / "results"))
    by_case = {case.case: case for case in run.cases}
    kept = [case for case in run.cases if case.details.get("skip_reason") == "declared_prerequisite"]
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert (by_case["co02_template_agent_user"].outcome, by_case["co02_template_agent_user"].conformant) == (
        "fail",
        True,
    )
    assert kept and all(case.outcome == "skip" and case.conformant for case in kept)
    assert all(
        case.error == "skipped: it depends on co02_template_agent_user, whose fail is declared for this endpoint"
        for case in kept
    )
    # and the run has no cause left: the one difference is declared
    causes = json.loads((only_run_dir(tmp_path / "results") / "causes.json").read_text())["causes"]
    assert causes == []
