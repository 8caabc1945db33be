"""The scripted model's policy: perform the proof task with whatever tools a request offers.

The task (docs/ARCHITECTURE.md, "Frameworks"): run `uname -a` in the sandbox, write its output to
`/home/user/proof.txt`, read it back, answer with its first word. The policy is a pure function of
the conversation so far: it looks at the tool calls already made and their results, and decides the
next call or the final answer. It reads tool results as a model would (JSON members such as
`stdout`/`content`, `[stdout]` sections, numbered lines), never the sandbox itself.
"""

from __future__ import annotations

import ast
import json
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

PROOF_PATH = "/home/user/proof.txt"
UNAME_COMMAND = "uname -a"
TASK_PROMPT = (
    f"Run `{UNAME_COMMAND}` in the sandbox, write its output to {PROOF_PATH}, read that file back, "
    "and answer with the first word of its content only."
)
NO_ANSWER = "unknown"

# Tools whose name says they start something in the background are never the shell of choice.
_BACKGROUND = re.compile(r"start|spawn|background|check|stop|kill", re.IGNORECASE)
_SHELL_NAMES = re.compile(r"shell|exec|command|bash|run|terminal", re.IGNORECASE)
# A line that is all brackets frames a result (`[stdout]`, `[exit code: 0]`, `[<path> | 1 lines]`).
_FRAME_LINE = re.compile(r"^\s*\[[^\]]*\]\s*$", re.MULTILINE)
_NUMBERED = re.compile(r"^\s*\d+\s*(?:\t|\||:|→)\s?(?P<text>.*)$")
_RESULT_MEMBERS = ("stdout", "content", "output", "result", "text")
# Names a file tool gives its path parameter.
_PATH_PARAMS = ("path", "file_path")
# A shell result whose header (chunk id, wall time, exit code) ends in a line `Output:`.
_OUTPUT_HEADER = re.compile(r"^Output:\n", re.MULTILINE)
# A result in labelled sections (`STDOUT:\n...`, then maybe `STDERR:\n...`): its output is the first.
_STDOUT_SECTION = re.compile(r"^STDOUT:\n(?P<out>.*?)(?:\n+STDERR:\n.*)?$", re.DOTALL)


@dataclass(frozen=True)
class Tool:
    """A function tool the request offers, with its JSON Schema parameters."""

    name: str
    parameters: Mapping[str, Any] = field(default_factory=dict)

    def string_params(self) -> set[str]:
        properties = self.parameters.get("properties") or {}
        return {
            name
            for name, schema in properties.items()
            if isinstance(schema, Mapping) and schema.get("type") in ("string", None)
        }


@dataclass(frozen=True)
class Call:
    """A tool call already made in the conversation, with its result (None: none yet)."""

    name: str
    arguments: Mapping[str, Any]
    result: str | None


@dataclass(frozen=True)
class ToolCall:
    """The policy's decision to call a tool."""

    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class Answer:
    """The policy's final answer."""

    text: str


Decision = ToolCall | Answer


@dataclass(frozen=True)
class Toolbox:
    """The roles the offered tools can play: a shell, a file writer, a file reader."""

    shell: Tool | None
    shell_param: str | None
    writer: Tool | None
    reader: Tool | None

    @classmethod
    def of(cls, tools: Sequence[Tool]) -> Toolbox:
        shells = [t for t in tools if t.string_params() & {"command", "cmd"} and not _BACKGROUND.search(t.name)]
        shells.sort(key=lambda t: (not _SHELL_NAMES.search(t.name), tools.index(t)))
        shell = shells[0] if shells else None
        param = None if shell is None else ("command" if "command" in shell.string_params() else "cmd")
        writers = [t for t in tools if "content" in t.string_params() and t.string_params() & set(_PATH_PARAMS)]
        writers.sort(key=lambda t: ("write" not in t.name.lower(), tools.index(t)))
        readers = [
            t
            for t in tools
            if t.string_params() & set(_PATH_PARAMS) and "content" not in t.string_params() and _reads(t.name)
        ]
        return cls(shell, param, writers[0] if writers else None, readers[0] if readers else None)


