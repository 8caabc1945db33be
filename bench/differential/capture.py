"""What the wire proxy keeps of each exchange for the differential judgement (bench/differential/).

A `Capture` is fed the bytes of both bodies as they pass and is summed up once, when the exchange's wire line is
written (`trace` on the line): a JSON answer (REST, a Connect unary call) as its leaves, a Connect stream as its
messages in arrival order (each message's leaves), any other body as its size and digest. A body is kept whole up
to KEEP_BYTES (answers are small; beyond it only the size and digest are kept), decoded, and redacted by the run's
Redactor like every other byte of the log. Turned off by E2B_BENCH_DIFFERENTIAL=0 (`run --no-differential`).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import struct
import zlib
from collections.abc import Mapping
from typing import Any, Protocol

DIFFERENTIAL_ENV = "E2B_BENCH_DIFFERENTIAL"  # "0": no trace is captured and no case is judged against a reference
KEEP_BYTES = 256 * 1024
MAX_MESSAGES = 400  # of a stream; past it the count only
MAX_TEXT = 240  # a string leaf longer than this is kept as its start, its length and its digest
ENVELOPE = struct.Struct(">BI")  # a Connect stream message: flags, then its length


class Redacting(Protocol):
    def redact_obj(self, o: Any) -> Any: ...


RECORD = "record"  # E2B_BENCH_DIFFERENTIAL=record: traces captured and written, no case judged (`reference`)


def _mode(environ: Mapping[str, str] | None) -> str:
    return (os.environ if environ is None else environ).get(DIFFERENTIAL_ENV, "1").strip().lower()


def enabled(environ: Mapping[str, str] | None = None) -> bool:
    """Whether traces are captured (unless E2B_BENCH_DIFFERENTIAL is 0/false/no/off)."""
    return _mode(environ) not in ("0", "false", "no", "off")


def judging(environ: Mapping[str, str] | None = None) -> bool:
    """Whether cases are judged against their reference (traces captured, and not only recorded)."""
    return enabled(environ) and _mode(environ) != RECORD


class Capture:
    """Both bodies of one exchange, as much as the judgement needs."""

    def __init__(self, headers: dict[str, str] | None = None) -> None:
        self.request = _Body()
        self.response = _Body()
        self.headers = headers or {}  # the request's headers as sent (credentials for a probe): never written
        self.probe: dict[str, Any] | None = None  # what bench/differential/probe.py saw after the exchange
        self.before: dict[str, Any] = {}  # what it saw before the call (an upload's path's inode, an environment)

    def summary(
        self, request_headers: dict[str, str], response_headers: dict[str, str], redactor: Redacting
    ) -> dict[str, Any]:
        """The exchange as the judgement reads it: `request`/`answer` (leaves), or `messages` (a stream's, each
        its leaves), or `body` (size and digest)."""
        shown: dict[str, Any] = {}
        for name, body, headers in (
            ("request", self.request, request_headers),
            ("answer", self.response, response_headers),
        ):
            part = body.summary(headers, redactor)
            if part is not None:
                shown[name] = part
        if self.probe:
            shown["probe"] = {"leaves": _cut(redactor.redact_obj(self.probe))}
        return shown


class _Body:
    def __init__(self) -> None:
        self.kept = bytearray()
        self.size = 0
        self.digest = hashlib.sha256()

    def feed(self, chunk: bytes) -> None:
        self.size += len(chunk)
        self.digest.update(chunk)
        if len(self.kept) < KEEP_BYTES:
            self.kept += chunk[: KEEP_BYTES - len(self.kept)]

    def summary(self, headers: dict[str, str], redactor: Redacting) -> Any:
        if not self.size:
            return None
        media = headers.get("content-type", "").split(";")[0].strip().lower()
        whole = self.size <= KEEP_BYTES
        data = bytes(self.kept)
        if whole and headers.get("content-encoding", "").strip().lower() in ("gzip", "deflate"):
            try:
                data = zlib.decompress(data, zlib.MAX_WBITS | 32)
            except zlib.error:
                whole = False
        if whole and media.startswith("application/connect+json"):
            messages = merged([(flags, _leaves_of(payload, redactor)) for flags, payload in envelopes(data)])
            if len(messages) > MAX_MESSAGES:
                messages = [*messages[: MAX_MESSAGES - 1], messages[-1]]
            return {"messages": messages}
        if media.startswith("application/connect+"):
            return {"messages": [{"cut": True}]}  # too long to keep: no end trailer, so never judged
        if whole and (media == "application/json" or media.endswith("+json")):
            return {"leaves": _cut(_leaves_of(data, redactor))}
        if whole and len(data) != self.size:  # decoded (gzip): its size and digest, not the encoding's
            return {"body": {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()[:16]}}
        return {"body": {"bytes": self.size, "sha256": self.digest.hexdigest()[:16]}}


def envelopes(data: bytes) -> list[tuple[int, bytes]]:
    """The complete Connect envelopes of a stream's bytes: (flags, payload)."""
    found = []
    offset = 0
    while offset + ENVELOPE.size <= len(data):
        flags, length = ENVELOPE.unpack_from(data, offset)
        payload = data[offset + ENVELOPE.size : offset + ENVELOPE.size + length]
        if len(payload) < length:
            break
        found.append((flags, payload))
        offset += ENVELOPE.size + length
    return found


