"""Causes: a run's non-conformant cases grouped by their symptom, largest first (`causes.json`).

A symptom's signature is what the runner observed (its outcome) and the failing check's message with
what differs from case to case normalized away: uuids, timestamps, hosts and ports, paths, ids (hex
digests too) and numbers (HTTP statuses kept). Where only the client's language differs, the message is normalized too:
`NotFoundException:` and `NotFoundError:` (or `AssertionError [ERR_ASSERTION]:`) name one error, quotes
are one quote, `True`/`False`/`None` are `true`/`false`/`null`. One broken behaviour seen through many
cases, runners and languages is then one cause; two symptoms of one case stay two causes.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.expectations import symptom_text
from bench.redaction import Redactor
from bench.results import CaseRecord, Run, atomic_write, read_run, utc_now, validate
from bench.verdict import rerun_command

CAUSES_JSON = "causes.json"
CAUSES_SCHEMA = "e2b-bench/causes/1"
SIGNATURE_CHARS = 240  # of a normalized message: long tails (stderr, bodies) differ by more than ids
MATCH_CHARS = 120  # of a message: what a generated `match` pins (its start names the failing check)

# (name, pattern, normalized text or None to keep, regex the raw text must match or None to escape it);
# where two match at one position the earlier rule wins.
_RULES: tuple[tuple[str, str, str | None, str | None], ...] = (
    ("uuid", r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b", "<uuid>", r"\S+?"),
    ("time", r"\b\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:Z|[+-]\d{2}:?\d{2})?", "<time>", r"\S+?"),
    ("url", r"\b[a-z][a-z0-9+.-]*://[^\s/\"'<>]+", "<host>", r"\S+?"),
    ("hostport", r"\b(?:\d{1,3}(?:\.\d{1,3}){3}|localhost):\d{1,5}\b", "<host>", r"\S+?"),
    ("status", r"\b(?i:status(?: code)?|http|code)[ :=]*[1-5]\d\d\b|\b[1-5]\d\d(?= [A-Z][a-z])", None, None),
    # What differs by the client's language only: how a call, an error and a name are written.
    ("call", r"\b[A-Za-z_][\w.]*\([^()]*\)", None, None),
    ("exception", r"(?:^|(?<=: ))\w+?(?:Exception|Error)(?: \[\w+\])?:(?: \[[a-z_]+\])?", None, None),
    ("path", r"(?<![\w.:/<>-])(?:~|\.{1,2})?/[\w.@%+=~-]+(?:/[\w.@%+=~-]*)*", "<path>", r"\S+?"),
    # ids and hex digests alike: eight or more letters and digits, both present
    ("id", r"\b(?=[A-Za-z0-9]*\d)(?=[A-Za-z0-9]*[A-Za-z])[A-Za-z0-9]{8,}\b", "<id>", r"\w+?"),
    ("name", r"\b[a-z][a-z0-9]*(?:[A-Z][a-z0-9]+)+\b|\b[a-z][a-z0-9]*(?:_[a-z0-9]+)+\b", None, None),
    ("number", r"(?<![\w.])-?\d+(?:\.\d+)?(?!\.?\d)(?=(?:ms|s|B|KiB|MiB|bytes)?\b)", "<n>", r"-?\d+(?:\.\d+)?"),
    ("separator", r"\s*[,:]\s*", None, None),
    ("quote", r"\\?[\"']", '"', r"\\?[\"']"),  # an escaped quote too: JSON quoted in JSON
    ("literal", r"\b(?:True|False|None|true|false|null)\b", None, None),
)
_SCANNER = re.compile("|".join(f"(?P<{name}>{pattern})" for name, pattern, _, _ in _RULES))
_BY_NAME = {name: (text, regex) for name, _, text, regex in _RULES}
_EXCEPTION = re.compile(r"^(?P<name>\w+?)(?:Exception|Error)")
_LITERALS = {"True": "true", "False": "false", "None": "null"}
_PYTHON_LITERALS = {value: key for key, value in _LITERALS.items()}
_HUMP = re.compile(r"(?<=[a-z0-9])([A-Z])")
# What clients put before the endpoint's own words: a status (`400: `), a code (`unsupported_option: `, the
# npm SDK's `[invalid_argument] `), as many as there are.
_REFUSAL_CODE = re.compile(r"^(?:(?:[1-5]\d\d|\[[a-z_]+\]|[a-z]+_[a-z_]+):?\s+)+")


def _escape(text: str) -> str:
    return re.escape(text).replace("\\ ", " ")


def _snake(name: str) -> str:
    return _HUMP.sub(lambda m: "_" + m[1].lower(), name)


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def _name(name: str) -> tuple[str, str]:
    """A name in either spelling (`get_metrics`, `getMetrics`): the snake one, and a regex for both."""
    snake = _snake(name)
    spellings = sorted({snake, _camel(snake), name}, key=len, reverse=True)
    return snake, _escape(name) if len(spellings) == 1 else "(?:" + "|".join(map(_escape, spellings)) + ")"


def _token(kind: str, raw: str) -> tuple[str, str]:
    """What a scanned token becomes in the normalized text, and the regex matching it in any message."""
    shown, pattern = _BY_NAME[kind]
    if kind == "call":
        name = raw.split("(", 1)[0]
        parts = [_name(part) for part in name.split(".")]
        return ".".join(p[0] for p in parts) + "(…)", r"\.".join(p[1] for p in parts) + r"\([^()]*\)"
    if kind == "exception":
        found = _EXCEPTION.match(raw)
        stem = found["name"] if found else raw
        return f"{stem}Error:", _escape(stem) + r"(?:Exception|Error)(?: \[\w+\])?:(?: \[[a-z_]+\])?"
    if kind == "name":
        return _name(raw)
    if kind == "separator":
        mark = raw.strip()
        return f"{mark} ", rf"\s*{re.escape(mark)}\s*"
    if kind == "literal":
        lower = _LITERALS.get(raw, raw)
        return lower, f"(?:{_PYTHON_LITERALS[lower]}|{lower})"
    return (raw if shown is None else shown), (_escape(raw) if pattern is None else pattern)


@dataclass(frozen=True)
class Symptom:
    """One message cut into what stays (`normalized`) and a regex any message of the same symptom matches."""

    normalized: str
    regex: str


def symptom(message: str, limit: int | None = None) -> Symptom:
    """Normalize `message` (first `limit` characters of it, cut between tokens, when given)."""
    text = " ".join(message.split())
    normalized: list[str] = []
    regex: list[str] = []
    position = 0
    for found in _SCANNER.finditer(text):
        if limit is not None and found.start() > limit:
            break
        literal = text[position : found.start()]
        normalized.append(literal)
        regex.append(_escape(literal))
        shown, pattern = _token(found.lastgroup or "", found.group())
        normalized.append(shown)
        regex.append(pattern)
        position = found.end()
    else:
        tail = text[position:] if limit is None else text[position : max(position, limit)]
        normalized.append(tail)
        regex.append(_escape(tail))
    return Symptom("".join(normalized).strip(), "".join(regex).strip())


def observed_outcome(case: CaseRecord) -> str:
    """What the runner saw, before a judgement turned it into `deviation` (a refusal or match that differed)."""
    return str(case.details.get("observed_outcome") or case.outcome)


def message(case: CaseRecord) -> str:
    """The one line a cause of this case is about: the failing check's message, or why the judgement failed."""
    if case.outcome == "pass":
        return f"passed, declared {case.expected}: stale declaration"
    if case.note and case.note.startswith("refused differently"):
        return f"{case.note}: {case.error or ''}".rstrip(": ")
    refusal = _refusal(case)
    if refusal is not None:
        # the endpoint's own words: the same refusal reads alike whichever client or route met it
        code = case.details.get("error_code")
        return f"{code}: {refusal}" if isinstance(code, str) and code else refusal
    return case.error or case.note or f"{case.outcome} without a message"


