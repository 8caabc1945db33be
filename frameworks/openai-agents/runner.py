"""OpenAI Agents SDK runner: a `SandboxAgent` on the SDK's E2B sandbox backend, model through the Responses API.

The runner makes the sandbox session itself with `E2BSandboxClient().create(...)` (plain `e2b`
sandbox type on the `base` template, the task's metadata as the sandbox's metadata, the workspace
root at /home/user so the proof file lies inside it) and hands it to the run through
`RunConfig(sandbox=SandboxRunConfig(session=...))`, as the SDK documents for a live session: the
model's tools (`exec_command`, `write_stdin`, `apply_patch`, `view_image`) and the runner's own
reads and probes go through that one session, whose shutdown kills the sandbox. Tracing export is
off (no network). Protocol and steps: ../proof.py.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

os.environ["OPENAI_AGENTS_DISABLE_TRACING"] = "1"  # the SDK exports traces to the internet otherwise
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import proof

INSTRUCTIONS = "You operate a Linux sandbox through your tools. Do exactly what the user asks."
WORKSPACE = "/home/user"
TOOL_FAILED = "An error occurred while running the tool"  # the SDK's default failure result
MAX_TURNS = 12


def _arguments(raw: Any) -> dict[str, Any]:
    import json

    text = getattr(raw, "arguments", None) or getattr(raw, "input", None) or "{}"
    try:
        parsed = json.loads(text)
    except ValueError:
        return {"input": text}
    return parsed if isinstance(parsed, dict) else {"input": parsed}


class AgentsSession(proof.Session):
    def __init__(self, model: proof.Model, session: Any) -> None:
        self.model = model
        self.session = session
        self.sandbox_id = str(session.state.sandbox_id)

    async def ask(self, prompt: str, run: proof.Run) -> None:
        from agents import RunConfig, Runner, set_tracing_disabled
        from agents.items import MessageOutputItem, ToolCallItem, ToolCallOutputItem
        from agents.models.openai_responses import OpenAIResponsesModel
        from agents.run_config import SandboxRunConfig
        from agents.sandbox import SandboxAgent
        from openai import AsyncOpenAI

        set_tracing_disabled(True)
        client = AsyncOpenAI(base_url=self.model.base_url, api_key=self.model.key or "unused")
        model = OpenAIResponsesModel(model=self.model.name, openai_client=client)
        agent = SandboxAgent(name="coder", instructions=INSTRUCTIONS, model=model)
        config = RunConfig(sandbox=SandboxRunConfig(session=self.session), tracing_disabled=True)
        result = Runner.run_streamed(agent, prompt, run_config=config, max_turns=MAX_TURNS)
        calls: dict[str, proof.ToolRecord] = {}
        async for event in result.stream_events():
            item = getattr(event, "item", None)
            if isinstance(item, ToolCallItem):
                raw = item.raw_item
                name = str(getattr(raw, "name", None) or getattr(raw, "type", "tool"))
                record = proof.ToolRecord(name, _arguments(raw), "")
                calls[str(getattr(raw, "call_id", len(calls)))] = record
                run.calls.append(record)
            elif isinstance(item, ToolCallOutputItem):
                raw = item.raw_item
                call_id = raw.get("call_id") if isinstance(raw, dict) else getattr(raw, "call_id", None)
                found = calls.get(str(call_id))
                if found is not None:
                    found.result = str(item.output)
                    found.error = found.result.startswith(TOOL_FAILED)
            elif isinstance(item, MessageOutputItem):
                run.answer = "".join(getattr(part, "text", "") for part in item.raw_item.content)
        if result.final_output is not None:
            run.answer = str(result.final_output)

    async def read(self, path: str) -> str:
        handle: io.IOBase = await self.session.read(Path(path))
        data = handle.read()
        return data.decode("utf-8", errors="replace") if isinstance(data, bytes) else str(data)

    async def run(self, command: str) -> proof.Probe:
        result = await self.session.exec(command, shell=True, timeout=30)
        return proof.Probe(
            exit_code=result.exit_code,
            stdout=result.stdout.decode("utf-8", errors="replace"),
            stderr=result.stderr.decode("utf-8", errors="replace"),
        )


class OpenAIAgents(proof.Framework):
    name = "openai-agents"
    packages = ("openai-agents", "openai", "e2b", "e2b-code-interpreter")

    @property
    def backend(self) -> str:
        return (
            "upstream: agents.extensions.sandbox.e2b.E2BSandboxClient + E2BSandboxSession "
            "(sandbox_type 'e2b'), SandboxAgent with the default capabilities (Filesystem, Shell, Compaction)"
        )

    @contextlib.asynccontextmanager
    async def session(self, model: proof.Model, metadata: dict[str, str]) -> AsyncIterator[proof.Session]:
        from agents.extensions.sandbox.e2b import E2BSandboxClient, E2BSandboxClientOptions, E2BSandboxType
        from agents.sandbox import Manifest

        options = E2BSandboxClientOptions(
            sandbox_type=E2BSandboxType.E2B, template="base", timeout=proof.lifetime_s(300), metadata=dict(metadata)
        )
        session = await E2BSandboxClient().create(manifest=Manifest(root=WORKSPACE), options=options)
        try:
            await session.start()  # what `async with session` does, which would leave a failed start's sandbox
        except BaseException:
            await session.shutdown()
            raise
        try:
            yield AgentsSession(model, session)
        finally:
            await session.aclose()  # persists nothing (no snapshot given), then kills the sandbox


if __name__ == "__main__":
    sys.exit(proof.main(OpenAIAgents))
