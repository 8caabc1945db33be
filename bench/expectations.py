"""What an endpoint is documented to do (`expectations/<endpoint>.toml`) and how a case is judged."""

from __future__ import annotations

import json
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

from bench.results import OUTCOMES, Outcome

# A runner whose SDK pin lacks a feature skips with this reason; that is never the endpoint's fault.
SDK_GAP = "sdk_gap"  # the runner protocol's structured skip reason (step event `skip.reason`)
SDK_GAP_PREFIX = "not in this SDK"
# Skips that are no verdict on the endpoint: the SDK lacks the API; the suite declares the test needs what the
# endpoint cannot give (`needs`: bench/upstream/plan.py); E2B's own test skips itself (`upstream`).
# A case that could not run because a case it needs failed as declared: that declared difference is its verdict
# (bench/conformance.py; it runs, and is judged itself, once the declaration goes stale).
DECLARED_PREREQUISITE = "declared_prerequisite"
CONFORMANT_SKIPS = (SDK_GAP, "needs", "upstream", DECLARED_PREREQUISITE)

_TOP_KEYS = frozenset({"endpoint", "cases"})
_ENDPOINT_KEYS = frozenset({"name", "description"})
_CASE_KEYS = frozenset({"outcome", "reason", "status", "code", "message", "match", "versions"})
_REFUSAL_KEYS = ("status", "code", "message")
MATCHABLE: tuple[Outcome, ...] = ("fail", "deviation", "error", "refused")  # what `match` may pin
SYMPTOM_PREVIEW = 160  # how much of a different symptom the note quotes
# How a judgement that turned the observed outcome into `deviation` says why (see compared_outcome).
REFUSED_DIFFERENTLY = "refused differently: "
MATCHED_DIFFERENTLY = "), observed a different failure: "


class ExpectationsError(Exception):
    """An expectations file is missing, unreadable or not in the documented format."""


@dataclass(frozen=True)
class Declaration:
    """The outcome a case is declared to have on an endpoint, and for refusals how it is refused."""

    outcome: Outcome = "pass"
    reason: str | None = None
    status: int | None = None
    code: str | None = None
    message: str | None = None
    # a fragment (or regular expression) the observed symptom must contain; several: any one of them
    match: str | tuple[str, ...] | None = None
    # the releases of the runner's own package it holds for (`>=2.26,<2.30`): the version that names the runner
    versions: str | None = None

    def holds_for(self, case_id: str) -> bool:
        """Whether the declaration applies to the case's runner (always, without `versions`)."""
        if self.versions is None:
            return True
        runner = case_id.split("/")[1] if case_id.count("/") >= 2 else ""
        version = runner.rpartition("-")[2]
        return bool(re.fullmatch(r"\d+(\.\d+)*", version)) and in_range(version, self.versions)


_COMPARISONS = {
    ">=": lambda a, b: a >= b, "<=": lambda a, b: a <= b, "==": lambda a, b: a == b, "!=": lambda a, b: a != b,
    ">": lambda a, b: a > b, "<": lambda a, b: a < b,
}  # fmt: skip
_CLAUSE = re.compile(r"\s*(>=|<=|==|!=|>|<)\s*(\d+(?:\.\d+)*)\s*")


def _release(version: str) -> tuple[int, ...]:
    parts = tuple(int(part) for part in version.split("."))
    return parts + (0,) * (3 - len(parts))


def in_range(version: str, specifier: str) -> bool:
    """`version` satisfies every clause of `specifier` (`>=2.26,<2.30`; missing parts count as 0)."""
    clauses = [_CLAUSE.fullmatch(clause) for clause in specifier.split(",")]
    return all(found is not None and _COMPARISONS[found[1]](_release(version), _release(found[2])) for found in clauses)


@dataclass(frozen=True)
class Judgement:
    """The outcome to record, the declared one, and whether the case conforms to its declaration."""

    outcome: Outcome
    expected: Outcome
    conformant: bool
    note: str | None = None


DEFAULT = Declaration()