def _refusal(case: CaseRecord) -> str | None:
    """The endpoint's message of a refusal the runner observed, without the npm SDK's `[code]` prefix."""
    text = case.details.get("message")
    if observed_outcome(case) != "refused" or not isinstance(text, str) or not text:
        return None
    return _REFUSAL_CODE.sub("", text)


def endpoint_words(case: CaseRecord) -> str | None:
    """What the endpoint itself said: a refusal's message, or the message of the error an SDK raised from
    the endpoint's answer (None for a failed check of the harness's own, or a judgement that differed)."""
    if case.outcome == "pass" or (case.note or "").startswith("refused differently"):
        return None
    refusal = _refusal(case)
    if refusal is not None:
        return refusal
    raised = case.details.get("raised")
    text = raised.get("message") if isinstance(raised, dict) else None
    return _REFUSAL_CODE.sub("", text) if isinstance(text, str) and text.strip() else None


def signature(case: CaseRecord) -> str:
    """Equal for cases that fail the same way: `endpoint: <its words>` when the endpoint said why (one refusal
    met by a probe, a behaviour's SDK exception and a raw request is one cause), else `<observed outcome>:
    <message>`, normalized."""
    words = endpoint_words(case)
    if words is not None:
        return f"endpoint: {symptom(words).normalized[:SIGNATURE_CHARS]}"
    return f"{observed_outcome(case)}: {symptom(message(case)).normalized[:SIGNATURE_CHARS]}"


