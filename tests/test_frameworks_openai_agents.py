"""The OpenAI Agents SDK runner end to end: a SandboxAgent on the SDK's own E2B sandbox backend.

The runner (frameworks/openai-agents/) brings the SDK's `e2b` extra, so its sandboxes are made by the
e2b 2.31.0 it pins. It runs once against the faithful endpoint and once against `b3os-beta`, with
request bodies in the wire log; the tests read the cases, the transcript and the wire log.
"""

from __future__ import annotations

from pathlib import Path

from framework_cli import (
    SingleRun,
    check_every_case_passes,
    check_the_real_model_switch,
    run_fixture,
    runner_of,
)

from bench.report import render

FAMILY = "openai-agents"
PROOF = "/home/user/proof.txt"
AUTO_RESUME_REFUSED = "400: unsupported_option: 'lifecycle.autoResume' is not supported by this endpoint"


faithful = run_fixture("faithful", FAMILY)


b3os = run_fixture("b3os", FAMILY)


# --- the faithful endpoint ----------------------------------------------------------------------------


def test_every_case_passes_against_the_faithful_endpoint(faithful: SingleRun) -> None:
    check_every_case_passes(faithful, faithful.runner)
    assert faithful.steps() == ["fw01_proof_task", "fw02_exit_code", "fw03_late_output"]


def test_the_sandbox_agent_runs_each_step_through_exec_command_and_answers_linux(faithful: SingleRun) -> None:
    transcript = faithful.own_transcript()
    (attempt,) = transcript["attempts"]
    uname = attempt["verdict"]["uname_output"]
    calls = attempt["tool_calls"]

    assert uname.startswith("Linux ") and attempt["verdict"]["passed"] is True
    assert [(c["name"], c["arguments"]) for c in calls] == [
        ("exec_command", {"cmd": "uname -a"}),
        ("exec_command", {"cmd": f"printf '%s\\n' '{uname}' > {PROOF}"}),
        ("exec_command", {"cmd": f"cat {PROOF}"}),
    ]
    # The tool's own result format: a header (chunk id, wall time, exit code), then `Output:`.
    for call, output in zip(calls, [uname + "\n", "", uname + "\n"], strict=True):
        assert call["result"].startswith("Chunk ID: ") and not call["error"]
        assert call["result"].endswith(f"\nProcess exited with code 0\nOutput:\n{output}")
    assert attempt["answer"] == "Linux" and attempt["verify_read"] == {"content": uname + "\n"}
    assert set(transcript["cleanup"].values()) == {"already gone"}  # the session's shutdown killed it


def test_the_model_is_asked_through_the_streamed_responses_api_with_the_sandbox_tools(faithful: SingleRun) -> None:
    transcript = faithful.own_transcript()
    exchanges = transcript["model_exchanges"]
    offered = {tool["name"]: tool["type"] for tool in exchanges[0]["request"]["tools"]}

    assert {(e["api"], e["stream"]) for e in exchanges} == {("responses", True)}
    assert [e["decision"].get("tool") for e in exchanges] == ["exec_command"] * 3 + [None]
    assert exchanges[-1]["decision"] == {"answer": "Linux"}
    assert offered["exec_command"] == "function" and offered["apply_patch"] == "custom"
    assert transcript["model"]["scripted"] is True


def test_the_backend_is_the_sdks_own_and_brings_its_own_e2b_pins(faithful: SingleRun) -> None:
    transcript = faithful.own_transcript()
    pins = faithful.run.header["pins"][faithful.runner]

    assert transcript["backend"].startswith("upstream: agents.extensions.sandbox.e2b.E2BSandboxClient")
    assert (pins["openai-agents"], pins["e2b"], pins["e2b-code-interpreter"]) == ("0.24.0", "2.31.0", "2.8.1")
    assert faithful.runner == "openai-agents-0.24.0"


def test_each_sandbox_is_created_tagged_on_base_by_e2b_2_31_and_deleted(faithful: SingleRun) -> None:
    transcript = faithful.own_transcript()
    wire = faithful.own_wire()
    creates = faithful.creates()
    run_id = faithful.run.header["run_id"]

    assert len(creates) == 2 == len(transcript["sandboxes"])  # the proof task's session, the probes' session
    for create in creates:
        assert create["status"] == 201 and create["request_headers"]["user-agent"] == "e2b-python-sdk/2.31.0"
        assert create["body"]["templateID"] == "base" and create["body"]["metadata"] == {"e2b-bench-run": run_id}
        # The client's defaults (on_timeout="pause", auto_resume=True) reach the wire as lifecycle options.
        assert (create["body"]["autoPause"], create["body"]["autoResume"]) == (True, {"enabled": True})
    assert any("process.Process/Start" in e["url"] for e in wire)
    for sandbox_id in transcript["sandboxes"]:
        deletes = [e["status"] for e in wire if e["method"] == "DELETE" and e["url"].endswith(f"/{sandbox_id}")]
        assert deletes[0] == 204, deletes


