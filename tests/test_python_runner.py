"""The pinned Python environment and the quickstart runner's own protocol behaviour.

Running the quickstart against a live endpoint is covered by the end-to-end tests; here the runner
meets an endpoint that refuses connections, which exercises its planning, dependency and footer logic.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from loopback import closed_port
from run_cli import REPO

from bench.localbox.server import LocalEndpoint
from bench.redaction import Redactor
from bench.runners import RUNNERS, RunnerEnvError, RunnerSpec, ensure_python_env, run_runner
from bench.runners.catalog import Runner, prepare_all
from bench.runners.envs import env_dir, installed_versions
from bench.runners.manifest import load_manifest, load_steps, task_steps, with_dependencies
from bench.runners.protocol import make_task
from bench.wire import WireProxy

SPEC = RUNNERS["py-e2b-2.63.0"]


def test_a_failed_install_reports_the_uv_error(tmp_path: Path) -> None:
    spec = RunnerSpec("broken", "python", {"e2b": "not a version"}, SPEC.entry)

    with pytest.raises(RunnerEnvError) as failure:
        ensure_python_env(spec, tmp_path)

    assert str(failure.value).startswith("building the broken environment failed: `pip install` exited with 2: ")
    assert "e2b==not a version" in str(failure.value)


def test_a_half_built_environment_is_rebuilt(tmp_path: Path) -> None:
    half_built = env_dir(SPEC, tmp_path)
    (half_built / "bin").mkdir(parents=True)
    (half_built / "bin" / "python").write_text("not an interpreter")

    python = ensure_python_env(SPEC, tmp_path)

    version = subprocess.run(
        [python, "-c", "import importlib.metadata as m; print(m.version('e2b'))"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert version.stdout == "2.63.0\n"
    assert (half_built / ".e2b-bench-ready").is_file()


def test_manifest_dependencies_come_before_their_dependents() -> None:
    steps = load_steps("quickstart", "python")

    assert [step.id for step in steps][:2] == ["py01_create", "py02_run_echo"]
    assert len(steps) == 11
    assert with_dependencies(steps, ["py11_refusals", "py06_files_list_exists_info"]) == [
        "py01_create",
        "py05_files_write_read",
        "py06_files_list_exists_info",
        "py10_kill",
        "py11_refusals",
    ]


def test_runner_against_a_refusing_endpoint_fails_create_and_blocks_its_dependents() -> None:
    url = f"http://127.0.0.1:{closed_port()}"
    planned = task_steps(load_steps("quickstart", "python"), ["py02_run_echo"])
    env = {"E2B_API_KEY": "e2b_test", "E2B_API_URL": url, "E2B_SANDBOX_URL": url, "E2B_CONNECTION_RETRIES": "0"}
    steps = [*planned["steps"], "py99_unknown"]
    task = make_task("quickstart", SPEC.name, "t1", steps=steps, depends=planned["depends"], env=env, options={})

    result = run_runner(SPEC, ensure_python_env(SPEC), task, step_timeout_s=60, env={"PATH": "/usr/bin:/bin"})

    assert result.hello == {
        "type": "hello",
        "protocol": 1,
        "runner": "py-e2b-2.63.0",
        "pins": {"e2b": "2.63.0"},
        "language": "python",
    }
    create = result.steps["py01_create"]
    assert create["outcome"] == "fail"
    assert create["error"].startswith("ConnectError: ")
    assert create["details"]["raised"]["exception"] == "ConnectError"
    assert [(r.id, r.outcome, r.error) for r in result.step_results()] == [
        ("py01_create", "fail", create["error"]),
        ("py02_run_echo", "error", "depends on py01_create"),
        ("py99_unknown", "error", "runner has no implementation of step py99_unknown"),
    ]
    assert result.footer is not None and result.footer["completed"] is True
    assert (result.exit_code, result.protocol_errors) == (0, [])


def run_importing(task: dict[str, Any], env: dict[str, str]) -> tuple[list[dict[str, Any]], set[str]]:
    """The task's runner run as the harness runs it, with `-X importtime`: its events and every module it loaded."""
    entry = REPO / str(load_manifest()[task["suite"]]["python"]["entry"])
    done = subprocess.run(
        [str(ensure_python_env(SPEC)), "-X", "importtime", str(entry)], input=json.dumps(task), cwd=REPO,
        env={"PATH": "/usr/bin:/bin", **env}, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    imported = {line.split("|")[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}
    return [json.loads(line) for line in done.stdout.splitlines()], imported


def test_a_runner_whose_steps_made_no_sandbox_ends_without_loading_the_sdk() -> None:
    # Creates with an option, sent as plain HTTP: against a refusing endpoint none makes a sandbox to kill.
    url = f"http://127.0.0.1:{closed_port()}"
    steps = ["rf01_create_mcp", "rf03_create_volume_mounts", "rf04_create_iam"]
    env = {"E2B_API_KEY": "e2b_test", "E2B_API_URL": url, "E2B_SANDBOX_URL": url}
    task = make_task("refusals", SPEC.name, "t1", steps=steps, depends={}, env={}, options={})

    events, imported = run_importing(task, env)

    assert sorted(e["id"] for e in events if e["type"] == "step") == sorted(steps)
    assert events[-1] == {"type": "footer", "completed": True, "duration_ms": events[-1]["duration_ms"], "cleanup": {}}
    assert "httpx" in imported and "e2b" not in imported


def test_a_sandbox_made_over_plain_http_is_killed_when_its_case_ends_without_loading_the_sdk(
    endpoint: LocalEndpoint,
) -> None:
    task = make_task("refusals", SPEC.name, "t2", steps=["rf11_envd_pty"], depends={}, env={}, options={})

    events, imported = run_importing(task, endpoint.env())

    (step,) = [e for e in events if e["type"] == "step"]
    assert (step["id"], step["outcome"]) == ("rf11_envd_pty", "pass")
    # Killed when its case ended (not by the runner's clean-up, which has nothing left), with plain HTTP too.
    (made,) = ended = step["details"]["hygiene"]["sandboxes_ended"]
    assert (ended, events[-1]["cleanup"]) == ({made: "killed"}, {}) and "e2b" not in imported
    gone = httpx.get(f"{endpoint.api_url}/sandboxes/{made}", headers={"X-API-KEY": endpoint.api_key}, timeout=30)
    assert gone.status_code == 404


def test_quickstart_passes_on_the_embedded_endpoint_through_the_wire_proxy(
    endpoint: LocalEndpoint, tmp_path: Path
) -> None:
    steps = [step.id for step in load_steps("quickstart", "python")]
    log = tmp_path / "wire" / f"{SPEC.name}.jsonl"
    with WireProxy(endpoint.api_url, endpoint.sandbox_url, log, SPEC.name, Redactor([endpoint.api_key])) as proxy:
        env = {"E2B_API_KEY": endpoint.api_key, "E2B_API_URL": proxy.url, "E2B_SANDBOX_URL": proxy.url}
        task = make_task("quickstart", SPEC.name, "e2e", **task_steps(load_steps("quickstart", "python"), steps))
        task.update(env=env, options={})
        result = run_runner(SPEC, ensure_python_env(SPEC), task, step_timeout_s=60, env={"PATH": "/usr/bin:/bin"})

    assert [(r.id, r.outcome, r.error) for r in result.step_results()] == [(s, "pass", None) for s in steps]
    assert result.footer is not None and result.footer["cleanup"] == {}
    text = log.read_text()
    assert endpoint.api_key not in text
    calls = [json.loads(line) for line in text.splitlines()]
    assert calls[0]["method"] == "POST" and calls[0]["url"].endswith("/v2/sandboxes")
    assert {call["request_headers"].get("x-access-token") for call in calls} <= {None, "[REDACTED]"}


def test_environments_not_built_yet_are_announced_and_each_again_when_done(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("E2B_BENCH_CACHE", str(tmp_path))  # an empty cache: every environment is built
    broken = Runner(RunnerSpec("broken", "python", {"e2b": "not a version"}, SPEC.entry))
    lines: list[str] = []

    prepared = prepare_all([Runner(SPEC), broken], lines.append)

    assert lines[0] == f"building 2 runner environment(s), cached for later runs: {SPEC.name}, broken"
    assert sorted(re.sub(r"after \d+ s$", "after N s", line) for line in lines[1:]) == [
        "broken FAILED after N s",
        f"{SPEC.name} ready after N s",
    ]
    assert prepared[SPEC.name] == env_dir(SPEC, tmp_path) / "bin" / "python"
    assert str(prepared["broken"]).startswith("runner environment broken could not be built: building the broken")
    again: list[str] = []
    assert prepare_all([Runner(SPEC)], again.append) == {SPEC.name: prepared[SPEC.name]} and again == []


def test_what_an_environment_holds_is_read_once_per_state_of_its_packages(tmp_path: Path) -> None:
    """Every run's header names every package of each runner's environment: a Python process walked them all
    at every run (#30). Now once per state of site-packages; a package installed since is seen."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "env")], check=True)
    python = tmp_path / "env" / "bin" / "python"
    (site,) = (tmp_path / "env" / "lib").glob("*/site-packages")

    assert installed_versions(python) == {}
    kept = json.loads((tmp_path / "env" / ".e2b-bench-installed.json").read_text())
    (tmp_path / "env" / ".e2b-bench-installed.json").write_text(json.dumps({**kept, "versions": {"kept": "1"}}))
    assert installed_versions(python) == {"kept": "1"}  # the same state: not asked again

    dist = site / "demo-2.5.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: demo\nVersion: 2.5\n")
    assert installed_versions(python) == {"demo": "2.5"}  # installed since: asked again, and seen
    asked = subprocess.run([str(python), "-c", "import importlib.metadata as m; print(m.version('demo'))"],
                           capture_output=True, text=True, check=True)  # fmt: skip
    assert asked.stdout == "2.5\n"
