"""The scripted model over real HTTP: both APIs, streamed and not, the proof task's tool-call flow."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from loopback import two_requests_idle_between

from bench.model import PROOF_PATH, ModelServer, actions, serving_model
from bench.model.dialects import Message, Reply, reply
from bench.model.policy import Answer, Call, Tool, Toolbox, ToolCall, decide, tool_text
from bench.redaction import REDACTED

REPO = Path(__file__).resolve().parents[1]
UNAME = "Linux sbx-1 6.1.0 #1 SMP x86_64 GNU/Linux"
STRING = {"type": "string"}


def schema(*names: str) -> dict[str, Any]:
    return {"type": "object", "properties": {name: STRING for name in names}, "required": list(names)}


def chat_tool(name: str, *params: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "description": name, "parameters": schema(*params)}}


def responses_tool(name: str, *params: str) -> dict[str, Any]:
    return {"type": "function", "name": name, "description": name, "parameters": schema(*params)}


SHELL_ONLY = [chat_tool("run_shell_command", "command")]
FILE_TOOLS = [
    responses_tool("exec", "command"),
    responses_tool("write_file", "path", "content"),
    responses_tool("read_file", "path"),
]


@pytest.fixture(scope="module")
def model() -> Iterator[ModelServer]:
    with serving_model() as server:
        yield server


def sse(response: httpx.Response) -> list[str]:
    return [line.removeprefix("data: ") for line in response.text.splitlines() if line.startswith("data: ")]


class ChatConversation:
    """A Chat Completions client that runs the model's tool calls against canned results."""

    def __init__(self, base_url: str, tools: list[dict[str, Any]], stream: bool = False) -> None:
        self.url = f"{base_url}/chat/completions"
        self.tools, self.stream = tools, stream
        self.messages: list[dict[str, Any]] = [{"role": "user", "content": "go"}]

    def turn(self) -> dict[str, Any]:
        body: dict[str, Any] = {"model": "m", "messages": self.messages, "tools": self.tools}
        if self.stream:
            body |= {"stream": True, "stream_options": {"include_usage": True}}
        reply = httpx.post(self.url, json=body, headers={"Authorization": "Bearer sk-test-key-0123456789"})
        reply.raise_for_status()
        message = assemble(sse(reply)) if self.stream else reply.json()["choices"][0]["message"]
        self.messages.append(message)
        return message

    def answer_tools(self, message: dict[str, Any], result: str) -> None:
        for call in message.get("tool_calls") or ():
            self.messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})


def assemble(lines: list[str]) -> dict[str, Any]:
    """A message from streamed chunks, as openai clients put it together."""
    assert lines[-1] == "[DONE]"
    content, calls = "", {}
    for chunk in map(json.loads, lines[:-1]):
        for choice in chunk["choices"]:
            delta = choice["delta"]
            content += delta.get("content") or ""
            for call in delta.get("tool_calls") or ():
                entry = calls.setdefault(call["index"], {"id": None, "function": {"name": "", "arguments": ""}})
                entry["id"] = call.get("id") or entry["id"]
                entry["function"]["name"] += call.get("function", {}).get("name") or ""
                entry["function"]["arguments"] += call.get("function", {}).get("arguments") or ""
    message: dict[str, Any] = {"role": "assistant", "content": content or None}
    if calls:
        message["tool_calls"] = [{"type": "function", **calls[i]} for i in sorted(calls)]
    return message


def arguments(message: dict[str, Any]) -> dict[str, Any]:
    return json.loads(message["tool_calls"][0]["function"]["arguments"])


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_chat_completions_drive_the_proof_task_with_only_a_shell_tool(model: ModelServer, stream: bool) -> None:
    chat = ChatConversation(model.endpoint.base_url("shell"), SHELL_ONLY, stream)

    steps = []
    for result in (UNAME + "\n", "", UNAME + "\n"):
        message = chat.turn()
        steps.append(arguments(message)["command"])
        chat.answer_tools(message, result)
    final = chat.turn()

    assert steps == ["uname -a", f"printf '%s\\n' '{UNAME}' > {PROOF_PATH}", f"cat {PROOF_PATH}"]
    assert final == {"role": "assistant", "content": "Linux"}


