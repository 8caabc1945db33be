"""smolagents runner: a `CodeAgent` whose Python runs in smolagents' own `E2BExecutor`, model `OpenAIServerModel`.

The agent writes code, not tool calls: each code step it executed is recorded as a `python` tool call
(the code, then the observation or the error). E2BExecutor creates an `e2b_code_interpreter` sandbox
(its keyword arguments carry the run's metadata) and runs every cell through the sandbox's code
interpreter server. It pip-installs the agent's `additional_authorized_imports` there, which would
need the internet: the agent gets none (the list only guards smolagents' local interpreter; the
remote kernel imports what the code imports). It still runs `!pip install numpy pillow` first (what its
final_answer tool's source imports); smolagents ignores that cell's output, and the template ships
both. The probes and the verify read run Python through the same executor (`subprocess.run(command,
shell=True)`, `open(path)`). Protocol and steps: ../proof.py.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import proof

MAX_STEPS = 8  # the proof task takes four code steps
SANDBOX_TIMEOUT = 300
PROBE_CODE = """import json, subprocess
_probe = subprocess.run({command!r}, shell=True, capture_output=True, text=True)
print(json.dumps({{"exit_code": _probe.returncode, "stdout": _probe.stdout, "stderr": _probe.stderr}}))"""
READ_CODE = """import json
with open({path!r}) as _file:
    print(json.dumps(_file.read()))"""


def printed(logs: str) -> Any:
    """The JSON value the probe code printed last."""
    return json.loads(logs.strip().splitlines()[-1])


class SmolagentsSession(proof.Session):
    def __init__(self, model: proof.Model, metadata: dict[str, str]) -> None:
        from smolagents import CodeAgent, LogLevel, OpenAIServerModel

        llm = OpenAIServerModel(model_id=model.name, api_base=model.base_url, api_key=model.key)
        self.agent = CodeAgent(
            tools=[],
            model=llm,
            executor_type="e2b",
            executor_kwargs={"metadata": metadata, "timeout": proof.lifetime_s(SANDBOX_TIMEOUT)},
            max_steps=MAX_STEPS,
            verbosity_level=LogLevel.ERROR,
        )
        self.executor = self.agent.python_executor
        self.sandbox_id = self.executor.sandbox.sandbox_id

    def _steps(self) -> list[proof.ToolRecord]:
        from smolagents.memory import ActionStep

        return [
            proof.ToolRecord(
                "python",
                {"code": step.code_action},
                str(step.error) if step.error is not None else str(step.observations or ""),
                error=step.error is not None,
            )
            for step in self.agent.memory.steps
            if isinstance(step, ActionStep) and step.code_action is not None
        ]

    async def ask(self, prompt: str, run: proof.Run) -> None:
        try:
            answer = await asyncio.to_thread(self.agent.run, prompt)
            run.answer = None if answer is None else str(answer)
        finally:
            run.calls.extend(self._steps())

    async def _execute(self, code: str) -> str:
        output = await asyncio.to_thread(self.executor.run_code_raise_errors, code)
        return str(output.logs)

    async def read(self, path: str) -> str:
        return str(printed(await self._execute(READ_CODE.format(path=path))))

    async def run(self, command: str) -> proof.Probe:
        found = printed(await self._execute(PROBE_CODE.format(command=command)))
        return proof.Probe(exit_code=found["exit_code"], stdout=found["stdout"], stderr=found["stderr"])

    async def close(self) -> None:
        await asyncio.to_thread(self.agent.cleanup)


class Smolagents(proof.Framework):
    name = "smolagents"
    packages = ("smolagents", "e2b-code-interpreter", "e2b", "openai")

    @property
    def backend(self) -> str:
        return "upstream: smolagents.remote_executors.E2BExecutor (CodeAgent executor_type='e2b')"

    async def open(self, model: proof.Model, metadata: dict[str, str]) -> proof.Session:
        return await asyncio.to_thread(SmolagentsSession, model, metadata)


if __name__ == "__main__":
    sys.exit(proof.main(Smolagents))
