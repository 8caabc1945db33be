"""The Agno runner end to end: an Agno Agent with Agno's E2BTools, on the code interpreter template.

E2BTools opens an `e2b_code_interpreter` sandbox (`code-interpreter-v1`, its server on port 49999). The
runner runs against the faithful embedded endpoint, against `b3os-beta`, and with a real-model switch;
the tests read what each run recorded. The first run builds the runner's environment (PyPI) and the
code interpreter template; later runs reuse them from the cache.
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

AGNO = runner_of("agno")
CELLS = {"cells": ["x = 6 * 7", "print(x)"], "stdout": ["42\n"]}
ANSWERS = ['["Logs:\\nLogs(stdout: [], stderr: [])"]', "[\"Logs:\\nLogs(stdout: ['42\\\\n'], stderr: [])\"]"]


faithful = run_fixture("faithful", "agno")
b3os = run_fixture("b3os", "agno")


def proof_calls(uname: str) -> list[tuple[str, dict[str, str], str]]:
    """The proof task's tool calls through E2BTools: a command, then its file tools (path in `file_path`)."""
    return [
        ("run_command", {"command": "uname -a"}, json.dumps([f"STDOUT:\n{uname}\n"])),
        ("write_file_content", {"file_path": PROOF, "content": uname + "\n"}, PROOF),
        ("read_file_content", {"file_path": PROOF}, uname + "\n"),
    ]


def check_proof_attempt(run: FrameworkRun) -> str:
    """The one attempt passed with the three calls of `proof_calls`; returns the uname line."""
    (attempt,) = run.transcript(AGNO)["attempts"]
    uname = attempt["verdict"]["uname_output"]
    assert attempt["verdict"] == {"passed": True, "uname_output": uname, "answer_word": "Linux", "problems": []}
    assert uname.startswith("Linux ") and uname.endswith(" GNU/Linux")
    assert [(c["name"], c["arguments"], c["result"]) for c in attempt["tool_calls"]] == proof_calls(uname)
    assert not any(c["error"] for c in attempt["tool_calls"])
    assert attempt["answer"] == "Linux" and attempt["verify_read"] == {"content": uname + "\n"}
    return str(uname)


# --- the faithful endpoint ----------------------------------------------------------------------------


def test_agno_passes_every_case_against_the_faithful_endpoint(faithful: FrameworkRun) -> None:
    check_every_case_passes(faithful, AGNO)


def test_the_agent_runs_uname_with_run_command_and_writes_and_reads_with_e2btools_file_tools(
    faithful: FrameworkRun,
) -> None:
    transcript = faithful.transcript(AGNO)

    check_proof_attempt(faithful)
    assert transcript["model"]["scripted"] is True
    assert transcript["sandbox_tagging"] == "metadata {'e2b-bench-run': <run id>}"
    assert set(transcript["cleanup"].values()) == {"already gone"}  # every session killed its sandbox


def test_the_model_exchange_offers_the_whole_e2btools_toolkit_and_ends_in_the_answer(faithful: FrameworkRun) -> None:
    exchanges = faithful.transcript(AGNO)["model_exchanges"]

    assert [e["api"] for e in exchanges] == ["chat.completions"] * 4
    assert exchanges[0]["client"] == "AsyncOpenAI/Python 3.57.0"
    offered = {t["function"]["name"] for t in exchanges[0]["request"]["tools"]}
    assert {"run_python_code", "run_command", "write_file_content", "read_file_content", "list_files"} <= offered
    assert len(offered) == 19
    assert exchanges[-1]["decision"] == {"answer": "Linux"}


def test_the_probes_see_exit_code_5_late_output_and_state_kept_across_code_interpreter_cells(
    faithful: FrameworkRun,
) -> None:
    probes = faithful.transcript(AGNO)["probes"]

    assert probes["fw02_exit_code"] == {"command": "exit 5", "exit_code": 5, "stdout": "", "stderr": ""}
    assert probes["fw03_late_output"] == LATE_OUTPUT
    assert probes["fw04_python_cells"] == {**CELLS, "answers": ANSWERS}


def test_the_transcript_names_the_upstream_toolkit_and_the_header_pins_what_agno_brought(
    faithful: FrameworkRun,
) -> None:
    pins = faithful.run.header["pins"][AGNO]

    assert faithful.transcript(AGNO)["backend"] == "upstream: agno.tools.e2b.E2BTools (e2b_code_interpreter.Sandbox)"
    assert AGNO == "agno-3.1.10"
    # agno declares no E2B dependency: the newest e2b-code-interpreter, and the e2b it requires (>=2.55.1).
    assert (pins["agno"], pins["e2b-code-interpreter"], pins["e2b"], pins["openai"]) == (
        "3.1.10",
        "2.11.5",
        "2.63.0",
        "3.57.0",
    )


def test_the_wire_log_has_envd_traffic_and_the_code_interpreter_s_execute_on_port_49999(faithful: FrameworkRun) -> None:
    requests = [
        (e["method"], e["url"].split("/", 3)[3], e["status"], e["request_headers"].get("e2b-sandbox-port"))
        for e in faithful.wire(AGNO)
    ]

    assert [r for r in requests if r[1] == "v2/sandboxes"] == [("POST", "v2/sandboxes", 201, None)] * 2
    assert [r for r in requests if r[1] == "execute"] == [("POST", "execute", 200, "49999")] * 2  # fw04's cells
    starts = [r for r in requests if r[1] == "process.Process/Start"]
    assert starts == [("POST", "process.Process/Start", 200, "49983")] * 3  # uname, exit 5, sleep; echo late
    assert ("POST", "files?path=%2Fhome%2Fuser%2Fproof.txt", 200, "49983") in requests  # write_file_content


# --- the b3os-beta profile ----------------------------------------------------------------------------


def test_agno_passes_every_case_on_b3os_beta_with_the_same_calls(b3os: FrameworkRun) -> None:
    # Foreground commands without stdin, absolute paths, the file API and the code interpreter: nothing
    # E2BTools uses is among the profile's deviations.
    check_judged_by_b3os_declarations(b3os)
    assert {(c.outcome, c.conformant) for c in b3os.run.cases if c.runner == AGNO} == {("pass", True)}
    uname = check_proof_attempt(b3os)
    assert uname.split()[1] in b3os.transcript(AGNO)["sandboxes"]  # the hostname is the sandbox id
    assert b3os.transcript(AGNO)["probes"]["fw04_python_cells"] == {**CELLS, "answers": ANSWERS}


# --- a real model -------------------------------------------------------------------------------------


def test_the_real_model_switch_reaches_the_model_named_with_its_key(tmp_path: Path, served: dict[str, str]) -> None:
    check_the_real_model_switch(tmp_path, AGNO, requests=4, served=served)
