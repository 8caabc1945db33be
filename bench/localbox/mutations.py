"""Mutations: deviations the embedded endpoint can be told to have, made on the wire around the app.

Each mutation breaks one documented behaviour the way a compatibility layer typically does — a filter or
option it ignores, a field it drops, a status it changes, stream frames it loses or repeats — without
touching the endpoint's own code: an ASGI middleware rewrites the request before the app sees it, or the
response before the client does, or answers in the app's place. `--quirk mutations=NAME[,NAME...]` turns
them on (`Quirks.mutations`); with none on, the app is served unwrapped.

Envd's Connect messages are decoded with the same generated classes and codecs the endpoint uses (JSON or
binary protobuf, per the request's content type); stream frames are re-enveloped one by one, so a
mutated stream still streams.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, urlencode

from connectrpc.codec import proto_binary_codec, proto_json_codec
from e2b.envd.filesystem import filesystem_pb as fs_pb
from e2b.envd.process import process_pb as pb
from protobuf import Oneof
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .quirks import QuirkError

Json = Any
SANDBOX = r"/sandboxes/[^/]+"
CREATE = r"/(v2/)?sandboxes"
BIG_OUTPUT = 64 * 1024  # where a truncating endpoint cuts output and downloads


@dataclass(frozen=True)
class Mutation:
    """One deviation: where it applies (method, path regex) and what it changes."""

    doc: str
    method: str
    path: str
    query: Callable[[list[tuple[str, str]]], list[tuple[str, str]]] | None = None
    headers: Callable[[list[tuple[bytes, bytes]]], list[tuple[bytes, bytes]]] | None = None
    request_json: Callable[[Json], Json] | None = None
    request_message: Callable[[Any], None] | None = None  # a decoded RPC request, changed in place
    answer: tuple[int, Json] | None = None  # answered in the app's place, the app never sees it
    response_json: Callable[[Json, int], tuple[Json, int]] | None = None
    response_message: Callable[[Any], None] | None = None  # a decoded unary RPC response, in place
    stream: Callable[[StreamState, Any], list[Any]] | None = None  # frames to send for one decoded frame
    response_bytes: Callable[[bytes], bytes] | None = None  # a whole GET /files body
    drop_stream_end: bool = False  # a stream's end-of-stream envelope (Connect's EndStreamResponse) is never sent

    def applies(self, method: str, path: str) -> bool:
        return method == self.method and re.fullmatch(self.path, path) is not None


@dataclass
class StreamState:
    """What a stream mutation remembers between the frames of one response."""

    sent_bytes: int = 0
    frames: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


# --- the changes -----------------------------------------------------------------------------------


def _drop_param(name: str) -> Callable[[list[tuple[str, str]]], list[tuple[str, str]]]:
    return lambda params: [(key, value) for key, value in params if key != name]


def _drop_member(name: str) -> Callable[[Json], Json]:
    return lambda body: {k: v for k, v in body.items() if k != name} if isinstance(body, dict) else body


def _set_member(name: str, value: Any) -> Callable[[Json], Json]:
    return lambda body: {**body, name: value} if isinstance(body, dict) else body


def _on_success(change: Callable[[Json], Json]) -> Callable[[Json, int], tuple[Json, int]]:
    return lambda body, status: (change(body) if status < 300 else body, status)


def _status(old: int, new: int) -> Callable[[Json, int], tuple[Json, int]]:
    def change(body: Json, status: int) -> tuple[Json, int]:
        if status != old:
            return body, status
        return ({**body, "code": new} if isinstance(body, dict) and "code" in body else body), new

    return change


def _drop_headers(prefix: bytes) -> Callable[[list[tuple[bytes, bytes]]], list[tuple[bytes, bytes]]]:
    return lambda headers: [(k, v) for k, v in headers if not k.lower().startswith(prefix)]


def _event(frame: Any) -> tuple[str, Any]:
    """The kind and value of a stream frame's event: `StartResponse.event.event` or `WatchDirResponse.event`."""
    event = getattr(frame, "event", None)
    inner = event if hasattr(event, "field") else getattr(event, "event", None)
    return (inner.field, inner.value) if inner is not None else ("", None)


