"""LangChain Deep Agents runner: `create_deep_agent` on langchain-e2b's `AsyncE2BSandbox`, model through `ChatOpenAI`.

langchain-e2b's backend wraps a sandbox its caller made, as its README shows for async agents (its
`E2BProvider` takes no metadata and belongs to Deep Agents Code, which is not installed): the runner
makes it with the e2b SDK langchain-e2b brings, `AsyncSandbox.create(template="base", metadata=...)`,
so this run's sandboxes are tagged, and kills it after use. The agent's tools (`execute`, `write_file`,
`read_file`, `ls`, `edit_file`, ...) and the runner's own reads (`adownload_files`) and probes
(`aexecute`) all go through that one backend. Protocol and steps: ../proof.py.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import proof

SYSTEM_PROMPT = "You operate a Linux sandbox through your tools. Do exactly what the user asks."
RECURSION_LIMIT = 30  # graph steps: a model turn and a tool turn each count


def _content(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "".join(part if isinstance(part, str) else str(part.get("text", "")) for part in value)
    return json.dumps(value, default=str)


def record_messages(messages: list[Any], run: proof.Run) -> None:
    """The run's tool calls (each with its result) and final answer, read from the graph's messages."""
    from langchain_core.messages import AIMessage, ToolMessage

    calls: dict[str, proof.ToolRecord] = {}
    run.calls.clear()
    for message in messages:
        if isinstance(message, AIMessage):
            for call in message.tool_calls:
                calls[str(call["id"])] = proof.ToolRecord(call["name"], dict(call["args"]), "")
                run.calls.append(calls[str(call["id"])])
            if not message.tool_calls:
                run.answer = _content(message.content)
        elif isinstance(message, ToolMessage) and (record := calls.get(message.tool_call_id)) is not None:
            record.result = _content(message.content)
            record.error = message.status == "error"


class DeepAgentsSession(proof.Session):
    def __init__(self, model: proof.Model, backend: Any) -> None:
        self.model = model
        self.sandbox_id = str(backend.id)
        self.backend = backend

    async def ask(self, prompt: str, run: proof.Run) -> None:
        from deepagents import create_deep_agent
        from langchain_openai import ChatOpenAI

        model = ChatOpenAI(model=self.model.name, base_url=self.model.base_url, api_key=self.model.key or "unused")
        agent = create_deep_agent(model=model, system_prompt=SYSTEM_PROMPT, backend=self.backend)
        messages: list[Any] = []
        try:
            inputs = {"messages": [{"role": "user", "content": prompt}]}
            config = {"recursion_limit": RECURSION_LIMIT}
            async for state in agent.astream(inputs, config=config, stream_mode="values"):
                messages = list(state.get("messages") or messages)
        finally:
            record_messages(messages, run)

    async def read(self, path: str) -> str:
        (response,) = await self.backend.adownload_files([path])
        if response.error is not None or response.content is None:
            raise OSError(f"download of {path} failed: {response.error}")
        return bytes(response.content).decode("utf-8", errors="replace")

    async def run(self, command: str) -> proof.Probe:
        result = await self.backend.aexecute(command, timeout=30)
        return proof.Probe(exit_code=result.exit_code, stdout=result.output)


class DeepAgents(proof.Framework):
    name = "deepagents"
    packages = ("deepagents", "langchain-e2b", "langchain-openai", "langgraph", "e2b")

    @property
    def backend(self) -> str:
        return "upstream: langchain_e2b.AsyncE2BSandbox (a Deep Agents BaseSandbox), create_deep_agent's default tools"

    @contextlib.asynccontextmanager
    async def session(self, model: proof.Model, metadata: dict[str, str]) -> AsyncIterator[proof.Session]:
        # Imported before the sandbox is made, as an application would: the import tags the SDK's traffic.
        from e2b import AsyncSandbox
        from langchain_e2b import AsyncE2BSandbox

        sandbox = await AsyncSandbox.create(template="base", timeout=proof.lifetime_s(300), metadata=dict(metadata))
        try:
            yield DeepAgentsSession(model, AsyncE2BSandbox(sandbox=sandbox))
        finally:
            await sandbox.kill()


if __name__ == "__main__":
    sys.exit(proof.main(DeepAgents))
