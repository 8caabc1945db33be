"""A case leaves nothing behind: the runner kits' checks between steps (sandboxes/e2b/python/hygiene.py,
sandboxes/e2b/ts/hygiene.mjs) against the embedded endpoint.

Each step's `details.hygiene` carries what the kit saw: envd's own process list of every shared sandbox after the
step (a path of its own, beside the SDK calls the case made), what the step left running, the shared sandboxes
replaced before it and the sandboxes it made for itself, killed when it ended. The tests check the sandboxes the
kit says it killed through the REST API at the moment the step is reported.
"""

from __future__ import annotations

import io
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from bench.localbox.quirks import build
from bench.localbox.server import LocalEndpoint, serving
from bench.runners.catalog import available_runners
from bench.runners.manifest import load_steps, task_steps
from bench.runners.protocol import Event, RunnerResult, make_task, run_runner
from bench.triage.console import Console
from bench.triage.hygiene import hygiene_lines

REPO = Path(__file__).resolve().parents[1]
PY, JS = "py-e2b-2.63.0", "js-e2b-2.51.0"
# The behaviours that start commands, ptys and streams on their flavour's shared sandbox (the ones that left
# commands running on an endpoint whose streams misbehaved), and two that make sandboxes of their own.
PROCESS_BEHAVIOURS = ("run_streams", "run_timeout", "background_list_kill", "stdin", "stream_input",
                      "connect_command", "pty_resize_kill", "pty_connect_input")  # fmt: skip
OWN_SANDBOXES = ("create_envs_metadata", "kill_cuts_stream")


def step_ids(runner: str, names: tuple[str, ...]) -> list[str]:
    table = available_runners()[runner].table("behaviours")
    assert table is not None
    known = {step.id for step in load_steps("behaviours", table)}
    prefixes = ("sync_", "async_") if runner == PY else ("js_",)
    return [f"{prefix}{name}" for prefix in prefixes for name in names if f"{prefix}{name}" in known]


def run(endpoint: LocalEndpoint, runner_name: str, steps: list[str], **options: Any) -> tuple[RunnerResult, dict]:
    """Run `steps` of the behaviours suite; returns the result and, per step, what REST said at its report about
    each sandbox its hygiene says was killed (replaced or ended)."""
    runner = available_runners()[runner_name]
    table = runner.table("behaviours")
    assert table is not None
    planned = task_steps(load_steps("behaviours", table), steps)
    task = make_task("behaviours", runner_name, f"hygiene-{runner_name}", steps=planned["steps"],
                     depends=planned["depends"], env=endpoint.env(), options=options)  # fmt: skip
    seen: dict[str, dict[str, int]] = {}

    def on_event(event: Event) -> None:
        report = (event.get("details") or {}).get("hygiene") or {}
        if event.get("type") != "step" or not report:
            return
        killed = [*(report.get("sandboxes_ended") or {}), *(item["sandbox"] for item in report.get("replaced", []))]
        with httpx.Client(base_url=endpoint.api_url, headers={"X-API-KEY": endpoint.api_key}) as client:
            seen[event["id"]] = {sid: client.get(f"/sandboxes/{sid}").status_code for sid in killed}

    result = run_runner(runner.for_suite("behaviours"), runner.prepare(), task, step_timeout_s=120,
                        env=runner.environment(endpoint.env()), on_event=on_event)  # fmt: skip
    return result, seen


def hygiene(result: RunnerResult, step: str) -> dict[str, Any]:
    return dict(result.steps[step]["details"].get("hygiene") or {})


@pytest.mark.parametrize("runner", [PY, JS])
def test_no_behaviour_leaves_a_process_on_its_shared_sandbox_and_own_sandboxes_die_with_their_case(
    endpoint: LocalEndpoint, runner: str
) -> None:
    steps = step_ids(runner, PROCESS_BEHAVIOURS + OWN_SANDBOXES)

    # Sandboxes given 145 s: a host read as ~1.2x slow, so every bound the kit scales is a fraction.
    result, seen = run(endpoint, runner, steps, census=True, sandbox_timeout_s=145)

    assert [(s, result.steps[s]["outcome"]) for s in steps] == [(s, "pass") for s in steps]
    for step in steps:
        report = hygiene(result, step)
        # envd's process list of each shared sandbox after the step (one exists once a step made it): nothing of
        # the case's is left.
        shared = step in step_ids(runner, PROCESS_BEHAVIOURS)
        assert set(report.get("census", {0: 0}).values()) == {0} and (report.get("census") or not shared), report
        assert not {"left_behind", "replaced", "kept", "crawl", "fault"} & report.keys(), (step, report)
    ended = {step: hygiene(result, step).get("sandboxes_ended") for step in step_ids(runner, OWN_SANDBOXES)}
    assert all(ended.values()), ended
    # Each was gone from the REST API when its case was reported, not at the runner's end.
    assert {step: set(seen[step].values()) for step in ended} == {step: {404} for step in ended}
    assert result.footer is not None and len(result.footer["cleanup"]) == (2 if runner == PY else 1)