def test_a_streamed_chat_reply_ends_with_a_usage_chunk_only_when_asked(model: ModelServer) -> None:
    url = f"{model.endpoint.base_url()}/chat/completions"
    body = {"model": "m", "messages": [{"role": "user", "content": "go"}], "tools": SHELL_ONLY, "stream": True}

    plain = sse(httpx.post(url, json=body))
    counted = sse(httpx.post(url, json={**body, "stream_options": {"include_usage": True}}))

    assert "usage" not in json.loads(plain[-2])
    usage_chunk = json.loads(counted[-2])
    assert usage_chunk["choices"] == [] and usage_chunk["usage"]["total_tokens"] > 0
    finish = [c["finish_reason"] for line in counted[:-2] for c in json.loads(line)["choices"] if c["finish_reason"]]
    assert finish == ["tool_calls"]


def test_responses_api_drives_the_proof_task_with_file_tools(model: ModelServer) -> None:
    url = f"{model.endpoint.base_url('files')}/responses"
    items: list[dict[str, Any]] = [{"type": "message", "role": "user", "content": "go"}]
    results = iter([json.dumps({"stdout": UNAME + "\n", "exitCode": 0}), "wrote", UNAME + "\n"])

    calls = []
    while True:
        reply = httpx.post(url, json={"model": "m", "input": items, "tools": FILE_TOOLS}).json()
        assert reply["object"] == "response" and reply["status"] == "completed"
        output = reply["output"][0]
        if output["type"] == "message":
            break
        calls.append((output["name"], json.loads(output["arguments"])))
        items += [output, {"type": "function_call_output", "call_id": output["call_id"], "output": next(results)}]

    assert calls == [
        ("exec", {"command": "uname -a"}),
        ("write_file", {"path": PROOF_PATH, "content": UNAME + "\n"}),
        ("read_file", {"path": PROOF_PATH}),
    ]
    assert output["content"][0] == {"type": "output_text", "text": "Linux", "annotations": [], "logprobs": []}