def path_param(tool: Tool) -> str:
    """The name of a file tool's path parameter (`path`, else a synonym it has)."""
    return next((name for name in _PATH_PARAMS if name in tool.string_params()), _PATH_PARAMS[0])


def _reads(name: str) -> bool:
    lowered = name.lower()
    return "read" in lowered or lowered in ("cat", "view", "open_file")


def tool_text(result: str | None) -> str:
    """What a tool result says, as a model reads it: the output, without framing."""
    text = result or ""
    try:
        parsed = json.loads(text)
    except ValueError:
        parsed = _python_literal(text)
    if isinstance(parsed, Mapping):
        member = next((parsed[k] for k in _RESULT_MEMBERS if isinstance(parsed.get(k), str)), None)
        text = member if member is not None else text
    elif isinstance(parsed, str):
        text = parsed
    elif isinstance(parsed, list) and parsed and all(isinstance(part, str) for part in parsed):
        text = "\n".join(parsed)  # sections of a result, e.g. ["STDOUT:\n...", "STDERR:\n..."]
    if (header := _OUTPUT_HEADER.search(text)) is not None:
        text = text[header.end() :]
    if (section := _STDOUT_SECTION.match(text)) is not None:
        text = section["out"]
    if "[stdout]\n" in text:
        text = text.split("[stdout]\n", 1)[1].split("\n\n[", 1)[0]
    text = _FRAME_LINE.sub("", text)
    lines = text.splitlines()
    numbered = [_NUMBERED.match(line) for line in lines if line.strip()]
    if numbered and all(numbered):
        lines = [m["text"] for m in numbered if m]
    return "\n".join(lines).strip()


def _python_literal(text: str) -> Any:
    """A result some frameworks send as Python's repr of a dict (`{'content': ...}`), read as the dict."""
    if not text.lstrip().startswith("{"):
        return None
    try:
        return ast.literal_eval(text.strip())
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return None


def first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), "")


def first_word(text: str) -> str:
    words = text.split()
    return words[0] if words else ""


def _is_uname(call: Call, box: Toolbox) -> bool:
    if box.shell is None or call.name != box.shell.name:
        return False
    return "uname" in str(call.arguments.get(box.shell_param or "command"))


def _is_write(call: Call, box: Toolbox) -> bool:
    if box.writer is not None and call.name == box.writer.name:
        return call.arguments.get(path_param(box.writer)) == PROOF_PATH
    command = str(call.arguments.get(box.shell_param or "command", ""))
    return box.shell is not None and call.name == box.shell.name and f"> {PROOF_PATH}" in command


def _is_read(call: Call, box: Toolbox) -> bool:
    if box.reader is not None and call.name == box.reader.name:
        return call.arguments.get(path_param(box.reader)) == PROOF_PATH
    command = str(call.arguments.get(box.shell_param or "command", ""))
    return box.shell is not None and call.name == box.shell.name and command == f"cat {PROOF_PATH}"


def decide(tools: Sequence[Tool], calls: Sequence[Call]) -> Decision:
    """The next step of the proof task given the offered tools and the calls made so far."""
    box = Toolbox.of(tools)
    if box.shell is None or box.shell_param is None:
        offered = ", ".join(t.name for t in tools) or "none"
        return Answer(f"{NO_ANSWER}: no shell-like tool offered (tools: {offered})")
    uname = next((c for c in calls if _is_uname(c, box)), None)
    if uname is None:
        return ToolCall(box.shell.name, {box.shell_param: UNAME_COMMAND})
    if not any(_is_write(c, box) for c in calls):
        content = first_line(tool_text(uname.result))
        if box.writer is not None:
            return ToolCall(box.writer.name, {path_param(box.writer): PROOF_PATH, "content": content + "\n"})
        return ToolCall(box.shell.name, {box.shell_param: f"printf '%s\\n' {shlex.quote(content)} > {PROOF_PATH}"})
    read = next((c for c in calls if _is_read(c, box)), None)
    if read is None:
        if box.reader is not None:
            return ToolCall(box.reader.name, {path_param(box.reader): PROOF_PATH})
        return ToolCall(box.shell.name, {box.shell_param: f"cat {PROOF_PATH}"})
    return Answer(first_word(tool_text(read.result)) or NO_ANSWER)