def test_exec_command_runs_each_model_command_through_sh_lc_in_the_workspace_root(faithful: SingleRun) -> None:
    uname = faithful.own_transcript()["attempts"][0]["verdict"]["uname_output"]
    processes = faithful.processes()
    commands = [p["args"] for p in processes]
    write = "printf '\"'\"'%s\\n'\"'\"' '\"'\"'" + uname + "'\"'\"' > " + PROOF

    # Starting the session: the workspace root is checked, made through a command run from /, then used as cwd.
    assert commands[:2] == [["-l", "-c", "test -d /home/user"], ["-l", "-c", "mkdir -p -- /home/user"]]
    assert processes[1]["cwd"] == "/"
    # The model's commands: exec_command's default login shell, `sh -lc`, inside bash -l, in the workspace root.
    model_commands = [p for p in processes if p["args"][-1].startswith("sh -lc ")]
    assert [p["args"][-1] for p in model_commands] == [
        "sh -lc 'uname -a'",
        f"sh -lc '{write}'",
        f"sh -lc 'cat {PROOF}'",
        "sh -lc 'exit 5'",
        "sh -lc 'sleep 1; echo late'",
    ]
    assert {(p["cmd"], p["cwd"]) for p in model_commands} == {("/bin/bash", "/home/user")}


def test_the_probes_see_exit_code_5_and_the_late_output(faithful: SingleRun) -> None:
    probes = faithful.own_transcript()["probes"]

    assert probes["fw02_exit_code"] == {"command": "exit 5", "exit_code": 5, "stdout": "", "stderr": ""}
    assert probes["fw03_late_output"] == {
        "command": "sleep 1; echo late",
        "exit_code": 0,
        "stdout": "late\n",
        "stderr": "",
    }


# --- the b3os-beta profile ----------------------------------------------------------------------------


def test_on_b3os_beta_every_case_fails_as_declared(b3os: SingleRun) -> None:
    cases = b3os.cases()

    assert b3os.run.header["endpoint"]["name"] == "local-b3os-beta"
    assert b3os.done.returncode == 0, b3os.done.stdout[-3000:]
    assert [(c.case, c.outcome, c.conformant) for c in cases] == [(step, "fail", True) for step in b3os.steps()]
    assert all(c.conformant for c in b3os.run.cases)


def test_on_b3os_beta_the_clients_default_auto_resume_is_refused_so_no_sandbox_ever_runs(b3os: SingleRun) -> None:
    transcript = b3os.own_transcript()
    creates = b3os.creates()

    for step in b3os.steps():
        assert AUTO_RESUME_REFUSED in b3os.own_case(step).error
    assert [a["error"] for a in transcript["attempts"]] == [f"SandboxException: {AUTO_RESUME_REFUSED}"] * 2
    assert all(a["tool_calls"] == [] and a["answer"] is None for a in transcript["attempts"])
    assert transcript["model_exchanges"] == [] and transcript["sandboxes"] == []
    # Two attempts and the two probes each tried to create one; nothing else reached the endpoint.
    assert len(creates) == 4 == len(b3os.own_wire())
    for create in creates:
        assert create["status"] == 400 and create["body"]["autoResume"] == {"enabled": True}
        assert AUTO_RESUME_REFUSED.removeprefix("400: ") in create["response_body"]


def test_the_report_puts_both_profiles_side_by_side_with_the_refusal(
    faithful: SingleRun, b3os: SingleRun, tmp_path: Path
) -> None:
    summary = render([faithful.run.path, b3os.run.path], tmp_path).markdown.read_text()

    assert f"env · {faithful.runner}" in summary and f"local-b3os-beta · {b3os.runner}" in summary
    assert "lifecycle.autoResume" in summary


# --- the real-model switch ----------------------------------------------------------------------------


def test_the_real_model_switch_reaches_the_agents_responses_client_with_url_name_and_key(
    tmp_path: Path, served: dict[str, str]
) -> None:
    done, model = check_the_real_model_switch(tmp_path, runner_of(FAMILY), requests=4, served=served)

    assert done.transcript(runner_of(FAMILY))["attempts"][0]["answer"] == "Linux"
    # The harness's reachability check asks for /models without a key; the agent's every turn has the key.
    assert [(method, path.removeprefix("/real")) for method, path, _ in model.requests] == [
        ("GET", "/v1/models"),
        *[("POST", "/v1/responses")] * 4,
    ]