def test_a_streamed_response_continues_a_stored_one_by_previous_response_id(model: ModelServer) -> None:
    url = f"{model.endpoint.base_url()}/responses"
    first = httpx.post(url, json={"model": "m", "input": "go", "tools": FILE_TOOLS, "store": True}).json()
    call = first["output"][0]
    follow_up = {"type": "function_call_output", "call_id": call["call_id"], "output": UNAME}

    reply = httpx.post(
        url,
        json={
            "model": "m",
            "previous_response_id": first["id"],
            "input": [follow_up],
            "tools": FILE_TOOLS,
            "stream": True,
        },
    )

    events = [json.loads(line) for line in sse(reply)]
    assert [e["type"] for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    done = events[-1]["response"]["output"][0]
    assert (done["name"], json.loads(done["arguments"])) == (
        "write_file",
        {"path": PROOF_PATH, "content": UNAME + "\n"},
    )


def test_an_unknown_previous_response_and_a_malformed_body_are_refused_openai_style(model: ModelServer) -> None:
    base = model.endpoint.base_url()
    missing = httpx.post(f"{base}/responses", json={"model": "m", "input": [], "previous_response_id": "resp_x"})
    malformed = httpx.post(f"{base}/chat/completions", content=b"not json")

    assert missing.status_code == 404 and "resp_x" in missing.json()["error"]["message"]
    assert malformed.status_code == 400 and malformed.json()["error"]["type"] == "invalid_request_error"


def test_every_exchange_is_recorded_per_caller_with_secrets_redacted(model: ModelServer) -> None:
    chat = ChatConversation(model.endpoint.base_url("recorded"), SHELL_ONLY)
    chat.messages[0]["content"] = "my api_key=sk-live-abcdef0123456789"
    chat.turn()

    exchanges = model.transcript.exchanges("recorded")

    assert len(exchanges) == 1
    exchange = exchanges[0]
    assert (exchange["api"], exchange["stream"], exchange["decision"]) == (
        "chat.completions",
        False,
        {"tool": "run_shell_command", "arguments": {"command": "uname -a"}},
    )
    text = json.dumps(exchange)
    assert "sk-live-abcdef0123456789" not in text and REDACTED in text
    assert "sk-test-key" not in text  # the Authorization header is never recorded
    assert exchange["reply"]["choices"][0]["finish_reason"] == "tool_calls"


# --- the policy as a pure function -------------------------------------------------------------------


def tools(*specs: tuple[str, tuple[str, ...]]) -> list[Tool]:
    return [Tool(name, schema(*params)) for name, params in specs]


# The tool sets the four frameworks really offer (names and parameters of their E2B tools).
FRAMEWORK_TOOLS = {
    "ag2": tools(("run_shell_command", ("command",))),
    "adk": tools(("Execute", ("command",)), ("ReadFile", ("path",)), ("EditFile", ("path", "old_string", "new_string")), ("WriteFile", ("path", "content"))),  # noqa: E501
    "pydantic-ai-harness": tools(("run_command", ("command",)), ("start_command", ("command",)), ("read_file", ("path",)), ("write_file", ("path", "content"))),  # noqa: E501
    "tanstack-ai": tools(("exec", ("command",)), ("write_file", ("path", "content")), ("read_file", ("path",))),
}  # fmt: skip


@pytest.mark.parametrize(
    ("framework", "roles"),
    [
        ("ag2", ("run_shell_command", None, None)),
        ("adk", ("Execute", "WriteFile", "ReadFile")),
        ("pydantic-ai-harness", ("run_command", "write_file", "read_file")),
        ("tanstack-ai", ("exec", "write_file", "read_file")),
    ],
)
def test_the_policy_finds_the_shell_writer_and_reader_each_framework_offers(framework: str, roles: tuple) -> None:
    box = Toolbox.of(FRAMEWORK_TOOLS[framework])

    assert tuple(t.name if t else None for t in (box.shell, box.writer, box.reader)) == roles


@pytest.mark.parametrize(
    ("result", "text"),
    [
        (json.dumps({"status": "ok", "stdout": UNAME + "\n"}), UNAME),  # ADK Execute
        (json.dumps({"status": "ok", "content": f"     1\t{UNAME}\n"}), UNAME),  # ADK ReadFile
        (f"[stdout]\n{UNAME}\n\n[exit code: 0]", UNAME),  # Pydantic AI Harness run_command
        (f"[{PROOF_PATH} | 1 lines | hash:bc39c8d3d110]\n     1\t{UNAME}\n", UNAME),  # its read_file
        (json.dumps({"stdout": UNAME + "\n", "stderr": "", "exitCode": 0}), UNAME),  # TanStack exec
        ("oops\n[exit code: 5]", "oops"),  # AG2 on a non-zero exit
    ],
)
def test_tool_results_are_read_as_a_model_reads_them(result: str, text: str) -> None:
    assert tool_text(result) == text


def test_without_a_shell_tool_the_policy_says_so_instead_of_calling_anything() -> None:
    decision = decide(tools(("read_file", ("path",))), [])

    assert isinstance(decision, Answer) and decision.text.startswith("unknown: no shell-like tool")


def test_a_failed_read_is_answered_with_what_the_read_returned() -> None:
    shell = FRAMEWORK_TOOLS["tanstack-ai"]
    calls = [
        Call("exec", {"command": "uname -a"}, UNAME),
        Call("write_file", {"path": PROOF_PATH, "content": UNAME}, "ok"),
        Call("read_file", {"path": PROOF_PATH}, '{"error": "FIFO reads are not supported"}'),
    ]

    assert decide(shell, calls) == Answer('{"error":')
    assert decide(shell, calls[:1]) == ToolCall("write_file", {"path": PROOF_PATH, "content": UNAME + "\n"})


def test_e2b_bench_model_serves_until_sigterm_and_prints_each_exchange() -> None:
    process = subprocess.Popen(
        [sys.executable, "-m", "bench.cli", "model", "--port", "0"],
        cwd=REPO,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        banner = process.stdout.readline()
        base_url = banner.split("base URL ")[1].split()[0]
        process.stdout.readline()
        reply = httpx.post(f"{base_url}/chat/completions", json={"model": "m", "messages": [], "tools": SHELL_ONLY})
        printed = json.loads(process.stdout.readline())
    finally:
        process.send_signal(signal.SIGTERM)
        code = process.wait(timeout=10)

    assert base_url.startswith("http://127.0.0.1:") and base_url.endswith("/v1")
    assert arguments(reply.json()["choices"][0]["message"]) == {"command": "uname -a"}
    assert printed["decision"] == {"tool": "run_shell_command", "arguments": {"command": "uname -a"}}
    assert code == 0


# --- second-wave tool sets: OpenAI Agents SDK sandbox tools, Deep Agents file tools -------------------

AGENTS_EXEC_RESULT = f"Chunk ID: 1a2b3c\nWall time: 0.0117 seconds\nProcess exited with code 0\nOutput:\n{UNAME}\n"
SECOND_WAVE_TOOLS = {
    "openai-agents": tools(("exec_command", ("cmd", "workdir")), ("write_stdin", ()), ("view_image", ("path",))),
    "deepagents": tools(("write_todos", ()), ("ls", ("path",)), ("read_file", ("file_path",)), ("write_file", ("file_path", "content")), ("edit_file", ("file_path", "old_string", "new_string")), ("execute", ("command",)), ("task", ("description", "subagent_type"))),  # noqa: E501
}  # fmt: skip


@pytest.mark.parametrize(
    ("framework", "roles"),
    [("openai-agents", ("exec_command", None, None)), ("deepagents", ("execute", "write_file", "read_file"))],
)
def test_the_policy_finds_the_roles_among_second_wave_tools(framework: str, roles: tuple) -> None:
    box = Toolbox.of(SECOND_WAVE_TOOLS[framework])

    assert tuple(t.name if t else None for t in (box.shell, box.writer, box.reader)) == roles


# --- file tools naming their path `file_path`, results as sections (Agno's E2BTools) ------------------

AGNO_TOOLS = tools(
    ("read_file_content", ("file_path", "encoding")),
    ("run_background_command", ("command",)),
    ("run_command", ("command",)),
    ("run_python_code", ("code",)),
    ("run_server", ("command",)),
    ("upload_file", ("file_path", "sandbox_path")),
    ("write_file_content", ("file_path", "content")),
)


def test_file_tools_taking_a_file_path_are_the_writer_and_reader() -> None:
    box = Toolbox.of(AGNO_TOOLS)

    assert tuple(t.name if t else None for t in (box.shell, box.writer, box.reader)) == (
        "run_command",
        "write_file_content",
        "read_file_content",
    )


def test_the_proof_task_passes_the_path_in_the_parameter_the_file_tools_name() -> None:
    uname_result = json.dumps([f"STDOUT:\n{UNAME}\n"])
    calls = [Call("run_command", {"command": "uname -a"}, uname_result)]

    assert decide(AGNO_TOOLS, calls) == ToolCall(
        "write_file_content", {"file_path": PROOF_PATH, "content": UNAME + "\n"}
    )
    calls.append(Call("write_file_content", {"file_path": PROOF_PATH, "content": UNAME + "\n"}, PROOF_PATH))
    assert decide(AGNO_TOOLS, calls) == ToolCall("read_file_content", {"file_path": PROOF_PATH})
    calls.append(Call("read_file_content", {"file_path": PROOF_PATH}, UNAME + "\n"))
    assert decide(AGNO_TOOLS, calls) == Answer("Linux")


@pytest.mark.parametrize(
    ("result", "text"),
    [
        (AGENTS_EXEC_RESULT, UNAME),  # OpenAI Agents SDK exec_command: a header, then `Output:`
        ("Chunk ID: 1a2b3c\nWall time: 0.0100 seconds\nProcess exited with code 0\nOutput:\n", ""),
        (f"{UNAME}\n\n[Command succeeded with exit code 0]", UNAME),  # Deep Agents execute
        (f"     1\t{UNAME}", UNAME),  # Deep Agents read_file
    ],
)
def test_second_wave_tool_results_are_read_as_a_model_reads_them(result: str, text: str) -> None:
    assert tool_text(result) == text


def test_a_file_tool_whose_path_parameter_is_file_path_is_called_with_file_path() -> None:
    offered = SECOND_WAVE_TOOLS["deepagents"]
    calls = [Call("execute", {"command": "uname -a"}, f"{UNAME}\n\n[Command succeeded with exit code 0]")]

    assert decide(offered, []) == ToolCall("execute", {"command": "uname -a"})
    assert decide(offered, calls) == ToolCall("write_file", {"file_path": PROOF_PATH, "content": UNAME + "\n"})
    calls.append(Call("write_file", {"file_path": PROOF_PATH, "content": UNAME + "\n"}, "Updated file"))
    assert decide(offered, calls) == ToolCall("read_file", {"file_path": PROOF_PATH})
    calls.append(Call("read_file", {"file_path": PROOF_PATH}, f"     1\t{UNAME}"))
    assert decide(offered, calls) == Answer("Linux")


def test_a_cmd_shell_writes_and_reads_through_the_shell_from_its_output_section() -> None:
    offered = SECOND_WAVE_TOOLS["openai-agents"]
    calls = [Call("exec_command", {"cmd": "uname -a"}, AGENTS_EXEC_RESULT)]

    write = f"printf '%s\\n' '{UNAME}' > {PROOF_PATH}"
    assert decide(offered, calls) == ToolCall("exec_command", {"cmd": write})
    calls.append(Call("exec_command", {"cmd": write}, AGENTS_EXEC_RESULT.replace(UNAME + "\n", "")))
    assert decide(offered, calls) == ToolCall("exec_command", {"cmd": f"cat {PROOF_PATH}"})
    calls.append(Call("exec_command", {"cmd": f"cat {PROOF_PATH}"}, AGENTS_EXEC_RESULT))
    assert decide(offered, calls) == Answer("Linux")


@pytest.mark.parametrize(
    ("result", "text"),
    [
        (json.dumps([f"STDOUT:\n{UNAME}\n"]), UNAME),
        (json.dumps([f"STDOUT:\n{UNAME}\n", "STDERR:\nwarning: late\n"]), UNAME),
        (json.dumps(["first", "second"]), "first\nsecond"),
        (f"STDOUT:\n{UNAME}\n\nSTDERR:\noops\n", UNAME),
    ],
)
def test_a_result_in_labelled_sections_is_read_as_its_stdout(result: str, text: str) -> None:
    assert tool_text(result) == text


# --- the text dialects (no function tools offered) ----------------------------------------------------


CODE_PROMPT = (
    "Solve the task in a cycle of Thought, Code, and Observation sequences. The code sequence must be opened "
    "with '<code>', and closed with '</code>'. In the end return a final answer using the `final_answer` tool."
)
OBSERVED = f"Observation:\nExecution logs:\n{UNAME}\n\nLast output from code snippet:\nNone"
REACT_TOOLS = "\n".join(
    f"Tool Name: {name}\nTool Arguments: {json.dumps(parameters, indent=2)}\nTool Description: {name}."
    for name, parameters in (
        ("Sandbox Exec", schema("command", "cwd")),
        ("Sandbox Files", {**schema("path", "content"), "properties": {
            "action": {"type": "string", "enum": ["read", "write", "list"]}, "path": STRING, "content": STRING}}),
    )
)  # fmt: skip
REACT_PROMPT = (
    f"You ONLY have access to the following tools:\n\n{REACT_TOOLS}\n\nUse the following format:\n\n"
    "Thought: ...\nAction: the action to take\nAction Input: the input to the action, a JSON object\n"
    "Observation: the result of the action\n\nThought: I now know the final answer\nFinal Answer: ..."
)


def said(*messages: tuple[str, str], stop: Any = None) -> Reply:
    found = reply([Message(role, text) for role, text in messages], stop)
    assert found is not None
    return found


def test_a_code_writing_agent_gets_one_code_block_a_step_and_final_answer_last() -> None:
    conversation: list[tuple[str, str]] = [("system", CODE_PROMPT), ("user", "New task: the proof task")]
    observations = iter([OBSERVED, "Observation:\nExecution logs:\nwritten\n", OBSERVED])

    steps = []
    for _ in range(4):
        step = said(*conversation)
        steps.append(step.record())
        conversation += [("assistant", step.text), ("user", next(observations, ""))]

    assert [s.get("arguments", {}).get("code") for s in steps[:3]] == [
        'import subprocess\nprint(subprocess.run(["uname", "-a"], capture_output=True, text=True).stdout)',
        f"with open('{PROOF_PATH}', \"w\") as f:\n    f.write('{UNAME}\\n')\nprint('written')",
        f"with open('{PROOF_PATH}') as f:\n    print(f.read())",
    ]
    assert {s["tool"] for s in steps[:3]} == {"python"}
    assert steps[3] == {"dialect": "code", "answer": "Linux"}
    assert (
        conversation[-2][1]
        == "Thought: The file starts with that word: it is my answer.\n<code>\nfinal_answer('Linux')\n</code>"
    )


def test_a_code_reply_uses_the_prompt_s_fence_and_ends_at_the_first_stop_sequence() -> None:
    markdown = CODE_PROMPT.replace("opened with '<code>', and closed with '</code>'", "written in ```py blocks")

    fenced = said(("system", markdown), ("user", "go"))
    cut = said(("system", CODE_PROMPT), ("user", "go"), stop=["Observation:", "</code>"])

    assert fenced.text.splitlines()[1] == "```py" and fenced.text.endswith("\n```")
    assert cut.text.endswith("stdout)\n") and "</code>" not in cut.text


def test_a_prompt_asking_for_no_dialect_gets_none_and_the_policy_decides() -> None:
    assert reply([Message("system", "You are helpful."), Message("user", "hi")]) is None
    assert reply([Message("system", "Use ```py blocks."), Message("user", "no final answer asked")]) is None


def test_react_calls_the_described_tools_and_reads_observations_in_either_message() -> None:
    start = [("system", REACT_PROMPT), ("user", "the proof task")]
    first = said(*start)
    inline = f"{first.text}\nObservation: {json.dumps({'exit_code': 0, 'stdout': UNAME + chr(10)})}"
    second = said(*start, ("assistant", inline))
    third = said(*start, ("assistant", inline), ("assistant", second.text), ("user", "Observation: written"))
    read = said(*start, ("assistant", inline), ("assistant", second.text), ("user", "ok"), ("assistant", third.text),
                ("user", f"Observation: {json.dumps({'path': PROOF_PATH, 'content': UNAME})}"))  # fmt: skip

    assert first.text == 'Thought: I use Sandbox Exec.\nAction: Sandbox Exec\nAction Input: {"command": "uname -a"}'
    assert second.record() == {
        "dialect": "react",
        "tool": "Sandbox Files",
        "arguments": {"action": "write", "path": PROOF_PATH, "content": UNAME + "\n"},
    }
    assert third.record()["arguments"] == {"action": "read", "path": PROOF_PATH}
    assert read.text == "Thought: I now know the final answer\nFinal Answer: Linux"


def test_a_file_tool_with_an_action_enum_writes_and_reads_by_choosing_the_action() -> None:
    properties = {"action": {"type": "string", "enum": ["read", "write", "list"]}, "path": STRING, "content": STRING}
    offered = [Tool("exec", schema("command")), Tool("files", {"type": "object", "properties": properties})]
    calls = [Call("exec", {"command": "uname -a"}, UNAME)]
    written = [*calls, Call("files", {"action": "write", "path": PROOF_PATH, "content": UNAME}, "ok")]
    read = [*written, Call("files", {"action": "read", "path": PROOF_PATH}, str({"content": UNAME}))]

    assert actions.decide(offered, calls) == ToolCall(
        "files", {"action": "write", "path": PROOF_PATH, "content": UNAME + "\n"}
    )
    assert actions.decide(offered, written) == ToolCall("files", {"action": "read", "path": PROOF_PATH})
    assert actions.decide(offered, read) == Answer("Linux")  # the result is Python's repr of a dict


def test_over_http_a_code_prompt_is_answered_in_text_and_recorded_with_its_dialect(model: ModelServer) -> None:
    messages = [{"role": "system", "content": CODE_PROMPT}, {"role": "user", "content": "go"}]

    reply_ = httpx.post(
        f"{model.endpoint.base_url('dialect')}/chat/completions",
        json={"model": "m", "messages": messages, "stop": ["</code>"]},
    ).json()

    message = reply_["choices"][0]["message"]
    assert message["content"].startswith("Thought: I run `uname -a`") and message["content"].endswith("stdout)\n")
    assert "tool_calls" not in message
    (exchange,) = model.transcript.exchanges("dialect")
    assert exchange["decision"]["dialect"] == "code" and exchange["decision"]["tool"] == "python"


def test_a_connection_idle_past_uvicorns_default_keep_alive_serves_its_next_request(model: ModelServer) -> None:
    # A framework's client pools its connection while a tool runs in the sandbox; closed by the model as the
    # client reuses it, the next model call was reset.
    first, second = two_requests_idle_between(model.port, b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")

    assert first.startswith(b"HTTP/1.1 200 ") and model.app.model.encode() in first
    assert second.startswith(b"HTTP/1.1 200 ") and model.app.model.encode() in second