@pytest.mark.parametrize("runner", [PY, JS])
def test_a_case_that_leaves_a_command_running_gets_its_sandbox_replaced_before_the_next_and_is_named(
    endpoint: LocalEndpoint, runner: str
) -> None:
    steps = step_ids(runner, ("run_streams", "run_exit_code", "stdin"))
    poisoner, victim = steps[0], steps[1]

    result, seen = run(endpoint, runner, steps, leave_after=poisoner, census=True)

    assert [(s, result.steps[s]["outcome"]) for s in steps] == [(s, "pass") for s in steps]
    (replaced,) = hygiene(result, victim)["replaced"]
    old = hygiene(result, poisoner)["census"]
    assert replaced["left_by"] == poisoner and replaced["sandbox"] in old and replaced["killed"] == "killed"
    assert replaced["reason"].startswith("left running: ") and "sleep 600" in replaced["reason"]
    assert seen[victim] == {replaced["sandbox"]: 404}
    # The next case ran on a fresh sandbox, which holds nothing after it.
    fresh = hygiene(result, victim)["census"]
    assert replaced["sandbox"] not in fresh and set(fresh.values()) == {0}
    line = (
        f"sandbox {replaced['sandbox']} held what case behaviours/{runner}/{poisoner} left "
        f"({replaced['reason'].removeprefix('left running: ')}): replaced it before case behaviours/{runner}/{victim}"
    )
    assert hygiene_lines("behaviours", runner, result.steps[victim]) == [line]
    # The run's terminal says it as the case is reported.
    terminal = io.StringIO()
    console = Console(stream=terminal, tty=False)
    for step in steps:
        console.step_reported("behaviours", runner, result.steps[step])
    assert terminal.getvalue() == f"e2b-bench: {line}\n"


def watched_sandbox() -> tuple[Any, dict[str, Any], Any]:
    """A real sandbox of the endpoint, shared under the watch of the Python kit's checks (`hygiene.Hygiene`):
    the sandbox, the holder its replacement goes to, the kit."""
    from e2b import Sandbox

    sys.path.insert(0, str(REPO / "sandboxes" / "e2b" / "python"))
    from hygiene import Hygiene  # type: ignore[import-not-found]

    sandbox = Sandbox.create(timeout=120, metadata={"test": "hygiene"})
    holder = {"shared": sandbox}
    kit = Hygiene(1.0, set(), lambda sid: "killed" if Sandbox.kill(sid) else "already gone")
    kit.watch(sandbox.sandbox_id, lambda: holder.get("shared"), lambda: holder.pop("shared", None))
    return sandbox, holder, kit


def test_steps_that_keep_timing_out_on_a_shared_sandbox_replace_it_and_say_since_when(endpoint: LocalEndpoint) -> None:
    """The kit's count, fed the results of steps that hit the SDK's timeout, on a real sandbox of the endpoint."""
    from e2b import Sandbox, SandboxException

    sandbox, holder, kit = watched_sandbox()
    from hygiene import CRAWL_IN_A_ROW  # type: ignore[import-not-found]

    timeout = ("fail", "TimeoutException: context deadline exceeded", {"raised": {"exception": "TimeoutException"}})
    reports = []
    # A check named `timeout` that failed is no timeout; a pass ends a run of timeouts too.
    other = ("fail", "timeout: got 1, expected 2", {})
    steps = [timeout, ("pass", None, {}), timeout, other, *[timeout] * 3]
    try:
        for number, (outcome, error, details) in enumerate(steps, 1):
            kit.before(f"s{number}", 0)
            reports.append(kit.after(f"s{number}", outcome, error, details, 1.0, [], set()))
    finally:
        Sandbox.kill(sandbox.sandbox_id)

    assert CRAWL_IN_A_ROW == 3
    assert [report.get("crawl") for report in reports] == [None] * 6 + [
        [{"sandbox": sandbox.sandbox_id, "since": "s5", "in_a_row": 3, "replaced": True, "killed": "killed"}]
    ]
    assert holder == {}
    with pytest.raises(SandboxException):
        Sandbox.get_info(sandbox.sandbox_id)
    event = {"type": "step", "id": "s7", "details": {"hygiene": reports[-1]}}
    assert hygiene_lines("behaviours", PY, event) == [
        f"cases on sandbox {sandbox.sandbox_id} keep timing out since case behaviours/{PY}/s5 (3 in a row): "
        "replacing it"
    ]


