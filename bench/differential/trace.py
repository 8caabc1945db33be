"""A case's trace: the traced exchanges its runner made while it ran, as the judgement compares them.

Each exchange is keyed by its method and route (ids in the path replaced by `{id}`), stamped with when it began
(`at`, the moment a time in its answer is measured from) and carries its status and the proxy's `trace` of both
bodies (bench/differential/capture.py).
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit

# A path segment that names something (a sandbox, snapshot, template, build): long, or a mix of letters and digits.
_ID_SEGMENT = re.compile(r"^(?=.*\d)[A-Za-z0-9_-]{6,}$|^[A-Za-z0-9_-]{16,}$")
_NAMED_AFTER = frozenset({"sandboxes", "snapshots", "templates", "builds", "volumes"})


def route(path: str) -> str:
    """`/sandboxes/ab12cd34ef/timeout` -> `/sandboxes/{id}/timeout` (an RPC's or envd's path is kept)."""
    segments = path.split("/")
    shown = []
    for index, segment in enumerate(segments):
        before = segments[index - 1] if index else ""
        named = before in _NAMED_AFTER and segment and "." not in segment
        shown.append("{id}" if named or (segment and "." not in segment and _ID_SEGMENT.match(segment)) else segment)
    return "/".join(shown)


def exchange(entry: dict[str, Any]) -> dict[str, Any] | None:
    """A wire log line as one exchange of a trace (None: the line has no trace)."""
    traced = entry.get("trace")
    if not isinstance(traced, dict):
        return None
    path = urlsplit(str(entry.get("url", ""))).path
    shown: dict[str, Any] = {
        "key": f"{entry.get('method', '')} {route(path)}",
        "at": str(entry.get("ts", "")),
        "status": entry.get("status"),
        "ms": entry.get("duration_ms"),
    }
    for part in ("request", "answer", "probe"):
        if isinstance(traced.get(part), dict):
            shown[part] = traced[part]
    return shown


def case_trace(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The traced exchanges among `entries` (a case's wire window), in the order they began."""
    found = [shown for entry in entries if (shown := exchange(entry)) is not None]
    return sorted(found, key=lambda shown: shown["at"])