@dataclass(frozen=True)
class Expectations:
    """Declarations for one endpoint, keyed by case id or fnmatch pattern over `suite/runner/case`."""

    name: str = "default"
    description: str = ""
    cases: Mapping[str, Declaration] = field(default_factory=dict)
    path: Path | None = None

    @classmethod
    def load(cls, path: Path | None) -> Expectations:
        """Read `path`; `None` means nothing is declared and every case is expected to pass."""
        if path is None:
            return cls()
        try:
            text = path.read_text("utf-8")
        except OSError as error:
            raise ExpectationsError(f"{path}: {error}") from None
        return cls.parse(text, path)

    @classmethod
    def parse(cls, text: str, path: Path) -> Expectations:
        """Declarations from `text`, the content of `path` (named in every error)."""
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as error:
            raise ExpectationsError(f"{path}: {error}") from None
        _check_keys(path, "", data, _TOP_KEYS)
        endpoint = data.get("endpoint")
        if not isinstance(endpoint, dict) or not isinstance(endpoint.get("name"), str):
            raise ExpectationsError(f"{path}: [endpoint] with a string `name` is required")
        _check_keys(path, "endpoint.", endpoint, _ENDPOINT_KEYS)
        cases = data.get("cases", {})
        return cls(
            name=endpoint["name"],
            description=str(endpoint.get("description", "")),
            cases={pattern: _declaration(path, pattern, table) for pattern, table in cases.items()},
            path=path,
        )

    @classmethod
    def for_endpoint(cls, name: str, directory: Path) -> Expectations:
        """`directory/<name>.toml` when it exists, else no declarations (everything expected to pass)."""
        path = directory / f"{name}.toml"
        return cls.load(path) if path.is_file() else cls(name=name)

    def for_case(self, case_id: str) -> Declaration:
        """The exact declaration for `case_id`, else the longest matching pattern (first in file on ties)."""
        if case_id in self.cases and self.cases[case_id].holds_for(case_id):
            return self.cases[case_id]
        cases = self.cases
        matching = [key for key in cases if case_matches(case_id, key) and cases[key].holds_for(case_id)]
        if not matching:
            return DEFAULT
        return self.cases[max(matching, key=len)]


def case_matches(case_id: str, pattern: str) -> bool:
    """Does `pattern` (an exact id or an fnmatch pattern over `suite/runner/case`) name this case?"""
    return case_id == pattern or fnmatchcase(case_id, pattern)


def _check_keys(path: Path, prefix: str, table: Mapping[str, Any], allowed: frozenset[str]) -> None:
    unknown = sorted(set(table) - allowed)
    if unknown:
        raise ExpectationsError(f"{path}: unknown key {prefix}{unknown[0]!s} (allowed: {', '.join(sorted(allowed))})")


def _declaration(path: Path, pattern: str, table: Any) -> Declaration:
    where = f'cases."{pattern}"'
    if not isinstance(table, dict):
        raise ExpectationsError(f"{path}: {where} must be a table")
    _check_keys(path, f"{where}.", table, _CASE_KEYS)
    outcome = table.get("outcome")
    if outcome not in OUTCOMES:
        raise ExpectationsError(f"{path}: {where}.outcome must be one of {', '.join(OUTCOMES)}")
    if outcome != "pass" and not isinstance(table.get("reason"), str):
        raise ExpectationsError(f"{path}: {where}.reason is required for a declared {outcome}")
    given = [key for key in _REFUSAL_KEYS if key in table]
    if given and outcome != "refused":
        raise ExpectationsError(f'{path}: {where}.{given[0]} only applies to outcome = "refused"')
    if "status" in table and (isinstance(table["status"], bool) or not isinstance(table["status"], int)):
        raise ExpectationsError(f"{path}: {where}.status must be an integer HTTP status")
    for key in ("reason", "code", "message"):
        if key in table and not isinstance(table[key], str):
            raise ExpectationsError(f"{path}: {where}.{key} must be a string")
    match = table.get("match")
    if "match" in table:
        many = isinstance(match, list) and match and all(isinstance(item, str) for item in match)
        if not isinstance(match, str) and not many:
            raise ExpectationsError(f"{path}: {where}.match must be a string or a list of strings")
        if outcome not in MATCHABLE:
            raise ExpectationsError(f"{path}: {where}.match only applies to outcome {', '.join(MATCHABLE)}")
        for item in [match] if isinstance(match, str) else list(match or ()):
            try:
                re.compile(item)
            except re.error as error:
                raise ExpectationsError(f"{path}: {where}.match is not a regular expression: {error}") from None
    versions = table.get("versions")
    if "versions" in table and (
        not isinstance(versions, str) or not all(_CLAUSE.fullmatch(clause) for clause in versions.split(","))
    ):
        raise ExpectationsError(f'{path}: {where}.versions must be a version range such as ">=2.26,<2.30"')
    return Declaration(
        versions=versions,
        outcome=outcome,
        reason=table.get("reason"),
        status=table.get("status"),
        code=table.get("code"),
        message=table.get("message"),
        match=tuple(match) if isinstance(match, list) else match,
    )


