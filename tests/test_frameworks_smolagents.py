"""smolagents end to end: a `CodeAgent` writing Python that its `E2BExecutor` runs in the code interpreter.

The runner drives smolagents' own E2B executor (an `e2b_code_interpreter` sandbox of the
`code-interpreter-v1` template, every cell through `POST /execute` on port 49999) with the scripted
model speaking the code dialect, against the faithful endpoint, `b3os-beta`, and a model given with
`--model-base-url`.
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

RUNNER = runner_of("smolagents")
CODE_STEPS = [  # what the scripted model writes, step by step, in smolagents' <code> tags
    'import subprocess\nprint(subprocess.run(["uname", "-a"], capture_output=True, text=True).stdout)',
    f"with open('{PROOF_PATH}', \"w\") as f:\n    f.write('{{uname}}\\n')\nprint('written')",
    f"with open('{PROOF_PATH}') as f:\n    print(f.read())",
    "final_answer('Linux')",
]


faithful = run_fixture("faithful", "smolagents")


b3os = run_fixture("b3os", "smolagents")


def test_smolagents_passes_every_case_against_the_faithful_endpoint(faithful: SingleRun) -> None:
    check_every_case_passes(faithful, faithful.runner)


def test_each_code_step_is_a_python_call_with_its_observation_and_the_answer_is_final_answer_s(
    faithful: SingleRun,
) -> None:
    transcript = faithful.own_transcript()

    (attempt,) = transcript["attempts"]
    uname = attempt["verdict"]["uname_output"]
    calls = attempt["tool_calls"]
    assert uname.startswith("Linux ") and attempt["verdict"]["passed"] is True
    assert [c["arguments"]["code"] for c in calls] == [step.replace("{uname}", uname) for step in CODE_STEPS]
    assert {c["name"] for c in calls} == {"python"} and not any(c["error"] for c in calls)
    assert calls[0]["result"] == f"Execution logs:\n{uname}\n\nLast output from code snippet:\nNone"
    assert calls[2]["result"] == calls[0]["result"]  # the file read back holds the uname line
    assert calls[3]["result"] == "Execution logs:\nLast output from code snippet:\nLinux"
    assert attempt["answer"] == "Linux" and attempt["verify_read"] == {"content": uname + "\n"}
    assert set(transcript["cleanup"].values()) == {"already gone"}  # the executor's cleanup killed each sandbox


def test_the_model_exchanges_are_text_replies_in_the_code_dialect(faithful: SingleRun) -> None:
    exchanges = faithful.own_transcript()["model_exchanges"]

    assert [e["decision"].get("tool") for e in exchanges] == ["python", "python", "python", None]
    assert {e["decision"]["dialect"] for e in exchanges} == {"code"}
    assert exchanges[-1]["decision"] == {"dialect": "code", "answer": "Linux"}
    for exchange in exchanges:
        assert "tools" not in exchange["request"] and exchange["request"]["stop"] == [
            "Observation:",
            "Calling tools:",
            "</code>",
        ]
        content = exchange["reply"]["choices"][0]["message"]["content"]
        # the reply is cut at the stop sequence `</code>`, as OpenAI cuts it; smolagents closes the block
        assert content.startswith("Thought: ") and "\n<code>\n" in content and "</code>" not in content


def test_the_backend_is_smolagents_e2b_executor_and_the_header_pins_what_it_brought(faithful: SingleRun) -> None:
    transcript = faithful.own_transcript()
    pins = faithful.run.header["pins"][RUNNER]

    assert transcript["backend"] == "upstream: smolagents.remote_executors.E2BExecutor (CodeAgent executor_type='e2b')"
    assert transcript["sandbox_tagging"].startswith("metadata {'e2b-bench-run'")
    assert pins["smolagents"] == "1.26.0" and pins["e2b-code-interpreter"] == "2.11.5" and pins["e2b"] == "2.63.0"


def test_every_cell_goes_through_the_code_interpreter_on_port_49999(faithful: SingleRun) -> None:
    wire = faithful.own_wire()
    executes = [e for e in wire if e["url"].endswith("/execute")]

    assert [e["method"] for e in wire if e["url"].endswith("/sandboxes")] == ["POST", "POST"]  # proof, probes
    assert {(e["method"], e["status"], e["request_headers"]["e2b-sandbox-port"]) for e in executes} == {
        ("POST", 200, "49999")
    }
    cells = [json.loads(e["request_body"])["code"] for e in executes]
    proof_sandbox, probe_sandbox = faithful.own_transcript()["sandboxes"]
    assert [e["request_headers"]["e2b-sandbox-id"] for e in executes] == [proof_sandbox] * 7 + [probe_sandbox] * 2
    # E2BExecutor installs what its final_answer tool imports, then defines the tools; then the agent's
    # four steps and the verify read; then the two probes
    command, packages = cells[0].split()[:2], set(cells[0].split()[2:])  # a set: the order varies
    assert (command, packages) == (["!pip", "install"], {"pillow", "numpy"})
    assert cells[1].startswith("import collections\n")
    assert "class _FinalAnswerTool(Tool)" in cells[1] and cells[1].endswith("final_answer = _FinalAnswerTool()\n")
    assert cells[2:6] == [c["arguments"]["code"] for c in faithful.own_transcript()["attempts"][0]["tool_calls"]]
    assert not any("process.Process" in e["url"] for e in wire)  # envd's process API is never used


def test_the_probes_run_the_shell_through_subprocess_in_the_executor(faithful: SingleRun) -> None:
    exit_code = faithful.own_case("fw02_exit_code").details
    late = faithful.own_case("fw03_late_output").details

    assert (exit_code["exit_code"], exit_code["stdout"]) == (5, "")
    assert (late["exit_code"], late["stdout"]) == (0, "late\n")


def test_on_b3os_beta_smolagents_passes_its_kernel_s_subprocesses_are_not_envd_commands(b3os: SingleRun) -> None:
    transcript = b3os.own_transcript()

    assert b3os.run.header["endpoint"]["name"] == "local-b3os-beta" and b3os.done.returncode == 0, b3os.output()
    assert {(c.outcome, c.conformant) for c in b3os.cases()} == {("pass", True)}
    assert all(sandbox.startswith("sbx-") for sandbox in transcript["sandboxes"])  # the profile's ids
    assert b3os.own_case("fw02_exit_code").details["exit_code"] == 5


def test_a_model_given_by_url_drives_the_agent_and_its_key_never_reaches_disk(
    tmp_path: Path, served: dict[str, str]
) -> None:
    done, _ = check_the_real_model_switch(tmp_path, RUNNER, requests=4, served=served)

    assert done.transcript(RUNNER)["attempts"][0]["answer"] == "Linux"
