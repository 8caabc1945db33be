"""CrewAI runner: an `Agent` + `Task` + `Crew` with crewai-tools' E2B tools, model through CrewAI's `LLM`.

The tools (`E2BExecTool`, `E2BFileTool`, `E2BPythonTool` from `crewai_tools.tools.e2b_sandbox_tool`)
would each make a sandbox of their own (per call, or one per tool when persistent), so a file one
writes is gone for the next. The runner makes one sandbox with the SDK the tools use (the code
interpreter's `Sandbox`, tagged with the run's metadata) and attaches every tool to it by
`sandbox_id`, their documented way to share one; the tools never kill an attached sandbox, so the
session does. Tool calls are read from CrewAI's event bus. The probes call `E2BExecTool.run`, the
verify read `E2BFileTool.run(action="read")`. Telemetry and tracing are off (no network).
Protocol and steps: ../proof.py.
"""

from __future__ import annotations

import ast
import asyncio
import json
import os
import sys
import threading
from pathlib import Path
from typing import Any

for flag in ("CREWAI_DISABLE_TELEMETRY", "CREWAI_DISABLE_TRACKING", "OTEL_SDK_DISABLED"):
    os.environ[flag] = "true"
os.environ["CREWAI_TRACING_ENABLED"] = "false"
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import proof  # noqa: E402

SANDBOX_TIMEOUT = 300
MAX_ITERATIONS = 8  # the proof task takes three tool calls and the answer


def text(value: Any) -> str:
    """A tool's result as JSON: CrewAI hands the model (and its events) the repr of the dict a tool returned."""
    if isinstance(value, str):
        try:
            value = ast.literal_eval(value) if value.startswith("{") else value
        except (ValueError, SyntaxError):
            return value
    return value if isinstance(value, str) else json.dumps(value, default=str)


class ToolLog:
    """The tool calls CrewAI's event bus reports while registered, in the order they finished."""

    def __init__(self, run: proof.Run) -> None:
        self.run = run
        self._lock = threading.Lock()

    def finished(self, source: Any, event: Any) -> None:
        self._add(event, text(event.output), False)

    def failed(self, source: Any, event: Any) -> None:
        self._add(event, text(event.error), True)

    def _add(self, event: Any, result: str, error: bool) -> None:
        arguments = event.tool_args if isinstance(event.tool_args, dict) else {"input": event.tool_args}
        with self._lock:
            self.run.calls.append(proof.ToolRecord(str(event.tool_name), dict(arguments), result, error))


class CrewAISession(proof.Session):
    def __init__(self, model: proof.Model, metadata: dict[str, str]) -> None:
        from crewai_tools.tools.e2b_sandbox_tool import E2BExecTool, E2BFileTool, E2BPythonTool
        from e2b_code_interpreter import Sandbox

        self.model = model
        self.sandbox = Sandbox.create(metadata=metadata, timeout=proof.lifetime_s(SANDBOX_TIMEOUT))
        self.sandbox_id = self.sandbox.sandbox_id
        attach = {"sandbox_id": self.sandbox_id, "sandbox_timeout": proof.lifetime_s(SANDBOX_TIMEOUT)}
        self.exec_tool = E2BExecTool(**attach)
        self.file_tool = E2BFileTool(**attach)
        self.tools = [self.exec_tool, self.file_tool, E2BPythonTool(**attach)]

    def _kickoff(self, prompt: str, run: proof.Run) -> None:
        from crewai import LLM, Agent, Crew, Task
        from crewai.events import ToolUsageErrorEvent, ToolUsageFinishedEvent, crewai_event_bus

        llm = LLM(model=f"openai/{self.model.name}", base_url=self.model.base_url, api_key=self.model.key)
        agent = Agent(
            role="Sandbox operator",
            goal="Carry out the task in the E2B sandbox with your tools",
            backstory="You operate a Linux sandbox through your tools and do exactly what you are asked.",
            tools=self.tools,
            llm=llm,
            max_iter=MAX_ITERATIONS,
            allow_delegation=False,
            verbose=False,
        )
        task = Task(description=prompt, expected_output="The first word of the file's content", agent=agent)
        log = ToolLog(run)
        with crewai_event_bus.scoped_handlers():
            crewai_event_bus.register_handler(ToolUsageFinishedEvent, log.finished)
            crewai_event_bus.register_handler(ToolUsageErrorEvent, log.failed)
            try:
                output = Crew(agents=[agent], tasks=[task], verbose=False).kickoff()
                run.answer = output.raw
            finally:
                crewai_event_bus.flush()

    async def ask(self, prompt: str, run: proof.Run) -> None:
        await asyncio.to_thread(self._kickoff, prompt, run)

    async def read(self, path: str) -> str:
        found = await asyncio.to_thread(self.file_tool.run, action="read", path=path)
        return str(found["content"]) if isinstance(found, dict) and "content" in found else text(found)

    async def run(self, command: str) -> proof.Probe:
        from e2b import CommandExitException

        try:
            found = await asyncio.to_thread(self.exec_tool.run, command=command)
        except CommandExitException as exc:  # the SDK raises on a non-zero exit; the tool passes it on
            return proof.Probe(exit_code=exc.exit_code, stdout=exc.stdout, stderr=exc.stderr)
        return proof.Probe(exit_code=found["exit_code"], stdout=found["stdout"] or "", stderr=found["stderr"] or "")

    async def close(self) -> None:
        await asyncio.to_thread(self.sandbox.kill)


class CrewAI(proof.Framework):
    name = "crewai"
    packages = ("crewai", "crewai-tools", "e2b", "e2b-code-interpreter", "openai")

    @property
    def backend(self) -> str:
        return (
            "upstream: crewai_tools.tools.e2b_sandbox_tool E2BExecTool + E2BFileTool + E2BPythonTool "
            "(attached by sandbox_id to one e2b_code_interpreter sandbox)"
        )

    async def open(self, model: proof.Model, metadata: dict[str, str]) -> proof.Session:
        return await asyncio.to_thread(CrewAISession, model, metadata)


if __name__ == "__main__":
    sys.exit(proof.main(CrewAI))