def match_found(match: str | tuple[str, ...], text: str) -> bool:
    """Is a declaration's `match` in `text`: as a literal fragment (what `expectations --write` writes), or
    found by it as a regular expression (`re.search`)? Of several, any one."""
    if not isinstance(match, str):
        return any(match_found(item, text) for item in match)
    return match in text or re.search(match, text) is not None


def compared_outcome(outcome: str, details: Mapping[str, Any], note: str | None) -> str:
    """The outcome `judge` was given for a recorded case, which a declaration's `outcome` must equal: the one
    recorded, unless the judgement itself made it a `deviation` (a refusal or `match` that differed), when it is
    what the runner observed (`details.observed_outcome`)."""
    observed = details.get("observed_outcome")
    made_by_judgement = (note or "").startswith(REFUSED_DIFFERENTLY) or MATCHED_DIFFERENTLY in (note or "")
    if outcome == "deviation" and isinstance(observed, str) and observed in OUTCOMES and made_by_judgement:
        return observed
    return outcome


def symptom_text(error: str | None, details: Mapping[str, Any]) -> str:
    """What `match` is searched in: the error message, then the case's details as JSON."""
    return "\n".join((error or "", json.dumps(details, ensure_ascii=False, sort_keys=True, default=str)))


def _refusal_mismatches(details: Mapping[str, Any], error: str | None, declared: Declaration) -> list[str]:
    mismatches = []
    status = details.get("status_code")
    if declared.status is not None and status != declared.status:
        mismatches.append(f"status {status} (declared {declared.status})")
    code = details.get("error_code")
    if declared.code is not None and code != declared.code:
        mismatches.append(f"code {code!r} (declared {declared.code!r})")
    observed = " ".join(str(text) for text in (error, details.get("message")) if text)
    if declared.message is not None and declared.message not in observed:
        mismatches.append(f"message lacks {declared.message!r}")
    return mismatches


def judge(observed: Outcome, details: Mapping[str, Any], error: str | None, declared: Declaration) -> Judgement:
    """Compare what a runner observed with what the endpoint declares."""
    expected = declared.outcome
    skip_reason = str(error or details.get("reason") or "")
    structured = details.get("skip_reason") in CONFORMANT_SKIPS
    no_verdict = structured or skip_reason.startswith(SDK_GAP_PREFIX)  # structured, or older
    if observed == "skip" and no_verdict:
        return Judgement("skip", expected, True, skip_reason)
    if observed == "pass" and expected != "pass":
        return Judgement("pass", expected, False, f"declared {expected} but passed: stale declaration?")
    if observed != expected:
        because = f": {declared.reason}" if declared.reason else ""
        return Judgement(observed, expected, False, f"declared {expected}{because}; observed {observed}")
    if expected == "refused":
        mismatches = _refusal_mismatches(details, error, declared)
        if mismatches:
            return Judgement("deviation", expected, False, REFUSED_DIFFERENTLY + "; ".join(mismatches))
    if declared.match is not None and not match_found(declared.match, symptom_text(error, details)):
        seen = " ".join((error or "(no message)").split())
        seen = seen if len(seen) <= SYMPTOM_PREVIEW else seen[: SYMPTOM_PREVIEW - 1] + "…"
        note = f"declared {expected} (match {declared.match!r}{MATCHED_DIFFERENTLY}{seen}"
        return Judgement("deviation", expected, False, note)
    return Judgement(observed, expected, True, declared.reason)
