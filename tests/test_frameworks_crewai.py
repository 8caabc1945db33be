"""CrewAI end to end: an Agent + Task + Crew with crewai-tools' E2B tools, attached to one sandbox.

CrewAI calls the scripted model through its native OpenAI provider with function tools (the three E2B
tools, names sanitized); the tools run on the SDKs crewai-tools pins (e2b 2.20, e2b-code-interpreter
2.6), whose `Sandbox.connect` sends no sandbox id header: the endpoint finds the sandbox by its
access token. Against the faithful endpoint, `b3os-beta`, and a model given with `--model-base-url`.
"""

from __future__ import annotations

import json
from pathlib import Path

from framework_cli import (
    SingleRun,
    check_every_case_passes,
    check_the_real_model_switch,
    run_fixture,
    runner_of,
)

from bench.model import PROOF_PATH

RUNNER = runner_of("crewai")
TOOLS = {"e2b_sandbox_exec", "e2b_sandbox_files", "e2b_sandbox_python"}
ENVD = ("process.Process/", "filesystem.Filesystem/", "/files?")


faithful = run_fixture("faithful", "crewai")


b3os = run_fixture("b3os", "crewai")


def test_crewai_passes_every_case_against_the_faithful_endpoint(faithful: SingleRun) -> None:
    check_every_case_passes(faithful, faithful.runner)


def test_the_crew_runs_uname_with_the_exec_tool_and_writes_and_reads_with_the_file_tool(
    faithful: SingleRun,
) -> None:
    transcript = faithful.own_transcript()

    (attempt,) = transcript["attempts"]
    uname = attempt["verdict"]["uname_output"]
    calls = attempt["tool_calls"]
    assert uname.startswith("Linux ") and attempt["verdict"]["passed"] is True
    assert [(c["name"], c["arguments"]) for c in calls] == [
        ("e2b_sandbox_exec", {"command": "uname -a"}),
        ("e2b_sandbox_files", {"action": "write", "path": PROOF_PATH, "content": uname + "\n"}),
        ("e2b_sandbox_files", {"action": "read", "path": PROOF_PATH}),
    ]
    assert [json.loads(c["result"]) for c in calls] == [
        {"exit_code": 0, "stdout": uname + "\n", "stderr": "", "error": ""},
        {"status": "written", "path": PROOF_PATH, "bytes": len(uname) + 1},
        {"path": PROOF_PATH, "encoding": "utf-8", "content": uname + "\n"},
    ]
    assert attempt["answer"] == "Linux" and attempt["verify_read"] == {"content": uname + "\n"}
    assert set(transcript["cleanup"].values()) == {"already gone"}  # each session killed its sandbox


def test_crewai_calls_the_model_with_native_function_tools(faithful: SingleRun) -> None:
    exchanges = faithful.own_transcript()["model_exchanges"]

    assert [e["decision"].get("tool") for e in exchanges] == [
        "e2b_sandbox_exec",
        "e2b_sandbox_files",
        "e2b_sandbox_files",
        None,
    ]
    assert exchanges[-1]["decision"] == {"answer": "Linux"}
    for exchange in exchanges:
        assert {t["function"]["name"] for t in exchange["request"]["tools"]} == TOOLS


def test_the_backend_is_crewai_tools_and_the_header_pins_the_old_sdks_it_brought(faithful: SingleRun) -> None:
    transcript = faithful.own_transcript()
    pins = faithful.run.header["pins"][RUNNER]

    assert transcript["backend"].startswith("upstream: crewai_tools.tools.e2b_sandbox_tool E2BExecTool + E2BFileTool")
    assert transcript["sandbox_tagging"].startswith("metadata {'e2b-bench-run'")
    assert (pins["crewai"], pins["crewai-tools"]) == ("1.15.30", "1.15.30")
    assert (pins["e2b"], pins["e2b-code-interpreter"]) == ("2.20.3", "2.6.2")


def test_the_tools_attach_by_connect_and_their_envd_requests_carry_no_sandbox_id(faithful: SingleRun) -> None:
    wire = faithful.own_wire()
    creates = [e for e in wire if e["method"] == "POST" and e["url"].endswith("/sandboxes")]
    connects = [e for e in wire if e["url"].endswith("/connect")]
    envd = [e for e in wire if any(part in e["url"] for part in ENVD)]

    assert [json.loads(e["request_body"])["templateID"] for e in creates] == ["code-interpreter-v1"] * 2
    assert {e["request_headers"]["user-agent"] for e in creates + connects} == {"e2b-python-sdk/2.20.3"}
    # one connect per tool call: three by the agent, the verify read, two probes
    assert [(e["method"], e["status"]) for e in connects] == [("POST", 200)] * 6
    assert envd and not [e for e in envd if "e2b-sandbox-id" in e["request_headers"]]
    assert all(e["request_headers"]["x-access-token"] for e in envd)
    start, make_dir, files = "process.Process/Start", "filesystem.Filesystem/MakeDir", "/files?"
    assert [(e["method"], next(p for p in (start, make_dir, files) if p in e["url"]), e["status"]) for e in envd] == [
        ("POST", start, 200),  # uname -a
        ("POST", make_dir, 409),  # the file tool makes the parent directory first: /home/user exists
        ("POST", files, 200),  # the write
        ("GET", files, 200),  # the agent's read
        ("GET", files, 200),  # the verify read
        ("POST", start, 200),  # exit 5
        ("POST", start, 200),  # sleep 1; echo late
    ]


def test_the_probes_see_exit_5_through_the_sdk_s_exception_and_the_late_output(faithful: SingleRun) -> None:
    exit_code = faithful.own_case("fw02_exit_code").details
    late = faithful.own_case("fw03_late_output").details

    assert (exit_code["exit_code"], exit_code["stdout"], exit_code["stderr"]) == (5, "", "")
    assert (late["exit_code"], late["stdout"]) == (0, "late\n")


def test_on_b3os_beta_crewai_passes_its_commands_run_in_the_foreground(b3os: SingleRun) -> None:
    transcript = b3os.own_transcript()

    assert b3os.run.header["endpoint"]["name"] == "local-b3os-beta" and b3os.done.returncode == 0, b3os.output()
    assert {(c.outcome, c.conformant) for c in b3os.cases()} == {("pass", True)}
    assert all(sandbox.startswith("sbx-") for sandbox in transcript["sandboxes"])  # the profile's ids
    assert b3os.own_case("fw02_exit_code").details["exit_code"] == 5


def test_a_model_given_by_url_drives_the_crew_and_its_key_never_reaches_disk(
    tmp_path: Path, served: dict[str, str]
) -> None:
    done, _ = check_the_real_model_switch(tmp_path, RUNNER, requests=4, served=served)

    assert done.transcript(RUNNER)["attempts"][0]["answer"] == "Linux"
