"""OpenAI wire shapes: reading Chat Completions and Responses requests, writing replies and SSE events.

Only what frameworks' OpenAI clients send and parse (openai-python, openai-node, LiteLLM): tool
definitions, tool calls and their results, text; streamed replies as the official API streams them,
with a usage chunk when `stream_options.include_usage` is set.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from .policy import Answer, Call, Decision, Tool, ToolCall

Json = dict[str, Any]


def _text_of(content: Any) -> str:
    """Message content as text: a string, or the text of a list of parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        return "".join(
            str(part.get("text") or part.get("output") or "") for part in content if isinstance(part, Mapping)
        )
    return "" if content is None else json.dumps(content)


text_of = _text_of  # the text dialects read messages too


def _arguments(raw: Any) -> dict[str, Any]:
    if isinstance(raw, Mapping):
        return dict(raw)
    try:
        parsed = json.loads(raw or "{}")
    except (TypeError, ValueError):
        return {}
    return parsed if isinstance(parsed, dict) else {}


def _tokens(obj: Any) -> int:
    """A stable stand-in for a token count: about four characters a token."""
    return max(1, len(json.dumps(obj, default=str)) // 4)


def _new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


# --- requests ------------------------------------------------------------------------------------


def chat_tools(body: Mapping[str, Any]) -> list[Tool]:
    tools = []
    for entry in body.get("tools") or ():
        function = entry.get("function") if isinstance(entry, Mapping) else None
        if isinstance(function, Mapping) and isinstance(function.get("name"), str):
            tools.append(Tool(function["name"], function.get("parameters") or {}))
    return tools


def chat_calls(body: Mapping[str, Any]) -> list[Call]:
    """Every tool call of the conversation, in order, with the result the caller sent back."""
    results = {
        message.get("tool_call_id"): _text_of(message.get("content"))
        for message in body.get("messages") or ()
        if isinstance(message, Mapping) and message.get("role") == "tool"
    }
    calls = []
    for message in body.get("messages") or ():
        if not isinstance(message, Mapping) or message.get("role") != "assistant":
            continue
        for call in message.get("tool_calls") or ():
            function = call.get("function") or {}
            calls.append(
                Call(str(function.get("name")), _arguments(function.get("arguments")), results.get(call.get("id")))
            )
    return calls


def responses_tools(body: Mapping[str, Any]) -> list[Tool]:
    return [
        Tool(entry["name"], entry.get("parameters") or {})
        for entry in body.get("tools") or ()
        if isinstance(entry, Mapping) and entry.get("type") == "function" and isinstance(entry.get("name"), str)
    ]


def responses_items(body: Mapping[str, Any]) -> list[Json]:
    """The request's input as a list of items (a string input is one user message)."""
    given = body.get("input")
    if isinstance(given, str):
        return [{"type": "message", "role": "user", "content": given}]
    return [dict(item) for item in given or () if isinstance(item, Mapping)]


def responses_calls(items: Sequence[Mapping[str, Any]]) -> list[Call]:
    outputs = {
        item.get("call_id"): _text_of(item.get("output"))
        for item in items
        if item.get("type") == "function_call_output"
    }
    return [
        Call(str(item.get("name")), _arguments(item.get("arguments")), outputs.get(item.get("call_id")))
        for item in items
        if item.get("type") == "function_call"
    ]


# --- Chat Completions replies ----------------------------------------------------------------------


def _chat_message(decision: Decision) -> tuple[Json, str]:
    if isinstance(decision, ToolCall):
        call = {
            "id": _new_id("call"),
            "type": "function",
            "function": {"name": decision.name, "arguments": json.dumps(decision.arguments)},
        }
        return {"role": "assistant", "content": None, "tool_calls": [call]}, "tool_calls"
    return {"role": "assistant", "content": decision.text}, "stop"


def _chat_usage(body: Mapping[str, Any], message: Any) -> Json:
    prompt, completion = _tokens(body.get("messages")), _tokens(message)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def chat_completion(body: Mapping[str, Any], decision: Decision, model: str) -> Json:
    message, finish = _chat_message(decision)
    return {
        "id": _new_id("chatcmpl"),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
        "usage": _chat_usage(body, message),
    }


def chat_chunks(body: Mapping[str, Any], decision: Decision, model: str) -> Iterator[Json]:
    """The streamed form: role and content (or the tool call, then its arguments), finish, usage."""
    message, finish = _chat_message(decision)
    base = {"id": _new_id("chatcmpl"), "object": "chat.completion.chunk", "created": int(time.time()), "model": model}

    def chunk(delta: Json, finish_reason: str | None = None) -> Json:
        return {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": None}]}

    if isinstance(decision, ToolCall):
        call = message["tool_calls"][0]
        head = {"index": 0, "id": call["id"], "type": "function", "function": {"name": decision.name, "arguments": ""}}
        yield chunk({"role": "assistant", "content": None, "tool_calls": [head]})
        arguments = call["function"]["arguments"]
        yield chunk({"tool_calls": [{"index": 0, "function": {"arguments": arguments}}]})
    else:
        yield chunk({"role": "assistant", "content": ""})
        yield chunk({"content": decision.text})
    yield chunk({}, finish)
    options = body.get("stream_options")
    if isinstance(options, Mapping) and options.get("include_usage"):
        yield {**base, "choices": [], "usage": _chat_usage(body, message)}


# --- Responses replies -----------------------------------------------------------------------------


def _response_item(decision: Decision) -> Json:
    if isinstance(decision, ToolCall):
        return {
            "type": "function_call",
            "id": _new_id("fc"),
            "call_id": _new_id("call"),
            "name": decision.name,
            "arguments": json.dumps(decision.arguments),
            "status": "completed",
        }
    text = {"type": "output_text", "text": decision.text, "annotations": [], "logprobs": []}
    return {"type": "message", "id": _new_id("msg"), "role": "assistant", "status": "completed", "content": [text]}


def response_object(body: Mapping[str, Any], items: Sequence[Any], output: list[Json], model: str, status: str) -> Json:
    usage_in, usage_out = _tokens(items), _tokens(output)
    return {
        "id": _new_id("resp"),
        "object": "response",
        "created_at": int(time.time()),
        "status": status,
        "model": model,
        "output": output,
        "parallel_tool_calls": bool(body.get("parallel_tool_calls", True)),
        "tool_choice": body.get("tool_choice", "auto"),
        "tools": list(body.get("tools") or []),
        "instructions": body.get("instructions"),
        "metadata": dict(body.get("metadata") or {}),
        "previous_response_id": body.get("previous_response_id"),
        "store": bool(body.get("store", True)),
        "temperature": body.get("temperature"),
        "top_p": body.get("top_p"),
        "text": {"format": {"type": "text"}},
        "truncation": "disabled",
        "error": None,
        "incomplete_details": None,
        "usage": {
            "input_tokens": usage_in,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": usage_out,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": usage_in + usage_out,
        },
    }


def response(body: Mapping[str, Any], items: Sequence[Any], decision: Decision, model: str) -> Json:
    return response_object(body, items, [_response_item(decision)], model, "completed")


def response_events(completed: Json) -> Iterator[Json]:
    """The streamed form of a finished response: created, the one output item's events, completed."""
    item = completed["output"][0]
    started = {**completed, "status": "in_progress", "output": [], "usage": None}
    yield {"type": "response.created", "response": started}
    yield {"type": "response.in_progress", "response": started}
    where = {"output_index": 0, "item_id": item["id"]}
    if item["type"] == "function_call":
        yield {
            "type": "response.output_item.added",
            "output_index": 0,
            "item": {**item, "arguments": "", "status": "in_progress"},
        }
        yield {"type": "response.function_call_arguments.delta", **where, "delta": item["arguments"]}
        yield {"type": "response.function_call_arguments.done", **where, "arguments": item["arguments"]}
    else:
        text = item["content"][0]["text"]
        part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        yield {
            "type": "response.output_item.added",
            "output_index": 0,
            "item": {**item, "content": [], "status": "in_progress"},
        }
        yield {"type": "response.content_part.added", **where, "content_index": 0, "part": part}
        yield {"type": "response.output_text.delta", **where, "content_index": 0, "delta": text, "logprobs": []}
        yield {"type": "response.output_text.done", **where, "content_index": 0, "text": text, "logprobs": []}
        yield {"type": "response.content_part.done", **where, "content_index": 0, "part": {**part, "text": text}}
    yield {"type": "response.output_item.done", "output_index": 0, "item": item}
    yield {"type": "response.completed", "response": completed}


def decision_record(decision: Decision) -> Json:
    if isinstance(decision, Answer):
        return {"answer": decision.text}
    return {"tool": decision.name, "arguments": decision.arguments}
