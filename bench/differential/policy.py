"""The field-policy table (sandboxes/e2b/differential.toml) and what each policy accepts.

A field is named `METHOD ROUTE PATH` (`GET /sandboxes/{id} endAt`, `POST /process.Process/Start
event.start.pid`, `... status` for the HTTP status, `... messages` for a stream's order of messages); a rule's
`field` is an fnmatch pattern over that name, the first rule that matches decides. A field no rule names is judged
by what the reference shows: the same value in every reference run -> `exact`; different values -> by their shape
(`time` for ISO 8601 times, `magnitude` for numbers, `id` for id-shaped strings, `type` otherwise).

Policies (each compares an observed value with the reference runs' values of the field):
  exact      the same JSON value (and type: 1 is not 1.0 nor true)
  ignore     not compared (legitimate variation the reference cannot show, e.g. keepalives)
  type       the same JSON type
  id         a string of the same length range and character classes (letters, digits, other)
  time       an ISO 8601 time with the reference's precision (fractional digits) and zone form, whose offset from
             the moment its request began is within delta (DELTA_S scaled by slowness, + 10 % of the offset) of a
             reference run's; a moment E2B gives in the past (a start, a change) need only be in the past and not
             far further back (PAST_FACTOR times E2B's, + PAST_SLACK deltas): a slow case stretches how long ago
  timeform   an ISO 8601 time with the reference's precision and zone form (a moment the harness's own choices
             set, e.g. an end of life: its lifetime is judged as the probe's `endAt_less_asked`)
  seconds    a number within delta of a reference run's (seconds the endpoint adds to what was asked)
  magnitude  a number of the same type and sign, of the same order (within a factor MAGNITUDE; small numbers
             under SMALL are any): units (bytes vs MiB, ms vs s) differ by far more
  unordered  an array (or a stream's messages) compared as a multiset
  items      an array whose length and items are not E2B's to fix (a list of sandboxes holds whatever else runs):
             each item of the same JSON type as the reference's
  set        the distinct values, as a set, are one reference run's (how often each comes is not judged: a watch
             may report a made directory CREATE, CHMOD and sometimes a second CHMOD)
"""

from __future__ import annotations

import math
import re
import tomllib
from dataclasses import dataclass
from datetime import datetime
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

POLICIES = ("exact", "ignore", "type", "id", "time", "timeform", "seconds", "magnitude", "unordered", "items", "set")
DELTA_S = 15.0
MAGNITUDE = 16.0
PAST_FACTOR = 10.0  # a moment in the past may be this many times further back than E2B's (a slow case) ...
PAST_SLACK = 20.0  # ... and this many deltas more
SMALL = 1024.0
_TIME = re.compile(r"^\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?P<fraction>\.\d+)?(?P<zone>Z|[+-]\d{2}:?\d{2})?$")
_ID = re.compile(r"^[A-Za-z0-9_-]{6,}$")


class PolicyError(Exception):
    """The policy table is unreadable or names an unknown policy."""


@dataclass(frozen=True)
class Rule:
    field: str
    policy: str
    reason: str = ""


