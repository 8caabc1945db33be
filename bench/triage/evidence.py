"""Evidence of a failing case: the HTTP/envd exchanges its runner made while the case ran.

A runner runs its steps one after another through its own wire proxy (bench/wire.py), so the exchanges
of a step are those its proxy logged for that suite that started while the step ran. A runner stamps each
step's `start` event with the moment it began (`at`, on the host's wall clock, which the proxy's log also
uses): the step ran from then for its own duration (SOURCE_MARGIN_S more, for rounding), whenever the
harness got to read its events. A step without that stamp (a runner that sends no `start`, a step blocked by
a prerequisite) is placed on the harness's clock: it ended no later than the moment its event was read and no
later than the next step began; it began its duration and WINDOW_MARGIN_S before that end. Entries are bounded
(MAX_EXCHANGES, each body and frame cut) and were redacted when the wire log was written.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

WINDOW_MARGIN_S = 0.1
SOURCE_MARGIN_S = 0.005
MAX_EXCHANGES = 12
BODY_CHARS = 600
FRAME_CHARS = 300
MAX_FRAMES = 9


@dataclass(frozen=True)
class StepSeen:
    """A step event as the harness read it: which step, when, the duration the runner measured and, when the
    runner stamped its `start` event, the moment the step began on the runner's side."""

    step: str
    read_at: datetime
    duration_ms: float | None
    started: datetime | None = None

    @property
    def duration(self) -> timedelta:
        return timedelta(milliseconds=self.duration_ms or 0)

    def began(self) -> datetime:
        """When the step began: its runner's stamp, else its event's reading less its duration."""
        return self.started if self.started is not None else self.read_at - self.duration


@dataclass(frozen=True)
class Window:
    """When a step ran."""

    start: datetime
    end: datetime

    @classmethod
    def of_step(cls, seen: list[StepSeen], index: int) -> Window:
        """The window of `seen[index]`, `seen` being one runner's step events of one suite in order."""
        step = seen[index]
        if step.started is not None:
            return cls(step.started, step.started + step.duration + timedelta(seconds=SOURCE_MARGIN_S))
        end = step.read_at
        if index + 1 < len(seen):
            end = min(end, seen[index + 1].began())
        return cls(end - step.duration - timedelta(seconds=WINDOW_MARGIN_S), end)


def stamped(at: object) -> datetime | None:
    """A runner's `at` (seconds since the epoch) as a moment, None when it is absent or not a plausible one."""
    if not isinstance(at, int | float) or isinstance(at, bool):
        return None
    try:
        return datetime.fromtimestamp(at, UTC)
    except (OverflowError, OSError, ValueError):
        return None


@dataclass
class WireLogs:
    """The wire logs of one run, each read once: a log that has grown is read on from where it was (a log is only
    appended to; a line not yet whole is read again with its rest)."""

    _lines: dict[Path, tuple[int, list[dict[str, Any]]]] = field(default_factory=dict)

    def entries(self, path: Path) -> list[dict[str, Any]]:
        try:
            size = path.stat().st_size
        except OSError:
            return []
        offset, lines = self._lines.get(path, (0, []))
        if size < offset:  # not the log it was: read it whole
            offset, lines = 0, []
        if size > offset:
            with path.open("rb") as handle:
                handle.seek(offset)
                data = handle.read(size - offset)
            whole = data.rfind(b"\n") + 1
            for text in data[:whole].decode("utf-8", errors="replace").split("\n"):
                if not text.strip():
                    continue
                try:
                    lines.append(json.loads(text))
                except ValueError:
                    continue  # a line cut by a killed proxy
            offset += whole
            self._lines[path] = (offset, lines)
        return lines

    def evidence(self, path: Path, suite: str, window: Window) -> list[dict[str, Any]]:
        """The exchanges logged in `path` for `suite` that started within `window`, bounded."""
        return bounded(self.window(path, suite, window))

    def window(self, path: Path, suite: str, window: Window) -> list[dict[str, Any]]:
        """The lines logged in `path` for `suite` whose exchange started within `window`, as logged."""
        return [
            entry
            for entry in self.entries(path)
            if entry.get("suite", suite) == suite and (started := _time(entry)) is not None
            and window.start <= started <= window.end
        ]  # fmt: skip


def _time(entry: dict[str, Any]) -> datetime | None:
    try:
        return datetime.fromisoformat(str(entry["ts"]).replace("Z", "+00:00"))
    except (KeyError, ValueError):
        return None


def _failed(entry: dict[str, Any]) -> bool:
    status = entry.get("status")
    return bool(entry.get("error")) or status is None or status >= 400


def bounded(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """At most MAX_EXCHANGES in order: the failed ones first chosen, then the latest (a failure ends a step)."""
    if len(entries) <= MAX_EXCHANGES:
        kept = list(range(len(entries)))
    else:
        failed = [i for i, entry in enumerate(entries) if _failed(entry)][:MAX_EXCHANGES]
        rest = [i for i in range(len(entries)) if i not in set(failed)]
        kept = sorted(failed + rest[len(rest) - (MAX_EXCHANGES - len(failed)) :])
    shown = [exchange(entries[i]) for i in kept]
    if shown and len(entries) > len(kept):
        shown[0]["omitted"] = len(entries) - len(kept)
    return shown


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def exchange(entry: dict[str, Any]) -> dict[str, Any]:
    """One wire log line as evidence: method, path, status, and the start of bodies and stream frames."""
    url = urlsplit(str(entry.get("url", "")))
    shown: dict[str, Any] = {
        "ts": str(entry.get("ts", "")),
        "method": str(entry.get("method", "")),
        "path": url.path + (f"?{url.query}" if url.query else ""),
        "status": entry.get("status"),
        "duration_ms": max(0.0, float(entry.get("duration_ms") or 0)),
    }
    if entry.get("error"):
        shown["error"] = _cut(str(entry["error"]), BODY_CHARS)
    for source, target in (("request_excerpt", "request"), ("response_excerpt", "response")):
        if entry.get(source):
            shown[target] = _cut(str(entry[source]), BODY_CHARS)
    frames = [str(frame) for frame in entry.get("frames") or []]
    if frames:
        if len(frames) > MAX_FRAMES:
            frames = [*frames[: MAX_FRAMES // 2], "…", *frames[-(MAX_FRAMES - MAX_FRAMES // 2 - 1) :]]
        shown["frames"] = [_cut(frame, FRAME_CHARS) for frame in frames]
    return shown


def lines(evidence: list[dict[str, Any]]) -> list[str]:
    """Evidence as text lines, for the report and the terminal."""
    shown = []
    for entry in evidence:
        if entry.get("omitted"):
            shown.append(f"… {entry['omitted']} earlier exchange(s) of this case left out")
        line = f"{entry['ts'][11:23]} {entry['method']} {entry['path']} → {entry['status']}"
        if entry.get("duration_ms") is not None:
            line += f" ({entry['duration_ms']:.1f} ms)"
        if entry.get("error"):
            line += f" error: {entry['error']}"
        shown.append(line)
        for part in ("request", "response"):
            if entry.get(part):
                shown.append(f"    {part}: {entry[part]}")
        for frame in entry.get("frames") or []:
            shown.append(f"    frame: {frame}")
    return shown
