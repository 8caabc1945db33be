"""The LangChain Deep Agents runner end to end: `create_deep_agent` on langchain-e2b's `AsyncE2BSandbox`.

langchain-e2b 0.0.6 requires deepagents>=0.6,<0.7, so the runner pins deepagents 0.6.12 (the newest
inside that bound) and the e2b that langchain-e2b resolves to. It runs once against the faithful
endpoint and once against `b3os-beta`, with request bodies in the wire log.
"""

from __future__ import annotations

import base64
import re
from pathlib import Path

from framework_cli import (
    SingleRun,
    check_every_case_passes,
    check_the_real_model_switch,
    run_fixture,
    runner_of,
)

from bench.report import render

FAMILY = "deepagents"
PROOF = "/home/user/proof.txt"
STEPS = ["fw01_proof_task", "fw02_exit_code", "fw03_late_output"]


faithful = run_fixture("faithful", FAMILY)


b3os = run_fixture("b3os", FAMILY)


def assert_the_proof_task_passed(run: SingleRun) -> str:
    """The one attempt passed with execute, write_file and read_file; returns the uname line."""
    transcript = run.own_transcript()
    (attempt,) = transcript["attempts"]
    uname = attempt["verdict"]["uname_output"]

    assert uname.startswith("Linux ") and attempt["verdict"]["passed"] is True
    assert [(c["name"], c["arguments"], c["error"]) for c in attempt["tool_calls"]] == [
        ("execute", {"command": "uname -a"}, False),
        ("write_file", {"file_path": PROOF, "content": uname + "\n"}, False),
        ("read_file", {"file_path": PROOF}, False),
    ]
    assert [c["result"] for c in attempt["tool_calls"]] == [
        f"{uname}\n\n[Command succeeded with exit code 0]",
        f"Updated file {PROOF}",
        f"     1\t{uname}",  # numbered lines, as Deep Agents shows a file
    ]
    assert attempt["answer"] == "Linux" and attempt["verify_read"] == {"content": uname + "\n"}
    assert transcript["model_exchanges"][-1]["decision"] == {"answer": "Linux"}
    return str(uname)


# --- the faithful endpoint ----------------------------------------------------------------------------


def test_every_case_passes_against_the_faithful_endpoint(faithful: SingleRun) -> None:
    check_every_case_passes(faithful, faithful.runner)
    assert faithful.steps() == STEPS


def test_the_deep_agent_runs_uname_writes_and_reads_with_its_own_tools(faithful: SingleRun) -> None:
    assert_the_proof_task_passed(faithful)


def test_the_model_is_asked_through_chat_completions_with_the_deep_agent_tools(faithful: SingleRun) -> None:
    transcript = faithful.own_transcript()
    exchanges = transcript["model_exchanges"]
    offered = [tool["function"]["name"] for tool in exchanges[0]["request"]["tools"]]

    assert {e["api"] for e in exchanges} == {"chat.completions"}
    assert {"execute", "write_file", "read_file", "ls", "edit_file", "task"} <= set(offered)
    assert [e["decision"].get("tool") for e in exchanges] == ["execute", "write_file", "read_file", None]
    assert transcript["model"]["scripted"] is True


def test_the_backend_is_langchain_e2b_with_the_pins_it_brought(faithful: SingleRun) -> None:
    transcript = faithful.own_transcript()
    pins = faithful.run.header["pins"][faithful.runner]

    assert transcript["backend"].startswith("upstream: langchain_e2b.AsyncE2BSandbox")
    assert (pins["deepagents"], pins["langchain-e2b"], pins["e2b"]) == ("0.6.12", "0.0.6", "2.63.0")
    assert pins["langchain-openai"] == "1.7.4" and faithful.runner == "deepagents-0.6.12"
    assert set(transcript["cleanup"].values()) == {"already gone"}  # the runner killed each sandbox