def _data(frame: Any) -> tuple[str, bytes] | None:
    kind, value = _event(frame)
    if kind != "data" or value is None or value.output is None:
        return None
    return value.output.field, value.output.value


def _truncate_output(state: StreamState, frame: Any) -> list[Any]:
    data = _data(frame)
    if data is None:
        return [frame]
    state.sent_bytes += len(data[1])
    return [frame] if state.sent_bytes <= BIG_OUTPUT else []


def _duplicate_big_chunks(state: StreamState, frame: Any) -> list[Any]:
    data = _data(frame)
    return [frame, frame] if data is not None and len(data[1]) > 4096 else [frame]


def _hold_output(state: StreamState, frame: Any) -> list[Any]:
    """Output held back until the command ends, then sent as one chunk per kind (what an endpoint that reads a
    command's output only at its end sends) just before the end event."""
    held: dict[str, tuple[Any, bytes]] = state.extra.setdefault("held", {})
    data = _data(frame)
    if data is not None:
        kind, chunk = data
        first, so_far = held.get(kind, (frame, b""))
        held[kind] = (first, so_far + chunk)
        return []
    if _event(frame)[0] != "end":
        return [frame]
    joined = []
    for kind, (first, output) in held.items():
        _event(first)[1].output = Oneof(kind, output)
        joined.append(first)
    held.clear()
    return [*joined, frame]


def _hold_stderr(state: StreamState, frame: Any) -> list[Any]:
    """A command's stderr held back until it ends, then sent in one chunk just before the end event (after all
    its stdout, whatever order the command wrote them in)."""
    held: list[tuple[Any, bytes]] = state.extra.setdefault("stderr", [])
    data = _data(frame)
    if data is not None and data[0] == "stderr":
        held.append((frame, data[1]))
        return []
    if _event(frame)[0] != "end" or not held:
        return [frame]
    first = held[0][0]
    _event(first)[1].output = Oneof("stderr", b"".join(chunk for _, chunk in held))
    held.clear()
    return [first, frame]


def _keep(state: StreamState, frame: Any) -> list[Any]:
    return [frame]


def _drop_stderr(state: StreamState, frame: Any) -> list[Any]:
    data = _data(frame)
    return [] if data is not None and data[0] == "stderr" else [frame]


def _drop_end(state: StreamState, frame: Any) -> list[Any]:
    return [] if _event(frame)[0] == "end" else [frame]


def _zero_exit_code(state: StreamState, frame: Any) -> list[Any]:
    kind, end = _event(frame)
    if kind == "end" and end.exit_code > 0:
        end.exit_code = 0
        end.status = "exit status 0"
        end.clear_field("error")
    return [frame]


def _drop_removes(state: StreamState, frame: Any) -> list[Any]:
    kind, event = _event(frame)
    return [] if kind == "filesystem" and event.type == fs_pb.EventType.REMOVE else [frame]


def _no_remove_events(response: Any) -> None:
    response.events = [e for e in response.events if e.type != fs_pb.EventType.REMOVE]


def _clear_envs(request: Any) -> None:
    if request.process is not None:
        request.process.envs = {}


def _clear_cwd(request: Any) -> None:
    if request.process is not None:
        request.process.clear_field("cwd")


def _depth_one(request: Any) -> None:
    request.depth = 1


def _not_recursive(request: Any) -> None:
    request.recursive = False


def _entry(change: Callable[[Any], None]) -> Callable[[Any], None]:
    def apply(response: Any) -> None:
        if response.entry is not None:
            change(response.entry)

    return apply


def _owner_root(entry: Any) -> None:
    entry.owner = entry.group = "root"


def _mtime_epoch(entry: Any) -> None:
    if entry.modified_time is not None:
        entry.modified_time.seconds, entry.modified_time.nanos = 0, 0


def _no_symlink_target(entry: Any) -> None:
    entry.clear_field("symlink_target")


def _no_processes(response: Any) -> None:
    response.processes = []


def _truncated(body: bytes) -> bytes:
    return body[:BIG_OUTPUT]


def _last_byte_dropped(body: bytes) -> bytes:
    return body[:-1]


def _running(body: Json) -> Json:
    return {**body, "state": "running"} if isinstance(body, dict) else body


