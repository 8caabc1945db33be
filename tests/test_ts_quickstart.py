"""The TypeScript quickstart: pinned Node projects, the shared runner script and its 23 steps."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from loopback import closed_port

from bench.localbox.quirks import Quirks
from bench.localbox.server import LocalEndpoint, serving
from bench.redaction import Redactor
from bench.runners import RunnerEnvError, RunnerResult, RunnerSpec, run_runner
from bench.runners.catalog import MANIFEST_TABLES
from bench.runners.envs import REPO_ROOT
from bench.runners.manifest import Step, load_steps, task_steps
from bench.runners.node import (
    NODE_RUNNERS,
    PROJECT_DIRS,
    ensure_node_env,
    ensure_node_runner,
    env_dir,
    project_of,
    runner_env,
)
from bench.runners.protocol import make_task
from bench.wire import WireProxy

NEWEST = NODE_RUNNERS["js-e2b-2.51.0"]
BEFORE_V2 = NODE_RUNNERS["js-e2b-2.50.0"]
STEPS: list[Step] = load_steps("quickstart", MANIFEST_TABLES["js"])
STEP_IDS = [step.id for step in STEPS]
DEPENDS = {step.id: list(step.depends) for step in STEPS}
BASE_ENV = {"PATH": "/usr/bin:/bin"}


def task(run_id: str, env: dict[str, str], steps: list[str] = STEP_IDS, **options: Any) -> dict[str, Any]:
    return make_task("quickstart", "js-e2b", run_id, steps=steps, depends=DEPENDS, env=env, options=options)


def run(spec: RunnerSpec, task: dict[str, Any], step_timeout_s: float = 60) -> RunnerResult:
    node = ensure_node_runner(spec)
    env = runner_env(env_dir(project_of(spec)), BASE_ENV)
    return run_runner(spec, node, task, step_timeout_s=step_timeout_s, env=env)


def outcomes(result: RunnerResult) -> list[tuple[str, str, str | None]]:
    return [(r.id, r.outcome, r.error) for r in result.step_results()]


def test_every_manifest_step_has_an_implementation_and_every_implementation_a_manifest_step() -> None:
    source = (REPO_ROOT / NEWEST.entry).read_text()

    implemented = re.findall(r"^step\('(\w+)',", source, flags=re.MULTILINE)

    assert implemented == STEP_IDS
    assert len(STEP_IDS) == 23 and STEP_IDS[0] == "ts01_create" and STEP_IDS[-1] == "ts23_kill_and_refusals"


def test_each_node_project_pins_and_locks_one_exact_e2b_version() -> None:
    for name, project in PROJECT_DIRS.items():
        spec = NODE_RUNNERS[name]
        lock = json.loads((project / "package-lock.json").read_text())

        assert (spec.name, spec.language, spec.entry) == (f"js-e2b-{spec.pins['e2b']}", "js", NEWEST.entry)
        assert lock["packages"][""]["dependencies"] == {"e2b": spec.pins["e2b"]}
        assert lock["packages"]["node_modules/e2b"]["version"] == spec.pins["e2b"]
    assert sorted(NODE_RUNNERS) == ["js-e2b-2.50.0", "js-e2b-2.51.0"]


def test_a_half_built_node_environment_is_rebuilt_then_reused_without_npm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    project = PROJECT_DIRS[BEFORE_V2.name]
    half_built = env_dir(project, tmp_path)
    (half_built / "node_modules" / "leftover").mkdir(parents=True)

    built = ensure_node_env(project, tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path / "no-npm-here"))
    reused = ensure_node_env(project, tmp_path)

    assert reused == built == half_built
    assert not (built / "node_modules" / "leftover").exists()
    installed = json.loads((built / "node_modules" / "e2b" / "package.json").read_text())
    assert installed["version"] == "2.50.0"
    assert (built / ".e2b-bench-ready").is_file()


def test_a_failed_npm_ci_reports_npm_stderr_and_leaves_no_ready_marker(tmp_path: Path) -> None:
    project = tmp_path / "out-of-sync"
    project.mkdir()
    shutil.copy(PROJECT_DIRS[NEWEST.name] / "package-lock.json", project)
    (project / "package.json").write_text(json.dumps({"name": "x", "private": True, "dependencies": {"e2b": "2.50.0"}}))

    with pytest.raises(RunnerEnvError) as failure:
        ensure_node_env(project, tmp_path / "cache")

    message = str(failure.value)
    assert message.startswith(f"building the Node environment of {project} failed: `npm ci` exited with 1: ")
    assert "in sync" in message
    assert list((tmp_path / "cache" / "node").glob("*/.e2b-bench-ready")) == []


def test_against_a_refusing_endpoint_create_fails_and_blocks_its_dependents() -> None:
    url = f"http://127.0.0.1:{closed_port()}"
    env = {"E2B_API_KEY": "e2b_test", "E2B_API_URL": url, "E2B_SANDBOX_URL": url}

    steps = [*task_steps(STEPS, ["ts10_commands_kill"])["steps"], "ts99_unknown"]
    result = run(NEWEST, {**task("refused", env, steps=steps), "runner": NEWEST.name})

    assert result.hello == {
        "type": "hello",
        "protocol": 1,
        "runner": "js-e2b-2.51.0",
        "pins": {"e2b": "2.51.0"},
        "language": "js",
    }
    assert [result.steps[s]["outcome"] for s in ("ts01_create", "ts09_commands_list")] == ["fail", "error"]
    assert result.steps["ts01_create"]["details"]["raised"]["exception"] == "TypeError"
    assert result.steps["ts01_create"]["error"] == "TypeError: fetch failed"
    assert outcomes(result) == [
        ("ts01_create", "fail", "TypeError: fetch failed"),
        ("ts09_commands_list", "error", "depends on ts01_create"),
        ("ts10_commands_kill", "error", "depends on ts01_create"),
        ("ts99_unknown", "error", "no implementation for step ts99_unknown"),
    ]
    assert result.footer is not None and result.footer["cleanup"] == {}
    assert (result.exit_code, result.protocol_errors) == (0, [])


# The REST routes each pin must use: SDKs before 2.51 create and resume without the /v2 prefix.
ROUTES = {
    NEWEST.name: ("/v2/sandboxes", "/v2/sandboxes/{id}/connect"),
    BEFORE_V2.name: ("/sandboxes", "/sandboxes/{id}/connect"),
}


@pytest.mark.parametrize("spec", [NEWEST, BEFORE_V2], ids=lambda spec: spec.name)
def test_quickstart_passes_every_step_on_the_embedded_endpoint(
    spec: RunnerSpec, endpoint: LocalEndpoint, tmp_path: Path
) -> None:
    log = tmp_path / f"{spec.name}.jsonl"
    with WireProxy(endpoint.api_url, endpoint.sandbox_url, log, spec.name, Redactor([endpoint.api_key])) as proxy:
        env = {"E2B_API_KEY": endpoint.api_key, "E2B_API_URL": proxy.url, "E2B_SANDBOX_URL": proxy.url}
        result = run(spec, {**task(f"e2e-{spec.name}", env), "runner": spec.name})

    version = spec.pins["e2b"]
    hello = {"type": "hello", "protocol": 1, "runner": spec.name, "pins": {"e2b": version}, "language": "js"}
    assert result.hello == hello
    unsupported = [r for r in result.step_results() if r.outcome == "skip" and r.details["skip_reason"] == "sdk_gap"]
    assert all(r.error.startswith("not in this SDK: ") for r in unsupported)
    if spec is NEWEST:
        assert unsupported == []
    assert [(r.id, r.outcome, r.error) for r in result.step_results() if r not in unsupported] == [
        (s, "pass", None) for s in STEP_IDS if s not in {r.id for r in unsupported}
    ]
    assert result.footer is not None and result.footer["cleanup"] == {}
    assert (result.exit_code, result.protocol_errors) == (0, [])
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    sandbox_id = result.steps["ts01_create"]["details"]["sandbox_id"]
    create, connect = (route.format(id=sandbox_id) for route in ROUTES[spec.name])
    posts = [urlsplit(call["url"]).path for call in calls if call["method"] == "POST"]
    assert posts[0] == create
    assert connect in posts
    assert endpoint.api_key not in log.read_text()


def test_a_runner_killed_mid_run_leaves_every_later_step_as_an_error_naming_the_exit(endpoint: LocalEndpoint) -> None:
    from e2b import Sandbox, SandboxQuery

    crash_after = "ts05_run_streaming_onStdout"
    run_id = "crash-midway"

    # One runner process on its own: a run restarts a runner that died for the steps left (the restart and the
    # terminal's line: tests/test_runner_survives.py).
    result = run(NEWEST, task(run_id, endpoint.env(), crash_after=crash_after))

    done = STEP_IDS.index(crash_after) + 1
    died = "runner died before this step: exit code -9; stderr tail: "
    assert outcomes(result) == [(s, "pass", None) for s in STEP_IDS[:done]] + [
        (s, "error", died) for s in STEP_IDS[done:]
    ]
    assert (result.footer, result.exit_code, result.timed_out) == (None, -9, False)
    # The runner could not clean up: its sandbox is still there, findable by the run tag.
    leftovers = Sandbox.list(query=SandboxQuery(metadata={"e2b-bench-run": run_id})).next_items()
    for leftover in leftovers:
        Sandbox.kill(leftover.sandbox_id)
    assert [leftover.sandbox_id for leftover in leftovers] == [result.steps["ts01_create"]["details"]["sandbox_id"]]


SILENCE_S = 15.0  # far above any step's time, even on a loaded machine


def test_a_runner_that_times_out_kills_its_sandbox_on_sigterm(endpoint: LocalEndpoint) -> None:
    from e2b import Sandbox, SandboxQuery

    run_id = "timeout-midway"

    # The runner goes silent for good in ts12; every step before it answers well within the deadline.
    result = run(NEWEST, task(run_id, endpoint.env(), hang_in="ts12_commands_connect"), step_timeout_s=SILENCE_S)

    hung = STEP_IDS.index("ts12_commands_connect")
    assert outcomes(result) == (
        [(s, "pass", None) for s in STEP_IDS[:hung]]
        + [("ts12_commands_connect", "error", f"no answer in {SILENCE_S:g} s in step ts12_commands_connect")]
        + [(s, "error", "not run: runner timed out in ts12_commands_connect") for s in STEP_IDS[hung + 1 :]]
    )
    assert (result.footer, result.exit_code) == (None, 143)
    assert Sandbox.list(query=SandboxQuery(metadata={"e2b-bench-run": run_id})).next_items() == []


def test_an_endpoint_deviation_is_a_fail_naming_what_was_observed() -> None:
    with serving(quirks=Quirks(cwd_override="/workspace", refuse_stdin=True)) as deviating:
        result = run(NEWEST, task("deviating", deviating.env()))

    failed = {r.id: (r.error, r.details) for r in result.step_results() if r.outcome != "pass"}
    assert sorted(failed) == ["ts06_run_envs_cwd", "ts11_send_stdin"]
    cwd_error, cwd_details = failed["ts06_run_envs_cwd"]
    assert cwd_error == 'stdout is "bar-ts06\\n/workspace\\n", expected "bar-ts06\\n/home/user/e2b-bench-ts06\\n"'
    assert cwd_details == {"makeDir": True, "exitCode": 0, "stdout": "bar-ts06\n/workspace\n"}
    stdin_error, stdin_details = failed["ts11_send_stdin"]
    refusal = "[invalid_argument] stdin is not supported: pass input in the command instead"
    assert stdin_error == f"InvalidArgumentError: {refusal}"
    assert stdin_details["raised"] == {"exception": "InvalidArgumentError", "message": refusal}
    assert result.footer is not None and result.footer["cleanup"] == {}