def test_the_wire_shows_tagged_creation_python_file_helpers_an_upload_and_the_kills(faithful: SingleRun) -> None:
    transcript = faithful.own_transcript()
    wire = faithful.own_wire()
    creates = faithful.creates()
    commands = [process["args"][-1] for process in faithful.processes()]
    helpers = [re.search(r"b64decode\('([^']+)'\)", c) for c in commands if c.startswith('python3 -c "')]

    assert len(creates) == 2 == len(transcript["sandboxes"])
    for create in creates:
        # Importing langchain_e2b tags the SDK's traffic with its own version string (0.0.5 in 0.0.6).
        assert create["status"] == 201
        assert create["request_headers"]["user-agent"] == "e2b-python-sdk/2.63.0 langchain-e2b/0.0.5"
        assert create["body"]["metadata"] == {"e2b-bench-run": faithful.run.header["run_id"]}
        assert create["body"]["templateID"] == "base"
    # write_file: a python3 preflight for the path, then an upload; read_file: a python3 reader.
    assert commands[0] == "uname -a" and commands[-2:] == ["exit 5", "sleep 1; echo late"]
    assert [base64.b64decode(m[1]).decode() for m in helpers if m] == [PROOF, PROOF]
    assert [e["status"] for e in wire if e["method"] == "POST" and "/files?" in e["url"]] == [200]
    # The upload stats the path first (absent: 404); the verify read stats it again (200), then downloads it.
    assert [e["status"] for e in wire if e["url"].endswith("Filesystem/Stat")] == [404, 200]
    for sandbox_id in transcript["sandboxes"]:
        deletes = [e["status"] for e in wire if e["method"] == "DELETE" and e["url"].endswith(f"/{sandbox_id}")]
        assert deletes[0] == 204, deletes


def test_the_probes_see_exit_code_5_and_the_late_output(faithful: SingleRun) -> None:
    probes = faithful.own_transcript()["probes"]

    assert (probes["fw02_exit_code"]["exit_code"], probes["fw02_exit_code"]["stdout"]) == (5, "")
    assert (probes["fw03_late_output"]["exit_code"], probes["fw03_late_output"]["stdout"]) == (0, "late\n")


# --- the b3os-beta profile ----------------------------------------------------------------------------


def test_on_b3os_beta_every_case_passes(b3os: SingleRun) -> None:
    cases = b3os.cases()

    assert b3os.run.header["endpoint"]["name"] == "local-b3os-beta"
    assert b3os.done.returncode == 0, b3os.done.stdout[-3000:]
    assert [(c.case, c.outcome, c.conformant) for c in cases] == [(step, "pass", True) for step in STEPS]


def test_on_b3os_beta_foreground_commands_with_absolute_paths_are_unharmed(b3os: SingleRun) -> None:
    uname = assert_the_proof_task_passed(b3os)

    # The profile's own sandbox ids (sbx-...) show the run really went there.
    assert uname.split()[1].startswith("sbx-")
    assert all(sandbox_id.startswith("sbx-") for sandbox_id in b3os.own_transcript()["sandboxes"])
    # Every command names /home/user as its cwd; the login profile's cd to /workspace does not matter
    # because every path the backend passes is absolute.
    starts = b3os.processes()
    assert {p["cwd"] for p in starts} == {"/home/user"} and {p["cmd"] for p in starts} == {"/bin/bash"}


def test_the_report_puts_both_profiles_side_by_side(faithful: SingleRun, b3os: SingleRun, tmp_path: Path) -> None:
    summary = render([faithful.run.path, b3os.run.path], tmp_path).markdown.read_text()

    assert f"env · {faithful.runner}" in summary and f"local-b3os-beta · {b3os.runner}" in summary


# --- the real-model switch ----------------------------------------------------------------------------


def test_the_real_model_switch_reaches_chat_openai_with_url_name_and_key(
    tmp_path: Path, served: dict[str, str]
) -> None:
    done, model = check_the_real_model_switch(tmp_path, runner_of(FAMILY), requests=4, served=served)

    assert done.transcript(runner_of(FAMILY))["attempts"][0]["answer"] == "Linux"
    # The harness's reachability check asks for /models without a key; the agent's every turn has the key.
    assert [(method, path.removeprefix("/real")) for method, path, _ in model.requests] == [
        ("GET", "/v1/models"),
        *[("POST", "/v1/chat/completions")] * 4,
    ]