def load_rules(path: Path) -> list[Rule]:
    """The rules of a policy table, in order."""
    try:
        table = tomllib.loads(path.read_text("utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise PolicyError(f"{path}: {exc}") from None
    rules = []
    for entry in table.get("policy", []):
        if (
            not isinstance(entry, dict)
            or entry.get("policy") not in POLICIES
            or not isinstance(entry.get("field"), str)
        ):
            raise PolicyError(f"{path}: each [[policy]] needs `field` and `policy` (one of {', '.join(POLICIES)})")
        rules.append(Rule(entry["field"], entry["policy"], str(entry.get("reason", ""))))
    return rules


def rule_for(name: str, rules: list[Rule]) -> str | None:
    """The policy the first matching rule gives the field, or None."""
    return next((rule.policy for rule in rules if fnmatchcase(name, rule.field)), None)


def json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def same(a: Any, b: Any) -> bool:
    """Equal as JSON values, types included."""
    return json_type(a) == json_type(b) and a == b


def is_time(value: Any) -> bool:
    return isinstance(value, str) and _TIME.match(value) is not None


def inferred(refs: list[Any]) -> str:
    """The policy for a field whose reference runs disagree, from their values' shape."""
    kinds = {json_type(value) for value in refs}
    if kinds == {"string"} and all(_TIME.match(value) for value in refs):
        return "time"
    if kinds <= {"integer", "number"}:
        return "magnitude"
    if kinds == {"string"} and all(_ID.match(value) for value in refs):
        return "id"
    return "type"


def accepts(policy: str, refs: list[Any], got: Any, at: datetime | None, ref_ats: list[datetime | None],
            delta_s: float) -> str | None:  # fmt: skip
    """None when `got` passes the policy against the reference values; else why not, in words."""
    if policy == "ignore":
        return None
    kinds = {json_type(ref) for ref in refs}
    if policy == "exact":
        if any(same(ref, got) for ref in refs):
            return None
        return (
            "a different value"
            if json_type(got) in kinds
            else f"a {json_type(got)} where E2B gives a {'/'.join(sorted(kinds))}"
        )
    if json_type(got) not in kinds and not (kinds <= {"integer", "number"} and json_type(got) in kinds | {"integer"}):
        return f"a {json_type(got)} where E2B gives a {'/'.join(sorted(kinds))}"
    if policy == "type":
        return None
    if policy == "id":
        return _id(refs, got)
    if policy == "time":
        return _time(refs, got, at, ref_ats, delta_s)
    if policy == "timeform":
        return _time(refs, got, None, ref_ats, delta_s)
    if policy == "seconds":
        numbers = [ref for ref in refs if isinstance(ref, int | float) and not isinstance(ref, bool)]
        if isinstance(got, int | float) and numbers and min(abs(got - ref) for ref in numbers) > delta_s:
            return f"{got:+g} s where E2B's is {min(numbers, key=lambda ref: abs(got - ref)):+g} s"
        return None
    if policy == "magnitude":
        return _magnitude(refs, got)
    return None


def _classes(text: str) -> frozenset[str]:
    return frozenset("a" if c.isalpha() else "9" if c.isdigit() else c for c in text)


def _id(refs: list[Any], got: Any) -> str | None:
    if not isinstance(got, str):
        return None
    lengths = [len(ref) for ref in refs if isinstance(ref, str)]
    if lengths and not min(lengths) <= len(got) <= max(lengths):
        return f"an id of {len(got)} characters where E2B's have {min(lengths)}"
    allowed = frozenset().union(*(_classes(ref) for ref in refs if isinstance(ref, str))) | {"a", "9"}
    if not _classes(got) <= allowed:
        extra = "".join(sorted(_classes(got) - allowed))
        return f"an id with characters E2B's never have ({extra!r})"
    return None


def parse_time(text: str) -> datetime | None:
    """An ISO 8601 time (to the microsecond; no zone: UTC), or None."""
    match = _TIME.match(text)
    if match is None:
        return None
    micro = (match["fraction"] or ".0")[1:7].ljust(6, "0")
    zone = match["zone"] or "Z"
    zone = "+00:00" if zone == "Z" else zone if ":" in zone else f"{zone[:3]}:{zone[3:]}"
    try:
        return datetime.fromisoformat(f"{text[:19].replace(' ', 'T')}.{micro}{zone}")
    except ValueError:
        return None


def _digits(text: str) -> int:
    match = _TIME.match(text)
    return len(match["fraction"]) - 1 if match and match["fraction"] else 0


def _zone(text: str) -> str:
    match = _TIME.match(text)
    zone = match["zone"] if match else None
    return "none" if not zone else "Z" if zone == "Z" else "offset"


def _time(refs: list[Any], got: Any, at: datetime | None, ref_ats: list[datetime | None], delta_s: float) -> str | None:
    texts = [ref for ref in refs if isinstance(ref, str) and _TIME.match(ref)]
    if not isinstance(got, str) or not texts or got in texts:
        return None
    if not _TIME.match(got):
        return "not an ISO 8601 time"
    zones = {_zone(ref) for ref in texts}
    if _zone(got) not in zones:
        return "another form of time zone"
    most, digits = max(_digits(ref) for ref in texts), _digits(got)
    # a formatter drops trailing zeros (E2B's envd formats RFC 3339 with nanoseconds so): three digits less is one
    # value in a thousand (a faithful run met it), six one in a million; seconds where E2B gives fractions, or
    # milliseconds where it gives nanoseconds, is a coarser clock
    if (most > 0 and digits == 0) or (most >= 9 and most - digits >= 6):
        return f"a precision of {digits} fractional digit(s) where E2B gives {most}"
    moment = parse_time(got)
    if moment is None or at is None:
        return None
    offsets = [
        (value - ref_at).total_seconds()
        for ref, ref_at in zip(refs, ref_ats, strict=False)
        if isinstance(ref, str) and ref_at is not None and (value := parse_time(ref)) is not None
    ]
    if not offsets:
        return None
    offset = (moment - at).total_seconds()
    nearest = min(offsets, key=lambda ref: abs(ref - offset))
    if all(ref <= delta_s for ref in offsets):
        # a moment already past (a start, a file's change): how long ago depends on how long the case took, which
        # a busy host stretches; only one in the future, or far further back than E2B's, is another moment
        earliest = min(offsets) * PAST_FACTOR - delta_s * PAST_SLACK
        if not earliest <= offset <= delta_s:
            return f"{offset:+.1f} s from its request where E2B's is {nearest:+.1f} s"
        return None
    if abs(nearest - offset) > delta_s + 0.1 * abs(nearest):
        return f"{offset:+.1f} s from its request where E2B's is {nearest:+.1f} s"
    return None


def _magnitude(refs: list[Any], got: Any) -> str | None:
    numbers = [float(ref) for ref in refs if isinstance(ref, int | float) and not isinstance(ref, bool)]
    if not isinstance(got, int | float) or isinstance(got, bool) or not numbers:
        return None
    value = float(got)
    if all(abs(ref) < SMALL for ref in numbers) and abs(value) < SMALL:
        return None
    if any((ref < 0) != (value < 0) for ref in numbers if ref):
        return "a number of the other sign"
    for ref in numbers:
        low, high = sorted((abs(ref), abs(value)))
        if high == 0 or (low > 0 and high / low <= MAGNITUDE) or (low == 0 and high < SMALL):
            return None
    nearest = min(numbers, key=lambda ref: abs(math.log10(max(abs(ref), 1e-9)) - math.log10(max(abs(value), 1e-9))))
    return f"{value:g} is not of the order of E2B's {nearest:g} (other units?)"
