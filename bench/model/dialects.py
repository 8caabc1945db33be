"""Text dialects of the scripted model: agents that read the reply's text instead of function calls.

When a request offers no function tools, the agent still expects a step of the proof task, written
the way its prompt asks:

- **code**: a code-writing agent. Its prompt says how code is fenced ("opened with '<code>', and
  closed with '</code>'", or ```py blocks) and that the run ends with `final_answer(...)`. Each
  reply is a thought and one block of Python: run `uname -a` through `subprocess`, write the proof
  file, read it back, `final_answer("Linux")`. The observations are the messages after each block.
- **react**: tools are described in the prompt (`Tool Name:` / `Tool Arguments:` with a JSON Schema)
  and called in text (`Action:` / `Action Input:`, answered by `Observation:`, ended by `Final
  Answer:`). The described tools are handed to the policy as if offered as functions.

Like the policy, a dialect is a pure function of the conversation; a reply is cut at the request's
first stop sequence, as OpenAI's API cuts it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from . import api
from .actions import decide
from .policy import PROOF_PATH, UNAME_COMMAND, Answer, Call, Tool, ToolCall, first_line, first_word, tool_text

CODE_TOOL = "python"  # how a code step is named in records, like a tool call
_FENCE = re.compile(r"opened with '(?P<open>[^']+)',? and closed with '(?P<close>[^']+)'")
_MARKDOWN = re.compile(r"```(?P<lang>python|py)\b")
_FINAL_ANSWER = re.compile(r"\bfinal_answer\b")
_TOOL_HEAD = re.compile(r"^Tool Name:\s*(?P<name>.+?)\s*$", re.MULTILINE)
_ARGS_HEAD = re.compile(r"Tool Arguments:\s*")
_ACTION = re.compile(r"^Action:\s*(?P<name>.+?)\s*\nAction Input:\s*", re.MULTILINE)
_OBSERVATION = re.compile(r"^Observation:\s*", re.MULTILINE)
_NEXT_STEP = re.compile(r"^(?:Thought|Action|Final Answer):", re.MULTILINE)
# A label line frames an observation ("Execution logs:", "Observation:"); "None" is an empty value.
_LABEL = re.compile(r"^\s*(?:[A-Z][\w ]{0,40}:|None)\s*$")


@dataclass(frozen=True)
class Message:
    role: str
    text: str


@dataclass(frozen=True)
class Reply:
    """A text reply, and what it does in the proof task's terms (a call or the answer)."""

    dialect: str
    text: str
    action: ToolCall | Answer

    def record(self) -> dict[str, Any]:
        return {"dialect": self.dialect, **api.decision_record(self.action)}


# --- conversations ---------------------------------------------------------------------------------


def chat_conversation(body: Mapping[str, Any]) -> list[Message]:
    return [
        Message(str(m.get("role")), api.text_of(m.get("content")))
        for m in body.get("messages") or ()
        if isinstance(m, Mapping)
    ]


def responses_conversation(body: Mapping[str, Any], items: Sequence[Mapping[str, Any]]) -> list[Message]:
    head = [Message("system", str(body["instructions"]))] if body.get("instructions") else []
    return head + [
        Message(str(item.get("role")), api.text_of(item.get("content")))
        for item in items
        if item.get("type", "message") == "message"
    ]


def cut_at_stop(text: str, stop: Any) -> str:
    """The text up to the first of the request's stop sequences (a string or a list), as OpenAI cuts it."""
    sequences = [stop] if isinstance(stop, str) else [s for s in stop or () if isinstance(s, str)]
    ends = [text.find(s) for s in sequences if s and s in text]
    return text[: min(ends)] if ends else text


def reply(messages: Sequence[Message], stop: Any = None) -> Reply | None:
    """The next step in the dialect the prompt asks for; None when the prompt asks for no text dialect."""
    found = react(messages) or code(messages)
    if found is None:
        return None
    return Reply(found.dialect, cut_at_stop(found.text, stop), found.action)


def _prompt(messages: Sequence[Message]) -> str:
    return "\n".join(m.text for m in messages if m.role in ("system", "developer", "user"))


def observation_text(text: str) -> str:
    """An observation as a model reads it: without its labels (`Observation:`, `Execution logs:`)."""
    text = _OBSERVATION.sub("", text, count=1) if text.lstrip().startswith("Observation:") else text
    return "\n".join(line for line in tool_text(text).splitlines() if not _LABEL.match(line)).strip()


# --- code: a code-writing agent --------------------------------------------------------------------


def fence(prompt: str) -> tuple[str, str] | None:
    """How the prompt asks code to be fenced, when it asks for code blocks ending in `final_answer`."""
    if not _FINAL_ANSWER.search(prompt):
        return None
    if found := _FENCE.search(prompt):
        return found["open"], found["close"]
    if found := _MARKDOWN.search(prompt):
        return f"```{found['lang']}", "```"
    return None