@pytest.mark.parametrize("runner", [PY, JS])
def test_an_envd_that_refuses_the_process_list_keeps_its_shared_sandbox_and_says_it_goes_unchecked(
    runner: str,
) -> None:
    steps = step_ids(runner, ("run_streams", "run_exit_code", "stdin"))

    with serving(quirks=build("e2b", ["unavailable_route=POST /process.Process/List"])) as endpoint:
        result, _ = run(endpoint, runner, steps, leave_after=steps[0])

    assert [(s, result.steps[s]["outcome"]) for s in steps] == [(s, "pass") for s in steps]
    reports = {step: hygiene(result, step) for step in steps}
    said = [(step, item) for step, report in reports.items() for item in report.get("unlisted", [])]
    # Said once per shared sandbox (one per client flavour), on the first case that used it; never replaced for it.
    flavours = 2 if runner == PY else 1
    assert len({item["sandbox"] for _, item in said}) == len(said) == flavours
    assert all(item["reason"].startswith("List: HTTP 503: ") for _, item in said)
    assert all(report.keys() <= {"unlisted"} for report in reports.values())
    step, unlisted = said[0]
    assert step == steps[0]
    assert hygiene_lines("behaviours", runner, result.steps[step]) == [
        f"sandbox {unlisted['sandbox']} gives no list of its processes ({unlisted['reason']}): "
        "what cases leave on it goes unchecked"
    ]


def test_a_shared_sandbox_the_endpoint_no_longer_has_is_replaced_before_the_next_step(endpoint: LocalEndpoint) -> None:
    from e2b import Sandbox

    sandbox, holder, kit = watched_sandbox()
    kit.after("s1", "pass", None, {}, 1.0, [], set())
    Sandbox.kill(sandbox.sandbox_id)  # behind the kit's back: it expired, or the endpoint lost it

    report = kit.before("s2", 0)

    (replaced,) = report["replaced"]
    assert (replaced["sandbox"], replaced["left_by"], replaced["killed"]) == (sandbox.sandbox_id, "s1", "already gone")
    assert replaced["reason"].startswith("gone: List: HTTP ")
    assert holder == {} and report.keys() == {"replaced"}


@pytest.mark.parametrize("runner", [PY, JS])
def test_a_command_a_case_leaves_running_is_ended_when_the_case_ends_and_the_case_is_named(
    endpoint: LocalEndpoint, runner: str
) -> None:
    steps = step_ids(runner, ("run_streams", "run_exit_code"))
    leaver = steps[0]

    result, _ = run(endpoint, runner, steps, leave_in=leaver, census=True)

    assert [(s, result.steps[s]["outcome"]) for s in steps] == [(s, "pass") for s in steps]
    report = hygiene(result, leaver)
    (left,) = report["left_behind"]
    (shared,) = report["census"]
    assert (left["sandbox"], left["command"], left["ended"]) == (shared, "/bin/bash -l -c sleep 600", True)
    # Ended before the case was reported: envd's list after it holds nothing, and the next case keeps the sandbox.
    assert report["census"] == {shared: 0}
    assert hygiene(result, steps[1]) == {"census": {shared: 0}}
    assert hygiene_lines("behaviours", runner, result.steps[leaver]) == [
        f"case behaviours/{runner}/{leaver} left 1 command(s) running on sandbox {shared}: "
        f"/bin/bash -l -c sleep 600 (pid {left['pid']}); ended them"
    ]
