"""Pydantic AI Harness runner: `Agent` with `E2BSandbox` + `Shell` + `FileSystem`, model through `OpenAIChatModel`.

As the harness documents for preparing a sandbox, the runner makes the `E2BSandboxBackend` itself and
passes it as the run's `workspace`, so it can read and run through that same backend afterwards and
kill the sandbox with `E2BSandbox().destroy(ref)`: the framework never kills it. The backend takes
no sandbox metadata, so the run's sandboxes are untagged and killed by id. Protocol and steps:
../proof.py.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import proof

INSTRUCTIONS = "You operate a Linux sandbox through your tools. Do exactly what the user asks."


def _text(content: Any) -> str:
    return content if isinstance(content, str) else str(content)


class HarnessSession(proof.Session):
    def __init__(self, model: proof.Model) -> None:
        from pydantic_ai_harness import E2BSandboxBackend

        self.model = model
        self.backend = E2BSandboxBackend()

    def _note_id(self) -> None:
        ref = self.backend.ref
        self.sandbox_id = ref.id if ref is not None else self.sandbox_id

    async def ask(self, prompt: str, run: proof.Run) -> None:
        from pydantic_ai import Agent, capture_run_messages
        from pydantic_ai.messages import ModelRequest, ModelResponse, RetryPromptPart, ToolCallPart, ToolReturnPart
        from pydantic_ai.models.openai import OpenAIChatModel
        from pydantic_ai.providers.openai import OpenAIProvider
        from pydantic_ai_harness import E2BSandbox, FileSystem, Shell

        provider = OpenAIProvider(base_url=self.model.base_url, api_key=self.model.key)
        model = OpenAIChatModel(self.model.name, provider=provider)
        agent = Agent(model, instructions=INSTRUCTIONS, capabilities=[E2BSandbox(), Shell(), FileSystem()])
        try:
            with capture_run_messages() as messages:
                result = await agent.run(prompt, workspace=self.backend)
            run.answer = str(result.output)
        finally:
            self._note_id()
            calls: dict[str, proof.ToolRecord] = {}
            for message in messages:
                for part in message.parts:
                    if isinstance(message, ModelResponse) and isinstance(part, ToolCallPart):
                        calls[part.tool_call_id] = proof.ToolRecord(part.tool_name, part.args_as_dict(), "")
                        run.calls.append(calls[part.tool_call_id])
                    elif isinstance(message, ModelRequest) and isinstance(part, ToolReturnPart | RetryPromptPart):
                        record = calls.get(part.tool_call_id)
                        if record is not None:
                            record.result = _text(part.content)
                            # A refusal comes back as a return whose outcome is not 'success', or a retry prompt.
                            record.error = isinstance(part, RetryPromptPart) or part.outcome != "success"

    async def read(self, path: str) -> str:
        try:
            return (await self.backend.read_bytes(path)).decode("utf-8", errors="replace")
        finally:
            self._note_id()

    async def run(self, command: str) -> proof.Probe:
        try:
            result = await self.backend.run(command, shell=True, timeout=30)
        finally:
            self._note_id()
        return proof.Probe(exit_code=result.exit_code, stdout=result.stdout, stderr=result.stderr)

    async def close(self) -> None:
        from pydantic_ai_harness import E2BSandbox

        if self.backend.ref is not None:
            await E2BSandbox().destroy(self.backend.ref)


class PydanticAIHarness(proof.Framework):
    name = "pydantic-ai-harness"
    packages = ("pydantic-ai-harness", "pydantic-ai-slim", "e2b")

    @property
    def backend(self) -> str:
        return "upstream: pydantic_ai_harness.E2BSandbox + E2BSandboxBackend, with Shell + FileSystem"

    @property
    def tagging(self) -> str:
        return "none: E2BSandbox/E2BSandboxBackend pass no metadata; each sandbox is destroyed by its ref after use"

    async def open(self, model: proof.Model, metadata: dict[str, str]) -> proof.Session:
        return HarnessSession(model)


if __name__ == "__main__":
    sys.exit(proof.main(PydanticAIHarness))