MUTATIONS: dict[str, Mutation] = {
    # REST: filters, options and fields
    "list_ignores_metadata": Mutation("GET /v2/sandboxes ignores the metadata filter", "GET", "/v2/sandboxes",
                                      query=_drop_param("metadata")),
    "list_ignores_state": Mutation("GET /v2/sandboxes ignores the state filter", "GET", "/v2/sandboxes",
                                   query=_drop_param("state")),
    "list_ignores_limit": Mutation("GET /v2/sandboxes ignores limit (one page)", "GET", "/v2/sandboxes",
                                   query=_drop_param("limit")),
    "list_ignores_next_token": Mutation("GET /v2/sandboxes ignores nextToken (the first page again)", "GET",
                                        "/v2/sandboxes", query=_drop_param("nextToken")),
    "get_drops_metadata": Mutation("GET /sandboxes/{id} answers without metadata", "GET", SANDBOX,
                                   response_json=_on_success(_set_member("metadata", {}))),
    "get_state_always_running": Mutation("GET /sandboxes/{id} says running whatever the state", "GET", SANDBOX,
                                         response_json=_on_success(_running)),
    "create_ignores_timeout": Mutation("create ignores timeout (always 300 s)", "POST", CREATE,
                                       request_json=_set_member("timeout", 300)),
    "create_ignores_envs": Mutation("create ignores envVars", "POST", CREATE, request_json=_drop_member("envVars")),
    "create_ignores_internet_access": Mutation("create ignores allow_internet_access", "POST", CREATE,
                                               request_json=_drop_member("allow_internet_access")),
    "set_timeout_ignored": Mutation("POST /sandboxes/{id}/timeout answers 204 and does nothing", "POST",
                                    rf"{SANDBOX}/timeout", answer=(204, None)),
    "pause_ignored": Mutation("POST /sandboxes/{id}/pause answers 204 and does nothing", "POST", rf"{SANDBOX}/pause",
                              answer=(204, None)),
    "kill_ignored": Mutation("DELETE /sandboxes/{id} answers 204 and does nothing", "DELETE", SANDBOX,
                             answer=(204, None)),
    "not_found_as_400": Mutation("an unknown sandbox is 400, not 404", "GET", SANDBOX,
                                 response_json=_status(404, 400)),
    "bad_key_as_403": Mutation("a wrong API key is 403, not 401", "GET", "/v2/sandboxes",
                               response_json=_status(401, 403)),
    "metrics_empty": Mutation("GET /sandboxes/{id}/metrics answers []", "GET", rf"{SANDBOX}/metrics",
                              response_json=_on_success(lambda body: [])),
    # envd processes
    "start_ignores_envs": Mutation("Start ignores the command's envs", "POST", "/process.Process/Start",
                                   request_message=_clear_envs),
    "start_ignores_cwd": Mutation("Start ignores the command's cwd", "POST", "/process.Process/Start",
                                  request_message=_clear_cwd),
    "start_ignores_user": Mutation("Start ignores the requesting user", "POST", "/process.Process/Start",
                                   headers=_drop_headers(b"authorization")),
    "output_truncated": Mutation("a command's output stops after 64 KiB", "POST", "/process.Process/Start",
                                 stream=_truncate_output),
    "output_chunks_repeated": Mutation("output chunks over 4 KiB are sent twice", "POST", "/process.Process/Start",
                                       stream=_duplicate_big_chunks),
    "stderr_dropped": Mutation("stderr output is never sent", "POST", "/process.Process/Start", stream=_drop_stderr),
    "output_held": Mutation("a command's output is sent at its end, in one chunk", "POST", "/process.Process/Start",
                            stream=_hold_output),
    "stderr_held": Mutation("a command's stderr is sent at its end, after all its stdout", "POST",
                            "/process.Process/Start", stream=_hold_stderr),
    "exit_code_zeroed": Mutation("a non-zero exit is reported as exit 0", "POST", "/process.Process/Start",
                                 stream=_zero_exit_code),
    "stream_no_end_frame": Mutation("process streams (Start, Connect) end without Connect's end-of-stream frame",
                                    "POST", r"/process\.Process/(Start|Connect)", stream=_keep,
                                    drop_stream_end=True),
    "connect_drops_end": Mutation("Connect streams end without their end event", "POST", "/process.Process/Connect",
                                  stream=_drop_end),
    "process_list_empty": Mutation("List answers no process", "POST", "/process.Process/List",
                                   response_message=_no_processes),
    "pty_resize_ignored": Mutation("Update (pty resize) answers OK and does nothing", "POST",
                                   "/process.Process/Update", answer=(200, {})),
    # envd filesystem
    "list_dir_ignores_depth": Mutation("ListDir lists depth 1 whatever depth asks", "POST",
                                       "/filesystem.Filesystem/ListDir", request_message=_depth_one),
    "stat_owner_root": Mutation("Stat says every entry is owned by root", "POST", "/filesystem.Filesystem/Stat",
                                response_message=_entry(_owner_root)),
    "stat_mtime_epoch": Mutation("Stat says every entry was modified at the epoch", "POST",
                                 "/filesystem.Filesystem/Stat", response_message=_entry(_mtime_epoch)),
    "stat_drops_symlink_target": Mutation("Stat drops a symlink's target", "POST", "/filesystem.Filesystem/Stat",
                                          response_message=_entry(_no_symlink_target)),
    "remove_ignored": Mutation("Remove answers OK and removes nothing", "POST", "/filesystem.Filesystem/Remove",
                               answer=(200, {})),
    "watch_not_recursive": Mutation("WatchDir ignores recursive", "POST", "/filesystem.Filesystem/WatchDir",
                                    request_message=_not_recursive),
    "watcher_not_recursive": Mutation("CreateWatcher ignores recursive", "POST",
                                      "/filesystem.Filesystem/CreateWatcher", request_message=_not_recursive),
    "watch_drops_removes": Mutation("WatchDir never reports a remove", "POST", "/filesystem.Filesystem/WatchDir",
                                    stream=_drop_removes),
    "watcher_drops_removes": Mutation("GetWatcherEvents never reports a remove", "POST",
                                      "/filesystem.Filesystem/GetWatcherEvents", response_message=_no_remove_events),
    # envd files
    "download_truncated": Mutation("GET /files stops after 64 KiB", "GET", "/files", response_bytes=_truncated),
    "download_drops_last_byte": Mutation("GET /files loses the last byte", "GET", "/files",
                                         response_bytes=_last_byte_dropped),
    "upload_ignores_user": Mutation("POST /files ignores username", "POST", "/files", query=_drop_param("username")),
    "upload_drops_metadata": Mutation("POST /files ignores X-Metadata-* headers", "POST", "/files",
                                      headers=_drop_headers(b"x-metadata-")),
    "upload_ignores_gzip": Mutation("POST /files stores a gzip body as it came", "POST", "/files",
                                    headers=_drop_headers(b"content-encoding")),
}  # fmt: skip