def _leaves_of(payload: bytes, redactor: Redacting) -> dict[str, Any]:
    try:
        document = json.loads(payload)
    except ValueError:
        return {"": payload.decode("utf-8", "replace")}
    return leaves(redactor.redact_obj(document))


def leaves(document: Any, prefix: str = "") -> dict[str, Any]:
    """A JSON document's leaves by dotted path; an array's items under `path[]`, their values in a list (an
    empty object or array is a leaf of its own). Base64 output of a command (`...stdout`/`stderr`/`pty`) is
    decoded to text."""
    found: dict[str, Any] = {}

    def walk(value: Any, path: str, in_array: bool) -> None:
        if isinstance(value, dict) and value:
            for key, item in value.items():
                walk(item, f"{path}.{key}" if path else str(key), in_array)
            return
        if isinstance(value, list) and value:
            for item in value:
                walk(item, f"{path}[]", True)
            return
        if isinstance(value, str):
            value = _decoded(path, value)
        if in_array:
            found.setdefault(path, []).append(value)
        else:
            found[path] = value

    walk(document, prefix, False)
    return found


_OUTPUT_LEAVES = ("stdout", "stderr", "pty")


def merged(messages: list[tuple[int, dict[str, Any]]]) -> list[dict[str, Any]]:
    """A stream's messages as the judgement compares them: consecutive messages carrying only output of one
    stream (how a command's output is cut into messages depends on timing) joined into one; the end-of-stream
    trailer marked `end`; long texts cut."""
    joined: list[dict[str, Any]] = []
    for flags, message in messages:
        if flags & 2:
            message = {"end": True, **message}
        ((path, value),) = message.items() if len(message) == 1 else ((None, None),)
        last = joined[-1] if joined else None
        if (
            path is not None
            and path.rsplit(".", 1)[-1] in _OUTPUT_LEAVES
            and isinstance(value, str)
            and last is not None
            and list(last) == [path]
        ):
            last[path] += value
            continue
        joined.append(dict(message))
    return [_cut(message) for message in joined]


def _cut(found: dict[str, Any]) -> dict[str, Any]:
    return {
        path: [_text(v) if isinstance(v, str) else v for v in value] if isinstance(value, list)
        else _text(value) if isinstance(value, str) else value
        for path, value in found.items()
    }  # fmt: skip


def _decoded(path: str, value: str) -> str:
    if path.rsplit(".", 1)[-1] not in _OUTPUT_LEAVES:
        return value
    try:
        return base64.b64decode(value, validate=True).decode("utf-8", "replace")
    except (binascii.Error, ValueError):
        return value


def _text(value: str) -> str:
    if len(value) <= MAX_TEXT:
        return value
    digest = hashlib.sha256(value.encode("utf-8", "replace")).hexdigest()[:16]
    return f"{value[:64]}…[{len(value)} chars, sha256 {digest}]"
