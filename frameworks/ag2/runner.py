"""AG2 runner: `Agent` + `SandboxShellTool` over an E2B environment, driven by an OpenAI-compatible model.

The environment is AG2's own `ag2.extensions.e2b.E2BEnvironment` when the installed release has it,
else the project's implementation of AG2's public sandbox interface (`e2b_environment.py` beside
this file); the hello event and the transcript say which one ran. Protocol and steps: ../proof.py.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]

import proof  # noqa: E402

try:
    from ag2.extensions.e2b import E2BEnvironment  # type: ignore[import-not-found]

    BACKEND = "upstream: ag2.extensions.e2b.E2BEnvironment"
except ImportError:
    from e2b_environment import E2BEnvironment  # type: ignore[no-redef]

    BACKEND = (
        "own: frameworks/ag2/e2b_environment.py (AG2's public SandboxFactory/SandboxBase interface; "
        "this ag2 release has no ag2.extensions.e2b)"
    )

INSTRUCTIONS = "You operate a Linux sandbox through the run_shell_command tool. Do exactly what the user asks."


class AG2Session(proof.Session):
    def __init__(self, model: proof.Model, metadata: dict[str, str]) -> None:
        self.model = model
        self.environment = E2BEnvironment(timeout=60, sandbox_timeout=proof.lifetime_s(600), metadata=metadata)

    async def _sandbox(self) -> Any:
        async with self.environment.open() as sandbox:
            self.sandbox_id = getattr(sandbox, "sandbox_id", None) or self.sandbox_id
            return sandbox

    async def ask(self, prompt: str, run: proof.Run) -> None:
        from ag2 import Agent
        from ag2.config import OpenAIConfig
        from ag2.events.tool_events import ToolCallEvent, ToolResultEvent
        from ag2.tools import SandboxShellTool

        await self._sandbox()
        config = OpenAIConfig(model=self.model.name, base_url=self.model.base_url, api_key=self.model.key)
        agent = Agent("coder", INSTRUCTIONS, config=config, tools=[SandboxShellTool(self.environment)])
        reply = await agent.ask(prompt)
        run.answer = reply.body
        calls: dict[str, proof.ToolRecord] = {}
        for event in await reply.history.get_events():
            if isinstance(event, ToolCallEvent):
                calls[event.id] = proof.ToolRecord(event.name, json.loads(event.arguments or "{}"), "")
                run.calls.append(calls[event.id])
            elif isinstance(event, ToolResultEvent) and event.parent_id in calls:
                text = "".join(str(getattr(part, "content", part)) for part in event.result.parts)
                calls[event.parent_id].result = text
                calls[event.parent_id].error = text.rstrip().endswith("]") and "[exit code:" in text

    async def read(self, path: str) -> str:
        sandbox = await self._sandbox()
        result = await sandbox.exec(["cat", path])
        if result.exit_code != 0:
            raise OSError(f"cat {path} exited {result.exit_code}: {result.output}")
        return str(result.output)

    async def run(self, command: str) -> proof.Probe:
        sandbox = await self._sandbox()
        result = await sandbox.exec(["sh", "-c", command])
        return proof.Probe(exit_code=result.exit_code, stdout=result.output)

    async def close(self) -> None:
        await self.environment.aclose()


class AG2(proof.Framework):
    name = "ag2"
    packages = ("ag2", "openai", "e2b")

    @property
    def backend(self) -> str:
        return BACKEND

    async def open(self, model: proof.Model, metadata: dict[str, str]) -> proof.Session:
        return AG2Session(model, metadata)


if __name__ == "__main__":
    sys.exit(proof.main(AG2))