# --- the middleware --------------------------------------------------------------------------------


def mutate(app: ASGIApp, names: frozenset[str]) -> ASGIApp:
    """`app` with the named mutations, or `app` itself when there are none."""
    unknown = sorted(set(names) - set(MUTATIONS))
    if unknown:
        raise QuirkError(f"unknown mutation {unknown[0]!r}; known: {', '.join(sorted(MUTATIONS))}")
    return Mutated(app, [MUTATIONS[name] for name in sorted(names)]) if names else app


def stall(app: ASGIApp, nth: int | None) -> ASGIApp:
    """`app` whose `nth` command stream of the server's life (0: every one) never ends (`stream_stall`)."""
    return app if nth is None else Stalled(app, nth)


class Stalled:
    """A command stream (`Process/Start`) that gives its output and then never its end: the end event and
    the end of the stream are held back and the connection stays open until the client leaves. What a
    remote endpoint whose stream was lost on the way looks like to a client without a read deadline."""

    PATH = "/process.Process/Start"

    def __init__(self, app: ASGIApp, nth: int) -> None:
        self.app = app
        self.nth = nth
        self.streams = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != self.PATH or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        self.streams += 1
        if self.nth and self.streams != self.nth:
            await self.app(scope, receive, send)
            return
        left = asyncio.Event()

        async def watched() -> Message:
            message = await receive()
            if message["type"] == "http.disconnect":
                left.set()
            return message

        await self.app(scope, watched, self._holding(scope, send, receive, left))

    @staticmethod
    def _holding(scope: Scope, send: Send, receive: Receive, left: asyncio.Event) -> Send:
        classes = _rpc_classes(scope["path"])
        buffer = bytearray()
        codec: Any = None
        held = False

        async def sender(message: Message) -> None:
            nonlocal codec, held
            if held:
                return  # the client has left; what the command still says goes nowhere
            if message["type"] == "http.response.start":
                content_type = dict(message.get("headers", [])).get(b"content-type", b"").decode()
                codec = _codec(content_type) if content_type.startswith("application/connect+") else None
                await send(message)
                return
            if codec is None or classes is None or message["type"] != "http.response.body":
                await send(message)
                return
            buffer.extend(message.get("body", b""))
            out = b""
            for flags, payload in _envelopes(buffer):
                if flags & 2 or _event(codec.decode(payload, classes[1]))[0] == "end":
                    held = True
                    break
                out += _envelope(flags, payload)
            if out:
                await send({"type": "http.response.body", "body": out, "more_body": True})
            if held:
                while not left.is_set():  # the request body is read: what comes next is the client leaving
                    if (await receive())["type"] == "http.disconnect":
                        left.set()

        return sender


