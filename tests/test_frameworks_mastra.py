"""The Mastra runner end to end: a Mastra Agent whose Workspace sandbox is @mastra/e2b's E2BSandbox.

It runs against the faithful embedded endpoint, against `b3os-beta`, and with a real-model switch (the
scripted model served on its own and named with `--model-base-url`); the tests read what each run
recorded. The first run builds the runner's Node environment (npm); later runs reuse it.
"""

from __future__ import annotations

import json
from pathlib import Path

from framework_cli import (
    LATE_OUTPUT,
    PROOF,
    FrameworkRun,
    check_every_case_passes,
    check_judged_by_b3os_declarations,
    check_the_real_model_switch,
    run_fixture,
    runner_of,
)

MASTRA = runner_of("mastra")
EXECUTE = "mastra_workspace_execute_command"
STDIN_REFUSED = "[invalid_argument] stdin is not supported: pass input in the command instead"


faithful = run_fixture("faithful", "mastra")
b3os = run_fixture("b3os", "mastra")


# --- the faithful endpoint ----------------------------------------------------------------------------


def test_mastra_passes_every_case_against_the_faithful_endpoint(faithful: FrameworkRun) -> None:
    check_every_case_passes(faithful, MASTRA)


def test_the_agent_runs_uname_writes_and_reads_through_mastra_s_execute_command_tool(faithful: FrameworkRun) -> None:
    transcript = faithful.transcript(MASTRA)

    (attempt,) = transcript["attempts"]
    uname = attempt["verdict"]["uname_output"]
    assert attempt["verdict"] == {"passed": True, "uname_output": uname, "answer_word": "Linux", "problems": []}
    assert uname.startswith("Linux ") and uname.endswith(" GNU/Linux")
    # No workspace filesystem, no file tools: the write and the read go through the shell tool too.
    assert [(c["name"], c["arguments"], c["result"], c["error"]) for c in attempt["tool_calls"]] == [
        (EXECUTE, {"command": "uname -a"}, uname + "\n", False),
        (EXECUTE, {"command": f"printf '%s\\n' '{uname}' > {PROOF}"}, "(no output)", False),
        (EXECUTE, {"command": f"cat {PROOF}"}, uname + "\n", False),
    ]
    assert attempt["answer"] == "Linux" and attempt["verify_read"] == {"content": uname + "\n"}
    assert transcript["model"]["scripted"] is True
    assert set(transcript["cleanup"].values()) == {"already gone"}  # every workspace destroyed its sandbox


def test_the_model_exchange_offers_mastra_s_sandbox_tools_and_ends_in_the_answer(faithful: FrameworkRun) -> None:
    exchanges = faithful.transcript(MASTRA)["model_exchanges"]

    assert [e["api"] for e in exchanges] == ["chat.completions"] * 4
    assert exchanges[0]["client"].startswith("ai-sdk-openai-compatible/3.0.92 ")
    offered = [t["function"]["name"] for t in exchanges[0]["request"]["tools"]]
    assert offered == [EXECUTE, "mastra_workspace_get_process_output", "mastra_workspace_kill_process"]
    assert [e["decision"] for e in exchanges][-1] == {"answer": "Linux"}


def test_the_probes_see_exit_code_5_and_late_output_through_e2b_sandbox_execute_command(faithful: FrameworkRun) -> None:
    probes = faithful.transcript(MASTRA)["probes"]

    assert probes["fw02_exit_code"] == {"command": "exit 5", "exit_code": 5, "stdout": "", "stderr": "exit status 5"}
    assert probes["fw03_late_output"] == LATE_OUTPUT


def test_the_transcript_names_the_upstream_backend_and_the_header_pins_what_mastra_brought(
    faithful: FrameworkRun,
) -> None:
    pins = faithful.run.header["pins"][MASTRA]

    assert faithful.transcript(MASTRA)["backend"].startswith("upstream: @mastra/e2b E2BSandbox")
    assert MASTRA == "mastra-0.8.0"
    assert (pins["@mastra/e2b"], pins["@mastra/core"], pins["e2b"]) == ("0.8.0", "1.71.0", "2.51.0")
    assert pins["@ai-sdk/openai-compatible"] == "3.0.92" and pins["node"].startswith("v")


def test_the_wire_log_has_the_sandbox_lookup_creation_commands_and_the_verify_read(faithful: FrameworkRun) -> None:
    wire = faithful.wire(MASTRA)
    requests = [(e["method"], e["url"].split("/", 3)[3], e["status"]) for e in wire]
    sandboxes = faithful.transcript(MASTRA)["sandboxes"]

    # E2BSandbox.start() first looks for a sandbox already tagged with its logical id, then creates one.
    lookups = [path for method, path, _ in requests if method == "GET" and path.startswith("v2/sandboxes?")]
    assert len(lookups) == len(sandboxes) == 2
    assert all("metadata=mastra-sandbox-id%3D" in path and "state=running,paused" in path for path in lookups)
    assert [s for m, p, s in requests if m == "POST" and p == "v2/sandboxes"] == [201, 201]
    assert sum(1 for m, p, s in requests if m == "POST" and p == "process.Process/Start" and s == 200) == 5
    assert ("GET", "files?path=%2Fhome%2Fuser%2Fproof.txt", 200) in requests


# --- the b3os-beta profile ----------------------------------------------------------------------------


def test_b3os_beta_refuses_every_mastra_command_and_the_run_conforms_by_its_declarations(b3os: FrameworkRun) -> None:
    check_judged_by_b3os_declarations(b3os)
    for step, command in (("fw02_exit_code", "exit 5"), ("fw03_late_output", "sleep 1; echo late")):
        case = b3os.case(MASTRA, step)
        # E2BProcessManager.spawn runs every command with stdin: true, which the profile refuses.
        assert (case.outcome, case.details) == ("fail", {"raised": f"InvalidArgumentError: {STDIN_REFUSED}"})
        assert case.error == f"`{command}` raised InvalidArgumentError: {STDIN_REFUSED}"


def test_on_b3os_beta_the_agent_gets_the_refusal_as_tool_output_and_the_proof_fails(b3os: FrameworkRun) -> None:
    proof = b3os.case(MASTRA, "fw01_proof_task")
    attempts = b3os.transcript(MASTRA)["attempts"]

    assert proof.outcome == "fail" and [a["attempt"] for a in attempts] == [1, 2]
    refusal = f"Error: {STDIN_REFUSED}"
    for attempt in attempts:
        # Mastra's tool turns the refusal into its text output (not a tool error): the model reads it as such.
        calls = attempt["tool_calls"]
        assert [c["arguments"]["command"] for c in calls] == [
            "uname -a",
            f"printf '%s\\n' '{refusal}' > {PROOF}",
            f"cat {PROOF}",
        ]
        assert {(c["name"], c["result"], c["error"]) for c in calls} == {(EXECUTE, refusal, False)}
        assert attempt["answer"] == "Error:"
        assert attempt["verify_read"] == {"error": f"FileNotFoundError: path '{PROOF}' does not exist"}
    assert proof.error is not None and f"no uname result shows 'Linux': {json.dumps(refusal)}" in proof.error


# --- a real model -------------------------------------------------------------------------------------


def test_the_real_model_switch_reaches_the_model_named_with_its_key(tmp_path: Path, served: dict[str, str]) -> None:
    check_the_real_model_switch(tmp_path, MASTRA, requests=4, served=served)
