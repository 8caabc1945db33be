"""Agno runner: an Agno `Agent` with Agno's `E2BTools` toolkit, model through `OpenAILike`.

`E2BTools` opens an `e2b_code_interpreter.Sandbox` (template `code-interpreter-v1`, its server on port
49999) when it is made, and offers the agent its whole toolkit: `run_python_code` (the code
interpreter), `run_command`, file tools and more. The sandbox is tagged with the task's metadata
(`sandbox_options`). The probes run straight through the toolkit's own sandbox object (what
`run_command` calls), and fw04 runs two cells through `run_python_code`: state kept across cells of the
code interpreter. Agno's telemetry is off. Protocol and steps: ../proof.py.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

os.environ["AGNO_TELEMETRY"] = "false"  # nothing here may reach the network
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import proof

INSTRUCTIONS = "You operate a Linux sandbox through your tools. Do exactly what the user asks."
SANDBOX_TIMEOUT_S = 600
CELLS = ("x = 6 * 7", "print(x)")  # fw04: a variable set in one cell, printed by the next


class AgnoSession(proof.Session):
    def __init__(self, model: proof.Model, metadata: dict[str, str]) -> None:
        self.model = model
        self.metadata = metadata
        self.tools: Any = None

    async def start(self) -> None:
        from agno.tools.e2b import E2BTools

        # E2BTools creates its sandbox in its constructor (blocking): off the event loop.
        options = {"metadata": self.metadata}
        lifetime = proof.lifetime_s(SANDBOX_TIMEOUT_S)
        self.tools = await asyncio.to_thread(E2BTools, timeout=lifetime, sandbox_options=options)
        self.sandbox_id = self.tools.sandbox.sandbox_id

    async def ask(self, prompt: str, run: proof.Run) -> None:
        from agno.agent import Agent
        from agno.models.openai.like import OpenAILike
        from agno.run.base import RunStatus

        model = OpenAILike(id=self.model.name, base_url=self.model.base_url, api_key=self.model.key or "none")
        agent = Agent(model=model, tools=[self.tools], instructions=INSTRUCTIONS, telemetry=False)
        output = await agent.arun(prompt)
        for execution in output.tools or ():
            run.calls.append(
                proof.ToolRecord(
                    name=str(execution.tool_name),
                    arguments=dict(execution.tool_args or {}),
                    result=str(execution.result),
                    error=bool(execution.tool_call_error),
                )
            )
        if output.status == RunStatus.error:  # Agno returns a failed run (the model unreachable, ...)
            raise RuntimeError(f"the agent run ended in error: {output.content}")
        run.answer = None if output.content is None else str(output.content)

    async def read(self, path: str) -> str:
        content = await asyncio.to_thread(self.tools.sandbox.files.read, path)
        return str(content)

    async def run(self, command: str) -> proof.Probe:
        from e2b import CommandExitException

        try:
            result = await asyncio.to_thread(self.tools.sandbox.commands.run, command)
        except CommandExitException as exc:  # a non-zero exit: the SDK raises it with the result
            return proof.Probe(exit_code=exc.exit_code, stdout=exc.stdout, stderr=exc.stderr)
        return proof.Probe(exit_code=result.exit_code, stdout=result.stdout, stderr=result.stderr)

    async def cells(self, details: dict[str, Any]) -> str | None:
        """fw04: the cells through `run_python_code`; the second must print what the first assigned."""
        answers = [await asyncio.to_thread(self.tools.run_python_code, cell) for cell in CELLS]
        execution = self.tools.last_execution
        stdout = list(execution.logs.stdout) if execution is not None else None
        details.update(cells=list(CELLS), answers=answers, stdout=stdout)
        if stdout != ["42\n"]:
            return f"run_python_code({CELLS[1]!r}) after {CELLS[0]!r}: stdout {stdout!r}, answer {answers[1]!r}"
        return None

    async def close(self) -> None:
        if self.tools is not None:
            await asyncio.to_thread(self.tools.sandbox.kill)


class Agno(proof.Framework):
    name = "agno"
    packages = ("agno", "e2b-code-interpreter", "e2b", "openai")
    extra_steps: ClassVar[Mapping[str, str]] = {"fw04_python_cells": "cells"}

    @property
    def backend(self) -> str:
        return "upstream: agno.tools.e2b.E2BTools (e2b_code_interpreter.Sandbox)"

    async def open(self, model: proof.Model, metadata: dict[str, str]) -> proof.Session:
        return AgnoSession(model, metadata)


if __name__ == "__main__":
    sys.exit(proof.main(Agno))