def _rpc_classes(path: str) -> tuple[type, type] | None:
    match = re.fullmatch(r"/(process|filesystem)\.(Process|Filesystem)/(\w+)", path)
    if match is None:
        return None
    module = pb if match.group(1) == "process" else fs_pb
    request, response = (
        getattr(module, f"{match.group(3)}Request", None),
        getattr(module, f"{match.group(3)}Response", None),
    )
    return (request, response) if request and response else None


def _codec(content_type: str) -> Any:
    return proto_json_codec() if "json" in content_type else proto_binary_codec()


def _envelopes(buffer: bytearray) -> list[tuple[int, bytes]]:
    """Complete Connect envelopes (flags, payload) taken off the front of `buffer`."""
    found = []
    while len(buffer) >= 5:
        size = int.from_bytes(buffer[1:5], "big")
        if len(buffer) < 5 + size:
            break
        found.append((buffer[0], bytes(buffer[5 : 5 + size])))
        del buffer[: 5 + size]
    return found


def _envelope(flags: int, payload: bytes) -> bytes:
    return bytes([flags]) + len(payload).to_bytes(4, "big") + payload


def _header(scope: Scope, name: bytes) -> str:
    return next((v.decode("latin-1") for k, v in scope.get("headers", ()) if k.lower() == name), "")