@dataclass(frozen=True)
class Cause:
    """Non-conformant cases that share one symptom signature."""

    signature: str
    cases: tuple[CaseRecord, ...]

    @property
    def key(self) -> str:
        """Stable across runs: the signature's digest (a cause keeps its key while its symptom stays)."""
        return hashlib.sha256(self.signature.encode()).hexdigest()[:10]

    @property
    def outcomes(self) -> list[str]:
        """The outcomes its cases' runners observed, the most frequent first."""
        counts = Counter(observed_outcome(case) for case in self.cases)
        return sorted(counts, key=lambda outcome: (-counts[outcome], outcome))

    @property
    def outcome(self) -> str:
        return self.outcomes[0]

    @property
    def representative(self) -> CaseRecord:
        """The case to look at first: one that carries wire evidence, else the first by id."""
        return next((case for case in self.cases if case.evidence), self.cases[0])

    @property
    def stale(self) -> bool:
        return self.cases[0].outcome == "pass"

    def match(self) -> str | None:
        """A regex found in every case's symptom (the start of the message, normalized parts left open); None
        when no such regex is found (or for stale declarations, which have no symptom)."""
        if self.stale:
            return None
        example = self.representative
        pattern = symptom(endpoint_words(example) or message(example), MATCH_CHARS).regex
        if not pattern:
            return None
        compiled = re.compile(pattern)
        found = all(compiled.search(symptom_text(c.error, c.details)) for c in self.cases)
        return pattern if found else None


def find_causes(cases: Iterable[CaseRecord]) -> list[Cause]:
    """The non-conformant cases (a retried case by its last record) grouped by signature, largest first."""
    latest = {case.id: case for case in cases}
    groups: dict[str, list[CaseRecord]] = {}
    for case in sorted(latest.values(), key=lambda c: c.id):
        if not case.conformant:
            groups.setdefault(signature(case), []).append(case)
    causes = [Cause(sig, tuple(found)) for sig, found in groups.items()]
    return sorted(causes, key=lambda cause: (-len(cause.cases), cause.signature))


def headline(causes: Sequence[Cause]) -> str:
    """`189 failing cases, 9 causes`."""
    failing = sum(len(cause.cases) for cause in causes)
    return f"{failing} failing case{'s' if failing != 1 else ''}, {len(causes)} cause{'s' if len(causes) != 1 else ''}"


def cause_document(run: Run, cause: Cause) -> dict[str, Any]:
    """One cause as causes.json holds it (and the report and terminal show it)."""
    example = cause.representative
    runners = sorted({case.runner for case in cause.cases})
    pins = run.header.get("pins") or {}
    return {
        "key": cause.key,
        "signature": cause.signature,
        "outcome": cause.outcome,
        "outcomes": cause.outcomes,
        "expected": sorted({case.expected for case in cause.cases}),
        "count": len(cause.cases),
        "suites": sorted({case.suite for case in cause.cases}),
        "runners": runners,
        "pins": {runner: dict(pins.get(runner) or {}) for runner in runners},  # none for the harness's own
        "message": message(example),
        "match": cause.match(),
        "representative": {
            "id": example.id,
            "rerun": rerun_command(run, example),
            "evidence": list(example.evidence or []),
        },
        "cases": [case.id for case in cause.cases],
    }


def causes_document(run: Run) -> dict[str, Any]:
    causes = find_causes(run.cases)
    return {
        "schema": CAUSES_SCHEMA,
        "run_id": run.run_id,
        "written_at": utc_now(),
        "headline": headline(causes),
        "failing": sum(len(cause.cases) for cause in causes),
        "causes": [cause_document(run, cause) for cause in causes],
    }


def write_causes(run_path: Path, redactor: Redactor | None = None) -> Path:
    """`causes.json` of a finished (or cut short) run, validated, redacted."""
    document = (redactor or Redactor()).redact_obj(causes_document(read_run(run_path, allow_truncated=True)))
    validate("causes", document, where=str(run_path / CAUSES_JSON))
    target = run_path / CAUSES_JSON
    atomic_write(target, json.dumps(document, indent=2, ensure_ascii=False) + "\n")
    return target


def terminal_lines(run: Run, width: int = 100) -> list[str]:
    """What `report RUN --causes` prints: the headline, then each cause with its cases and one re-run line."""
    causes = find_causes(run.cases)
    lines = [f"{run.run_id}: {headline(causes)}"]
    for number, cause in enumerate(causes, start=1):
        document = cause_document(run, cause)
        shown = " ".join(document["message"].split())
        shown = shown if len(shown) <= width else shown[: width - 1] + "…"
        lines.append(f"\n{number}. {'/'.join(cause.outcomes)} x{len(cause.cases)} [{cause.key}] {shown}")
        lines.append(f"   suites: {', '.join(document['suites'])}; runners: {', '.join(document['runners'])}")
        for case in cause.cases:
            lines.append(f"   - {case.id}")
        lines.append(f"   re-run {document['representative']['id']}: {document['representative']['rerun']}")
    return lines
