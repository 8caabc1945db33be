"""`e2b-bench diff RUN_A RUN_B [--case ID]`: the first wire exchange of a case that differs between two runs.

A case's exchanges are those its runner's wire log holds for the case's suite while the step ran (the record is
written when the step's event is read: the window is its duration and WINDOW_S more before that moment). Both
sides are normalized before they are compared: sandbox ids, the run ids, uuids, timestamps, host:port, process
ids and redacted values become placeholders, so what is left differs only where the endpoints answered (or the
clients asked) differently. Compared: method, path, status, the request headers but for those of the transport,
the start of both bodies and the stream frames.
"""

from __future__ import annotations

import difflib
import json
import re
import textwrap
from dataclasses import dataclass
from datetime import datetime, timedelta
from itertools import zip_longest
from pathlib import Path
from typing import Any

from bench.results import CaseRecord, Run
from bench.triage.evidence import WireLogs, exchange

WINDOW_S = 0.5
COLUMN = 64
IGNORED_HEADERS = {
    "host", "content-length", "date", "connection", "accept-encoding", "user-agent", "traceparent", "x-api-key",
    "x-access-token", "e2b-sandbox-id", "authorization",
}  # fmt: skip
# a field naming an id, in a body as logged (a JSON text inside the JSON of the line: its quotes escaped)
_ID_FIELDS = re.compile(r'\\*"(?:sandboxID|sandboxId|templateID|clientID|id)\\*"\s*:\s*\\*"([A-Za-z0-9_-]{6,})\\*"')
_TOKENS = (
    (re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b", re.I), "<uuid>"),
    (re.compile(r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:Z|[+-]\d{2}:?\d{2})?"), "<time>"),
    (re.compile(r"\b\d{8}T\d{6}Z[\w.+-]*"), "<run>"),
    (re.compile(r"\b(?:127\.\d+\.\d+\.\d+|localhost|\[::1\])(?::\d+)?"), "<host>"),
    (re.compile(r'(\\*"pid\\*"\s*:\s*)\d+'), r"\1<pid>"),
    # a lifetime the harness asks (scaled by the host's slowness as the run began: two runs ask differently)
    (re.compile(r'(\\*"timeout\\*"\s*:\s*)\d+'), r"\1<lifetime>"),
    (re.compile(r"\[REDACTED\]"), "<secret>"),
)


_LOGS = WireLogs()  # each wire log read once per process (and again when it has grown)


@dataclass(frozen=True)
class Difference:
    case: str
    index: tuple[int, int]  # 0-based positions of the first differing exchange on each side
    left: dict[str, Any] | None  # None: that side had no exchange there
    right: dict[str, Any] | None
    counts: tuple[int, int]

    def lines(self, names: tuple[str, str]) -> list[str]:
        """Side by side: the first differing exchange of each run, differing fields marked."""
        (at_a, at_b), (count_a, count_b) = self.index, self.counts
        head = f"{self.case}: exchange {at_a + 1} of {count_a} (A) differs from {at_b + 1} of {count_b} (B)"
        left, right = _shown(self.left), _shown(self.right)
        out = [head, f"  {names[0][:COLUMN]:<{COLUMN}} | {names[1][:COLUMN]}"]
        for key in dict.fromkeys([*left, *right]):
            a, b = left.get(key, ""), right.get(key, "")
            if key == "headers" and a == b:
                continue  # the same: only noise beside what differs
            mark = "≠" if a != b else " "
            wrapped_a = textwrap.wrap(f"{key}: {a}", COLUMN) or [""]
            wrapped_b = textwrap.wrap(f"{key}: {b}", COLUMN) or [""]
            for number, (x, y) in enumerate(zip_longest(wrapped_a[:6], wrapped_b[:6], fillvalue="")):
                out.append(f"{mark if number == 0 else ' '} {x:<{COLUMN}} | {y}")
        return out


def case_exchanges(run: Run, case: CaseRecord, logs: WireLogs | None = None) -> list[dict[str, Any]]:
    """The case's exchanges from its runner's wire log, in order, as evidence entries (with request headers)."""
    logs = logs or _LOGS
    entries = logs.entries(run.path / "wire" / f"{case.runner}.jsonl")
    try:
        end = datetime.fromisoformat(case.started_at.replace("Z", "+00:00"))
    except ValueError:
        return []
    start = end - timedelta(milliseconds=case.duration_ms or 0) - timedelta(seconds=WINDOW_S)
    chosen = []
    for entry in entries:
        if entry.get("suite", case.suite) != case.suite:
            continue
        try:
            began = datetime.fromisoformat(str(entry["ts"]).replace("Z", "+00:00"))
        except (KeyError, ValueError):
            continue
        if start <= began <= end:
            shown = exchange(entry)
            shown["headers"] = {
                k.lower(): v
                for k, v in (entry.get("request_headers") or {}).items()
                if k.lower() not in IGNORED_HEADERS
            }
            chosen.append(shown)
    return chosen


def normalized(entries: list[dict[str, Any]], run: Run) -> list[dict[str, Any]]:
    """Entries with what varies between runs and endpoints replaced by placeholders."""
    text = json.dumps([{k: v for k, v in entry.items() if k not in ("ts", "duration_ms")} for entry in entries])
    ids = sorted(set(_ID_FIELDS.findall(text)) - {"base"}, key=len, reverse=True)
    for number, found in enumerate(ids):
        text = text.replace(found, f"<id{number + 1}>")
    text = text.replace(run.run_id, "<run>")
    for pattern, placeholder in _TOKENS:
        text = pattern.sub(placeholder, text)
    result: list[dict[str, Any]] = json.loads(text)
    return result


def first_difference(run_a: Run, run_b: Run, case_id: str) -> Difference | None:
    """The first exchange of `case_id` that differs between the runs (None: the same exchanges).

    The two sides are lined up by request (method and path, difflib's matching): the window of a step may begin in
    its prerequisite's last exchanges on one side and not the other, so requests only one side has before the first
    common one are no difference; after it, a request one side lacks is one."""
    left = normalized(case_exchanges(run_a, _case(run_a, case_id)), run_a)
    right = normalized(case_exchanges(run_b, _case(run_b, case_id)), run_b)
    counts = (len(left), len(right))
    keys = [[(e.get("method"), e.get("path")) for e in side] for side in (left, right)]
    opcodes = difflib.SequenceMatcher(a=keys[0], b=keys[1], autojunk=False).get_opcodes()
    for number, (tag, i1, i2, j1, j2) in enumerate(opcodes):
        if tag == "equal":
            for offset, (a, b) in enumerate(zip(left[i1:i2], right[j1:j2], strict=True)):
                if a != b:
                    return Difference(case_id, (i1 + offset, j1 + offset), a, b, counts)
        elif number == 0 and tag in ("insert", "delete") and len(opcodes) > 1:
            continue  # one window began earlier, in the prerequisite's exchanges
        else:
            return Difference(case_id, (i1, j1), left[i1] if i1 < i2 else None, right[j1] if j1 < j2 else None, counts)
    return None


def differing_cases(run_a: Run, run_b: Run) -> list[str]:
    """Cases of both runs whose outcome differs, the non-conformant ones of RUN_B first."""
    by_id = {case.id: case for case in run_a.cases}
    both = [case for case in run_b.cases if case.id in by_id and case.suite != "housekeeping"]
    return [case.id for case in sorted(both, key=lambda c: c.conformant) if case.outcome != by_id[case.id].outcome]


class DiffError(Exception):
    pass


def _case(run: Run, case_id: str) -> CaseRecord:
    found = next((case for case in run.cases if case.id == case_id), None)
    if found is None:
        raise DiffError(f"{run.path} has no case {case_id}")
    return found


def _shown(entry: dict[str, Any] | None) -> dict[str, str]:
    if entry is None:
        return {"exchange": "(none)"}
    shown = {"request": f"{entry.get('method')} {entry.get('path')}", "status": str(entry.get("status"))}
    for key in ("headers", "request", "response", "frames", "error"):
        if key in entry and entry[key] not in (None, "", {}, []):
            value = entry[key]
            shown["body" if key == "request" else key] = value if isinstance(value, str) else json.dumps(value)
    return shown


def command(run_a: Path, run_b: Path, case_id: str) -> str:
    import shlex

    return shlex.join(["./e2b-bench", "diff", str(run_a), str(run_b), "--case", case_id])