class Mutated:
    def __init__(self, app: ASGIApp, mutations: list[Mutation]) -> None:
        self.app = app
        self.mutations = mutations

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        active = [m for m in self.mutations if m.applies(scope["method"], scope["path"])]
        if not active:
            await self.app(scope, receive, send)
            return
        scope = dict(scope)
        for mutation in active:
            if mutation.query:
                params = parse_qsl(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
                scope["query_string"] = urlencode(mutation.query(params)).encode("latin-1")
            if mutation.headers:
                scope["headers"] = mutation.headers(list(scope["headers"]))
        answer = next((m.answer for m in active if m.answer), None)
        if answer is not None:
            await self._answer(scope, receive, send, *answer)
            return
        if any(m.request_json or m.request_message for m in active):
            receive = await self._rewritten_request(scope, receive, active)
        await self.app(scope, receive, self._response_sender(scope, send, active))

    @staticmethod
    async def _answer(scope: Scope, receive: Receive, send: Send, status: int, body: Json) -> None:
        while (await receive()).get("more_body"):
            pass
        content_type = _header(scope, b"content-type") or "application/json"
        # An empty protobuf message is no bytes at all; JSON says {}.
        content = b"" if body is None or (body == {} and "proto" in content_type) else json.dumps(body).encode()
        headers = [(b"content-length", str(len(content)).encode())]
        if content:
            headers.append((b"content-type", content_type.encode()))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": content})

    async def _rewritten_request(self, scope: Scope, receive: Receive, active: list[Mutation]) -> Receive:
        body = bytearray()
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        content = bytes(body)
        content_type = _header(scope, b"content-type")
        for mutation in active:
            if mutation.request_json and content:
                content = json.dumps(mutation.request_json(json.loads(content))).encode()
            if mutation.request_message and (classes := _rpc_classes(scope["path"])):
                content = self._rewrite_message(content, content_type, classes[0], mutation.request_message)
        scope["headers"] = [(k, v) for k, v in scope["headers"] if k.lower() != b"content-length"] + [
            (b"content-length", str(len(content)).encode())
        ]
        sent = False

        async def replay() -> Message:
            nonlocal sent
            if sent:
                return await receive()
            sent = True
            return {"type": "http.request", "body": content, "more_body": False}

        return replay

    @staticmethod
    def _rewrite_message(content: bytes, content_type: str, cls: type, change: Callable[[Any], None]) -> bytes:
        codec = _codec(content_type)
        if content_type.startswith("application/connect+"):
            buffer = bytearray(content)
            out = b""
            for flags, payload in _envelopes(buffer):
                message = codec.decode(payload, cls)
                change(message)
                out += _envelope(flags, codec.encode(message))
            return out
        message = codec.decode(content, cls)
        change(message)
        return codec.encode(message)

    def _response_sender(self, scope: Scope, send: Send, active: list[Mutation]) -> Send:
        streams = [m.stream for m in active if m.stream]
        whole = [m for m in active if m.response_json or m.response_message or m.response_bytes]
        if streams:
            return self._stream_sender(scope, send, streams, any(m.drop_stream_end for m in active))
        if whole:
            return self._buffered_sender(scope, send, whole)
        return send

    def _stream_sender(
        self, scope: Scope, send: Send, streams: list[Callable[[StreamState, Any], list[Any]]], drop_end: bool
    ) -> Send:
        classes = _rpc_classes(scope["path"])
        buffer = bytearray()
        state = StreamState()
        codec: Any = None

        async def sender(message: Message) -> None:
            nonlocal codec
            if message["type"] == "http.response.start":
                headers = dict(message.get("headers", []))
                content_type = headers.get(b"content-type", b"").decode()
                codec = _codec(content_type) if content_type.startswith("application/connect+") else None
                await send(message)
                return
            if codec is None or classes is None or message["type"] != "http.response.body":
                await send(message)
                return
            buffer.extend(message.get("body", b""))
            out = b""
            for flags, payload in _envelopes(buffer):
                if flags & 2:  # the end-of-stream envelope (trailers, error): passed as it is, or dropped
                    out += b"" if drop_end else _envelope(flags, payload)
                    continue
                frames = [codec.decode(payload, classes[1])]
                for change in streams:
                    frames = [result for frame in frames for result in change(state, frame)]
                state.frames += 1
                out += b"".join(_envelope(flags, codec.encode(frame)) for frame in frames)
            await send({"type": "http.response.body", "body": out, "more_body": message.get("more_body", False)})

        return sender

    def _buffered_sender(self, scope: Scope, send: Send, whole: list[Mutation]) -> Send:
        start: dict[str, Any] = {}
        body = bytearray()

        async def sender(message: Message) -> None:
            if message["type"] == "http.response.start":
                start.update(message)
                return
            if message["type"] != "http.response.body":
                await send(message)
                return
            body.extend(message.get("body", b""))
            if message.get("more_body"):
                return
            status, content = self._rewrite_response(scope, start, bytes(body), whole)
            headers = [(k, v) for k, v in start.get("headers", []) if k.lower() != b"content-length"]
            headers.append((b"content-length", str(len(content)).encode()))
            await send({**start, "status": status, "headers": headers})
            await send({"type": "http.response.body", "body": content})

        return sender

    @staticmethod
    def _rewrite_response(
        scope: Scope, start: dict[str, Any], content: bytes, whole: list[Mutation]
    ) -> tuple[int, bytes]:
        status = int(start.get("status", 200))
        content_type = dict(start.get("headers", [])).get(b"content-type", b"").decode()
        for mutation in whole:
            if mutation.response_json and content and "json" in content_type:
                body, status = mutation.response_json(json.loads(content), status)
                content = json.dumps(body).encode()
            if mutation.response_message and status == 200 and (classes := _rpc_classes(scope["path"])):
                codec = _codec(content_type)
                message = codec.decode(content, classes[1])
                mutation.response_message(message)
                content = codec.encode(message)
            if mutation.response_bytes and status == 200:
                content = mutation.response_bytes(content)
        return status, content