def code_steps(messages: Sequence[Message], tags: tuple[str, str]) -> list[Call]:
    """Each code block the assistant wrote, with the observation that followed it."""
    opening, closing = map(re.escape, tags)
    block = re.compile(rf"{opening}[ \t]*\n?(?P<code>.*?)(?:{closing}|\Z)", re.DOTALL)
    steps: list[Call] = []
    for index, message in enumerate(messages):
        if message.role != "assistant" or not (found := block.search(message.text)):
            continue
        after = next((m.text for m in messages[index + 1 :] if m.role != "assistant"), None)
        steps.append(Call(CODE_TOOL, {"code": found["code"].strip()}, after))
    return steps


def _code_reply(tags: tuple[str, str], thought: str, source: str, action: ToolCall | Answer) -> Reply:
    return Reply("code", f"Thought: {thought}\n{tags[0]}\n{source}\n{tags[1]}", action)


def code(messages: Sequence[Message]) -> Reply | None:
    tags = fence(_prompt(messages))
    if tags is None:
        return None
    steps = code_steps(messages, tags)

    def step(thought: str, source: str) -> Reply:
        return _code_reply(tags, thought, source, ToolCall(CODE_TOOL, {"code": source}))

    uname = next((s for s in steps if "uname" in s.arguments["code"]), None)
    if uname is None:
        argv = json.dumps(UNAME_COMMAND.split())
        return step(
            f"I run `{UNAME_COMMAND}` with subprocess and print its output.",
            f"import subprocess\nprint(subprocess.run({argv}, capture_output=True, text=True).stdout)",
        )
    touching = [s for s in steps if PROOF_PATH in s.arguments["code"]]
    if not any('"w"' in s.arguments["code"] for s in touching):
        content = first_line(observation_text(uname.result or "")) + "\n"
        return step(
            f"I write that output to {PROOF_PATH}.",
            f"with open({PROOF_PATH!r}, \"w\") as f:\n    f.write({content!r})\nprint('written')",
        )
    read = next((s for s in touching if '"w"' not in s.arguments["code"]), None)
    if read is None:
        return step(f"I read {PROOF_PATH} back.", f"with open({PROOF_PATH!r}) as f:\n    print(f.read())")
    word = first_word(observation_text(read.result or "")) or "unknown"
    return _code_reply(
        tags, "The file starts with that word: it is my answer.", f"final_answer({word!r})", Answer(word)
    )


# --- react: tools described in the prompt, called in text -----------------------------------------


def described_tools(prompt: str) -> list[Tool]:
    """The tools a prompt describes as `Tool Name: ...` followed by `Tool Arguments: {JSON Schema}`."""
    tools = []
    for head in _TOOL_HEAD.finditer(prompt):
        parameters: Any = {}
        if (args := _ARGS_HEAD.match(prompt, head.end() + 1)) is not None:
            try:
                parameters, _ = json.JSONDecoder().raw_decode(prompt, args.end())
            except ValueError:
                parameters = {}
        tools.append(Tool(head["name"], parameters if isinstance(parameters, dict) else {}))
    return tools


def react_calls(messages: Sequence[Message]) -> list[Call]:
    """Each `Action:` the assistant wrote, with its `Observation:` (same message or the next one)."""
    calls = []
    for index, message in enumerate(messages):
        if message.role != "assistant":
            continue
        for action in _ACTION.finditer(message.text):
            try:
                arguments, end = json.JSONDecoder().raw_decode(message.text, action.end())
            except ValueError:
                arguments, end = {}, action.end()
            rest = message.text[end:]
            if seen := _OBSERVATION.search(rest):
                after = rest[seen.end() :]
                result: str | None = after[: m.start()] if (m := _NEXT_STEP.search(after)) else after
            else:
                result = next((m.text for m in messages[index + 1 :] if m.role != "assistant"), None)
            arguments = arguments if isinstance(arguments, dict) else {}
            calls.append(Call(action["name"], arguments, None if result is None else observation_text(result)))
    return calls


def react(messages: Sequence[Message]) -> Reply | None:
    prompt = _prompt(messages)
    tools = described_tools(prompt)
    if not tools or "Action Input:" not in prompt:
        return None
    decision = decide(tools, react_calls(messages))
    if isinstance(decision, Answer):
        return Reply("react", f"Thought: I now know the final answer\nFinal Answer: {decision.text}", decision)
    text = f"Thought: I use {decision.name}.\nAction: {decision.name}\nAction Input: {json.dumps(decision.arguments)}"
    return Reply("react", text, decision)
