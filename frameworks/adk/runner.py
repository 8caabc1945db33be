"""Google ADK runner: `LlmAgent` with ADK's built-in `E2BEnvironment` + `EnvironmentToolset`, model through `LiteLlm`.

ADK's environment takes no sandbox metadata, so this run's sandboxes carry no run tag: the runner
records each sandbox's id (the environment's `_sandbox`, which ADK exposes no other way) and kills
it by id after use. Protocol and steps: ../proof.py.
"""

from __future__ import annotations

import json
import os
import sys
import warnings
from pathlib import Path
from typing import Any

# LiteLLM fetches its model cost map from the internet at import unless told to use its bundled copy.
os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
warnings.filterwarnings("ignore", category=UserWarning)  # ADK marks the E2B environment experimental
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import proof  # noqa: E402

APP = "e2b_bench"
INSTRUCTION = "You operate a Linux sandbox through your tools. Do exactly what the user asks."


class ADKSession(proof.Session):
    def __init__(self, model: proof.Model) -> None:
        from google.adk.integrations.e2b import E2BEnvironment
        from google.adk.tools.environment import EnvironmentToolset

        self.model = model
        self.environment = E2BEnvironment(image="base", timeout=proof.lifetime_s(300))
        self.toolset = EnvironmentToolset(environment=self.environment)

    async def _ready(self) -> Any:
        await self.environment.initialize()
        sandbox = self.environment._sandbox  # the id is needed to kill an untagged sandbox
        self.sandbox_id = sandbox.sandbox_id if sandbox is not None else self.sandbox_id
        return self.environment

    async def ask(self, prompt: str, run: proof.Run) -> None:
        from google.adk.agents import LlmAgent
        from google.adk.apps import App
        from google.adk.models.lite_llm import LiteLlm
        from google.adk.runners import Runner
        from google.adk.sessions import InMemorySessionService
        from google.genai import types

        model = LiteLlm(model=f"openai/{self.model.name}", api_base=self.model.base_url, api_key=self.model.key)
        agent = LlmAgent(name="coder", model=model, instruction=INSTRUCTION, tools=[self.toolset])
        runner = Runner(app=App(name=APP, root_agent=agent), session_service=InMemorySessionService())
        session = await runner.session_service.create_session(app_name=APP, user_id="bench")
        message = types.Content(role="user", parts=[types.Part(text=prompt)])
        calls: dict[str | None, proof.ToolRecord] = {}
        async for event in runner.run_async(user_id="bench", session_id=session.id, new_message=message):
            await self._ready()
            for call in event.get_function_calls():
                calls[call.id] = proof.ToolRecord(str(call.name), dict(call.args or {}), "")
                run.calls.append(calls[call.id])
            for response in event.get_function_responses():
                record = calls.get(response.id)
                if record is not None:
                    record.result = json.dumps(response.response, default=str)
                    record.error = (response.response or {}).get("status") == "error"
            if event.is_final_response() and event.content and event.content.parts:
                run.answer = "".join(part.text or "" for part in event.content.parts)

    async def read(self, path: str) -> str:
        environment = await self._ready()
        return bytes(await environment.read_file(path)).decode("utf-8", errors="replace")

    async def run(self, command: str) -> proof.Probe:
        environment = await self._ready()
        result = await environment.execute(command)
        return proof.Probe(exit_code=result.exit_code, stdout=result.stdout or "", stderr=result.stderr or "")

    async def close(self) -> None:
        await self.toolset.close()
        await self.environment.close()


class ADK(proof.Framework):
    name = "adk"
    packages = ("google-adk", "litellm", "e2b")

    @property
    def backend(self) -> str:
        return "upstream: google.adk.integrations.e2b.E2BEnvironment + google.adk.tools.environment.EnvironmentToolset"

    @property
    def tagging(self) -> str:
        return "none: E2BEnvironment passes no metadata; each sandbox is killed by id after use"

    async def open(self, model: proof.Model, metadata: dict[str, str]) -> proof.Session:
        return ADKSession(model)


if __name__ == "__main__":
    sys.exit(proof.main(ADK))
