"""The scripted OpenAI-compatible model server: `POST /v1/chat/completions` and `POST /v1/responses`.

Every request is answered by the policy (`bench.model.policy.decide`), streamed (SSE) or not, and
recorded as one exchange (request, decision, reply) in the server's transcript, redacted. A path
prefix names the caller: `/<tag>/v1/...` records the exchange under `tag` (the harness gives each
runner its own base URL this way); plain `/v1/...` records it under `default`.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from bench import asgi
from bench.redaction import Redactor

from . import api, dialects
from .actions import decide
from .policy import Answer, Call, Decision, Tool

DEFAULT_MODEL = "e2b-bench-scripted"
DEFAULT_TAG = "default"
Exchange = dict[str, Any]


@dataclass(frozen=True)
class ModelEndpoint:
    """Where the scripted model listens: `base_url(tag)` is what an OpenAI client is given."""

    url: str
    model: str

    def base_url(self, tag: str | None = None) -> str:
        return f"{self.url}/{tag}/v1" if tag else f"{self.url}/v1"


class Transcript:
    """Every exchange the server had, in order, redacted; `on_exchange` sees each as it is recorded."""

    def __init__(self, redactor: Redactor | None = None, on_exchange: Callable[[Exchange], None] | None = None) -> None:
        self._redactor = redactor or Redactor()
        self._on_exchange = on_exchange
        self._lock = threading.Lock()
        self._exchanges: list[Exchange] = []

    def record(self, exchange: Exchange) -> None:
        redacted = self._redactor.redact_obj(exchange)
        with self._lock:
            redacted["seq"] = len(self._exchanges) + 1
            self._exchanges.append(redacted)
        if self._on_exchange is not None:
            self._on_exchange(redacted)

    def exchanges(self, tag: str | None = None) -> list[Exchange]:
        with self._lock:
            return [e for e in self._exchanges if tag is None or e["tag"] == tag]


def _error(status: int, message: str, kind: str = "invalid_request_error") -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "param": None, "code": None}}, status)


def _sse(events: Iterator[str]) -> StreamingResponse:
    return StreamingResponse(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


def _decide(
    tools: list[Tool], calls: list[Call], conversation: list[dialects.Message], stop: Any = None
) -> tuple[Decision, api.Json]:
    """The policy's decision on the offered tools; without any, the text dialect the prompt asks for."""
    if not tools and (said := dialects.reply(conversation, stop)) is not None:
        return Answer(said.text), said.record()
    decision = decide(tools, calls)
    return decision, api.decision_record(decision)


class ScriptedModel:
    """The ASGI app: routes, the policy, the transcript, and stored responses for `previous_response_id`."""

    def __init__(self, transcript: Transcript, model: str = DEFAULT_MODEL) -> None:
        self.transcript = transcript
        self.model = model
        self._conversations: dict[str, list[api.Json]] = {}  # response id -> its input items + output
        self._lock = threading.Lock()
        routes = []
        for prefix in ("", "/{tag}"):
            routes += [
                Route(f"{prefix}/v1/chat/completions", self.chat, methods=["POST"]),
                Route(f"{prefix}/v1/responses", self.responses, methods=["POST"]),
                Route(f"{prefix}/v1/models", self.models, methods=["GET"]),
            ]
        self.app = Starlette(routes=routes)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await self.app(scope, receive, send)

    async def _body(self, request: Request) -> dict[str, Any] | None:
        try:
            body = json.loads(await request.body())
        except ValueError:
            return None
        return body if isinstance(body, dict) else None

    def _record(self, request: Request, kind: str, body: Mapping[str, Any], decision: api.Json, reply: Any) -> None:
        self.transcript.record(
            {
                "at": time.time(),
                "tag": request.path_params.get("tag", DEFAULT_TAG),
                "api": kind,
                "path": request.url.path,
                "client": request.headers.get("user-agent"),
                "stream": bool(body.get("stream")),
                "request": body,
                "decision": decision,
                "reply": reply,
            }
        )

    async def models(self, request: Request) -> Response:
        return JSONResponse(
            {"object": "list", "data": [{"id": self.model, "object": "model", "owned_by": "e2b-bench"}]}
        )

    async def chat(self, request: Request) -> Response:
        body = await self._body(request)
        if body is None or not isinstance(body.get("messages"), list):
            return _error(400, "the body must be a JSON object with a `messages` array")
        tools = api.chat_tools(body)
        decision, record = _decide(tools, api.chat_calls(body), dialects.chat_conversation(body), body.get("stop"))
        model = str(body.get("model") or self.model)
        if not body.get("stream"):
            reply = api.chat_completion(body, decision, model)
            self._record(request, "chat.completions", body, record, reply)
            return JSONResponse(reply)
        chunks = list(api.chat_chunks(body, decision, model))
        self._record(request, "chat.completions", body, record, chunks)
        return _sse(iter([*(f"data: {json.dumps(chunk)}\n\n" for chunk in chunks), "data: [DONE]\n\n"]))

    async def responses(self, request: Request) -> Response:
        body = await self._body(request)
        if body is None or "input" not in body:
            return _error(400, "the body must be a JSON object with an `input`")
        items = api.responses_items(body)
        previous = body.get("previous_response_id")
        if previous:
            with self._lock:
                earlier = self._conversations.get(str(previous))
            if earlier is None:
                return _error(404, f"Previous response with id '{previous}' not found.")
            items = earlier + items
        conversation = dialects.responses_conversation(body, items)
        decision, record = _decide(api.responses_tools(body), api.responses_calls(items), conversation)
        completed = api.response(body, items, decision, str(body.get("model") or self.model))
        with self._lock:
            self._conversations[completed["id"]] = items + completed["output"]
        if not body.get("stream"):
            self._record(request, "responses", body, record, completed)
            return JSONResponse(completed)
        events = [{**event, "sequence_number": n} for n, event in enumerate(api.response_events(completed))]
        self._record(request, "responses", body, record, events)
        return _sse(iter(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n" for e in events))


class ModelServer:
    """The scripted model's uvicorn server, bound before it starts so port 0 works."""

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        model: str = DEFAULT_MODEL,
        redactor: Redactor | None = None,
        on_exchange: Callable[[Exchange], None] | None = None,
    ) -> None:
        self.transcript = Transcript(redactor, on_exchange)
        self.app = ScriptedModel(self.transcript, model)
        self.sockets = [asgi.bind(host, port)]
        self.host, self.port = host, self.sockets[0].getsockname()[1]
        self.server = uvicorn.Server(
            uvicorn.Config(
                self.app,
                lifespan="off",
                log_level="warning",
                access_log=False,
                timeout_graceful_shutdown=3,
                # a framework's model client pools the connection while a tool runs in the sandbox: it closes
                # it first (openai's httpx pool after 5 s, uvicorn's default here was 5 s too)
                timeout_keep_alive=int(asgi.KEEPALIVE_S),
            )
        )

    @property
    def endpoint(self) -> ModelEndpoint:
        return ModelEndpoint(url=f"http://{self.host}:{self.port}", model=self.app.model)

    def run(self) -> None:
        asgi.run(self.server, self.sockets)


@contextlib.contextmanager
def serving_model(**options: Any) -> Iterator[ModelServer]:
    """Run the scripted model in a background thread for the duration of the block."""
    server = ModelServer(**options)
    with asgi.in_thread(server.server, server.sockets, "e2b-bench-model"):
        yield server
