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

from bench.expectations import compared_outcome, symptom_text
from bench.redaction import Redactor
from bench.results import CaseRecord, Run, atomic_write, case_id, read_run, utc_now, validate
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


# `details.cause` of a case that failed only by the endpoint's moment (bench/remote/transient.py and the
# capacity a run learns): never a cause, never declared.
MOMENT_CAUSES = ("endpoint transient", "endpoint capacity", "flaky")
# What the harness records for a case that is no answer of the endpoint's: never declared.
HARNESS_OWN = (
    ("not run", "not run"),
    ("runner died", "its runner died"),
    ("runner finished without reporting", "its runner died"),
    ("depends on ", "it depends on a case that did not answer"),
    ("runner environment ", "a harness fault"),
    ("harness environment fault", "a harness fault"),
    ("harness fault", "a harness fault"),
)


def apart(case: CaseRecord, declaring: bool = False) -> str | None:
    """Why a failing case is kept apart from the causes (None: it belongs to one): the endpoint's transient or
    capacity answer; and when `declaring`, what is no behaviour of the endpoint's to declare either (the
    harness's own faults, runner deaths, cases not run or depending on another, the leak check)."""
    cause = str(case.details.get("cause") or "")
    if cause.startswith(MOMENT_CAUSES[:2]) or any(word in cause for word in MOMENT_CAUSES[2:]):
        return "the endpoint's transient or capacity answer, not its behaviour"
    if not declaring:
        return None
    if case.suite == "housekeeping":
        return "the harness's own check of the run (the leak check)"
    error = case.error or ""
    return next((why for prefix, why in HARNESS_OWN if error.startswith(prefix)), None)


def judged_outcome(case: CaseRecord) -> str:
    """The outcome the judge compared with the declaration (bench.expectations.compared_outcome)."""
    return compared_outcome(case.outcome, case.details, case.note)


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


# What the harness and the frameworks put around the words of a failure: an attempt counter, a wrapper naming
# the call that raised (`exit 5` raised X, the agent run raised X, spawn('cat') refused: X).
_OWN_PREFIX = re.compile(r"^(?:attempt \d+/\d+:\s*)+")
# An SDK's exception inside a message (not an assertion of the harness's own): its message is the words.
_RAISED = re.compile(r"\b(?!Assertion)\w+?(?:Exception|Error)(?: \[\w+\])?:\s+")
# A check's own comparison: `[what: ]got A, expected B`, `observed A, E2B: B`, `what is A, expected B`, or
# `... A (expected B)`.
_DIFFERENCES = (
    re.compile(
        r"^(?:[^:]{0,80}?:\s*|\w+ is\s+)?(?:got\s+|observed\s+)?(?P<got>.+?),?\s+"
        r"(?:expected|E2B:?)\s+(?P<expected>.+)$",
        re.S,
    ),
    re.compile(r"(?P<got>[^\s(]+)\s+\(expected\s+(?P<expected>[^)]*)\)"),
)
# The form a Connect error takes in a message (`[invalid_argument] stdin is not supported`): the endpoint's words.
_CONNECT_ERROR = re.compile(r"\[[a-z]+(?:_[a-z]+)*\]\s+")
_VALUE = re.compile(r"(?:\\n|\\t)|[^\w./~@+-]+")  # what separates the words of a compared value
_STATUS_IN_TEXT = re.compile(r"(?<![\w.])([45]\d\d)(?![\w.])")
_ID_LIKE = re.compile(r"^(?=.*\d)(?=.*[A-Za-z])[A-Za-z0-9_-]{8,}$")


# What the harness adds at the end of a failure seen again after a transient answer (bench/remote/rerun.py).
_OWN_SUFFIX = re.compile(r"\s*\(the endpoint answered [^()]*, on the re-run too\)$")


def _without_own_prefix(text: str) -> str:
    return _OWN_SUFFIX.sub("", _OWN_PREFIX.sub("", text.strip()))


def _raised_in(text: str) -> str | None:
    """The endpoint's words a message quotes (up to the next `; `): a Connect error's (`[code] words`), else the
    message of an SDK's exception, without its code prefix."""
    found = _CONNECT_ERROR.search(text) or _RAISED.search(text)
    if found is None:
        return None
    words = _REFUSAL_CODE.sub("", text[found.end() :].split("; ", 1)[0]).strip().rstrip("\"'`")
    return words or None


def _error_answers(case: CaseRecord) -> list[tuple[int | None, str]]:
    """The endpoint's error answers among the case's exchanges: (HTTP status, or None for a Connect stream's
    error frame; the message it gave)."""
    found: list[tuple[int | None, str]] = []
    for exchange in case.evidence or []:
        status = exchange.get("status")
        if isinstance(status, int) and status >= 400:
            try:
                body = json.loads(str(exchange.get("response") or ""))
            except ValueError:
                body = None
            text = body.get("message") if isinstance(body, dict) else None
            if isinstance(text, str) and text.strip():
                found.append((status, text))
        for frame in exchange.get("frames") or []:
            _, _, payload = str(frame).partition(": ")
            try:
                parsed = json.loads(payload)
            except ValueError:
                continue
            error = parsed.get("error") if isinstance(parsed, dict) else None
            text = error.get("message") if isinstance(error, dict) else None
            if isinstance(text, str) and text.strip():
                found.append((None, text))
    return found


def _stated_status(case: CaseRecord) -> int | None:
    """The HTTP status the case says the endpoint answered: recorded, raised, or named in its message."""
    raised = case.details.get("raised")
    for value in (case.details.get("status_code"), raised.get("status_code") if isinstance(raised, dict) else None):
        if isinstance(value, int) and value >= 400:
            return value
    named = {int(status) for status in _STATUS_IN_TEXT.findall(case.error or "")}
    return named.pop() if len(named) == 1 else None


def wire_words(case: CaseRecord) -> str | None:
    """The endpoint's own words from the case's exchanges: the one error message it answered with the status the
    case names (or, for a refusal or an SDK's exception naming no status, the only error message it answered)."""
    answers = _error_answers(case)
    if not answers:
        return None
    status = _stated_status(case)
    if status is not None:
        messages = {text for answered, text in answers if answered == status}
    elif observed_outcome(case) == "refused" or isinstance(case.details.get("raised"), dict):
        messages = {text for _, text in answers}
    else:
        return None
    return _REFUSAL_CODE.sub("", messages.pop()).strip() or None if len(messages) == 1 else None


def endpoint_words(case: CaseRecord) -> str | None:
    """What the endpoint itself said: a refusal's message, or the message of the error an SDK raised from the
    endpoint's answer (recorded, or quoted in the failure's message), when one of the case's exchanges says it
    too; else the error answer among its exchanges (wire_words) the case names; else those words as recorded;
    None for a failed check of the harness's own."""
    if case.outcome == "pass":
        return None
    raised = case.details.get("raised")
    text = raised.get("message") if isinstance(raised, dict) else None
    own = _refusal(case) or (_REFUSAL_CODE.sub("", text).strip() if isinstance(text, str) else None)
    own = own or _raised_in(_without_own_prefix(case.error or ""))
    if own and any(own in answer or answer in own for _, answer in _error_answers(case)):
        return own  # the endpoint's own words, as the case recorded them
    # a client's own rendering of the answer (`Sandbox <id> not found` for a 404), or none: the answer's words
    return wire_words(case) or own or None


def _value_words(value: str) -> set[str]:
    return {word for word in _VALUE.split(value) if word and word not in ("n", "t")}


def difference(case: CaseRecord) -> tuple[set[str], set[str]] | None:
    """For a check that compared what it got with what E2B gives: the words only the observed value has, and
    those only E2B's has (ids left out); None for any other message."""
    text = _without_own_prefix(case.error or "")
    found = _DIFFERENCES[0].match(text) if text.startswith(("got ", "observed ")) or ": got " in text[:80] else None
    found = found or (_DIFFERENCES[0].match(text) if re.match(r"^\w+ is ", text) else None)
    found = found or _DIFFERENCES[1].search(text)
    if found is None:
        return None
    got, expected = _value_words(found["got"]), _value_words(found["expected"])
    if not got ^ expected:
        return None
    return {w for w in got - expected if not _ID_LIKE.match(w)}, {w for w in expected - got if not _ID_LIKE.match(w)}


def signature(case: CaseRecord) -> str:
    """Equal for cases that fail the same way: `endpoint: <its words>` when the endpoint said why (one refusal
    met by a probe, a behaviour's SDK exception, a framework and a raw request is one cause); `differs: ...`
    for a compared value, by what only the observed one has (else what it lacks); else `<observed outcome>:
    <message>`; normalized, without the harness's own prefixes."""
    words = endpoint_words(case)
    if words is not None:
        return f"endpoint: {symptom(words).normalized[:SIGNATURE_CHARS]}"
    differs = difference(case)
    if differs is not None:
        observed, lacking = differs
        what = f"observed {' '.join(sorted(observed))}" if observed else f"lacks {' '.join(sorted(lacking))}"
        return f"differs: {what[:SIGNATURE_CHARS]}"
    said = _without_own_prefix(message(case))
    return f"{observed_outcome(case)}: {symptom(said).normalized[:SIGNATURE_CHARS]}"


FRAGMENT_MIN = 8  # characters: a shorter literal fragment says too little alone
FRAGMENT_MAX = 80  # characters a generated `match` keeps (cut between words)
FRAGMENT_GOOD = 16  # characters: a literal fragment this long needs no pattern around it
MATCH_MANY = 3  # fragments at most a `match` lists when no one is in every case's symptom
_VARYING = frozenset({"uuid", "time", "url", "hostport", "id", "number"})
_LANGUAGE = frozenset({"call", "exception", "name", "literal", "quote", "separator"})


def _unclosed(text: str, opening: str, closing: str) -> bool:
    """Does `text` hold a quote or bracket of this kind that it does not close (or open)?"""
    if opening == closing:
        return text.count(opening) % 2 == 1
    return text.count(opening) != text.count(closing)


def _trim(text: str) -> str:
    """A stretch as a fragment: without separators at its ends, nor a quote or bracket there it does not close."""
    before = None
    while text != before:
        before = text
        text = text.strip(" ,;:")
        for opening, closing in (("'", "'"), ('"', '"'), ("`", "`"), ("(", ")"), ("[", "]"), ("{", "}")):
            if text.startswith(opening) and _unclosed(text, opening, closing):
                text = text[1:]
            if text.endswith(closing) and _unclosed(text, opening, closing):
                text = text[:-1]
    if len(text) > FRAGMENT_MAX:
        text = text[:FRAGMENT_MAX].rsplit(" ", 1)[0].rstrip(" ,;:")
    return text


def _varying_spans(text: str) -> list[tuple[int, int, bool]]:
    """Where `text` varies from run to run (the whole word around an id, a number, a host, a time, a path holding
    digits: True) or by the client's language only (quotes, exception names, spellings: False)."""
    spans: list[tuple[int, int, bool]] = []
    for found in _SCANNER.finditer(text):
        kind = found.lastgroup or ""
        if kind in _VARYING or (kind == "path" and any(ch.isdigit() for ch in found.group())):
            start, end = found.start(), found.end()
            while start > 0 and not text[start - 1].isspace() and text[start - 1] not in "\"'`([{":
                start -= 1
            while end < len(text) and not text[end].isspace() and text[end] not in "\"'`)]},;":
                end += 1
            spans.append((start, end, True))
        elif kind in _LANGUAGE:
            spans.append((found.start(), found.end(), False))
    return spans


def fragments(text: str) -> list[str]:
    """Literal stretches of `text` a `match` can pin, the preferred first: between what varies from run to run
    (ids, numbers, hosts, times, paths holding digits), then also between what differs by the client's language
    (quotes, exception names, spellings); longest first, earlier first between equals."""
    text = " ".join(text.split())
    whole: list[str] = []
    parts: list[str] = []
    start = part_start = 0
    for begin, end, varies in _varying_spans(text):
        if begin < part_start:
            continue
        parts.append(text[part_start:begin])
        part_start = end
        if varies:
            whole.append(text[start:begin])
            start = end
    whole.append(text[start:])
    parts.append(text[part_start:])
    seen: dict[str, int] = {}
    for rank, stretch in enumerate([*whole, *parts]):
        trimmed = _trim(stretch)
        if len(trimmed) >= FRAGMENT_MIN and trimmed not in seen:
            seen[trimmed] = rank
    return sorted(seen, key=lambda fragment: (-len(fragment), seen[fragment]))


def simple_patterns(text: str) -> list[str]:
    """Two literal stretches of `text` around one word that varies (an id, a number), as a regex with `\\S+` in
    its place (`Sandbox \\S+ not found`): what a `match` pins when no literal stretch says enough; longest first.
    A stretch ends where the text differs by the client's language (an exception's name, a quote)."""
    text = " ".join(text.split())
    spans: list[tuple[int, int, bool]] = []
    for span in _varying_spans(text):
        if not spans or span[0] >= spans[-1][1]:
            spans.append(span)
    found_patterns = []
    for index, (begin, end, varies) in enumerate(spans):
        if not varies:
            continue
        before = text[spans[index - 1][1] if index else 0 : begin]
        after = text[end : spans[index + 1][0] if index + 1 < len(spans) else len(text)]
        head, tail = before.lstrip(" ,;:\"'`([{")[-FRAGMENT_MAX:], after.rstrip(" ,;:\"'`)]}")[:FRAGMENT_MAX]
        if head.strip() and tail.strip():
            found_patterns.append(_escape(head) + r"\S+" + _escape(tail))
    return sorted(found_patterns, key=len, reverse=True)


def _pinnable(fragment: str) -> bool:
    try:
        re.compile(fragment)
    except re.error:
        return False
    return True


_DEPENDS = re.compile(r"depends on (\S+)")


@dataclass(frozen=True)
class Cause:
    """Non-conformant cases that share one symptom signature."""

    signature: str
    cases: tuple[CaseRecord, ...]

    @property
    def own(self) -> tuple[CaseRecord, ...]:
        """Its cases that failed themselves: not those that did not run because a case they need failed (they
        follow their prerequisite's cause, and carry none of its symptom)."""
        own = tuple(case for case in self.cases if not (case.outcome == "error" and _DEPENDS.match(case.error or "")))
        return own or self.cases

    @property
    def key(self) -> str:
        """Stable across runs: the signature's digest (a cause keeps its key while its symptom stays)."""
        return hashlib.sha256(self.signature.encode()).hexdigest()[:10]

    @property
    def outcomes(self) -> list[str]:
        """The outcomes the judge compared for its cases (judged_outcome), the most frequent first."""
        counts = Counter(judged_outcome(case) for case in self.own)
        return sorted(counts, key=lambda outcome: (-counts[outcome], outcome))

    @property
    def outcome(self) -> str:
        return self.outcomes[0]

    @property
    def representative(self) -> CaseRecord:
        """The case to look at first: one that carries wire evidence, else the first by id."""
        return next((case for case in self.own if case.evidence), self.own[0])

    @property
    def stale(self) -> bool:
        return self.own[0].outcome == "pass"

    def match(self) -> str | list[str] | None:
        """What a declaration of this cause pins (`match`): a literal fragment of the endpoint's words (else of
        the failures' messages) found in every case's symptom, as a person reads it, or a simple pattern with
        what varies left open (`Sandbox \\S+ not found`); when no one is in all, the fewest (up to MATCH_MANY)
        that together are; else a regex of the message's start; None when none is found (or for a stale
        declaration)."""
        if self.stale:
            return None
        texts = [symptom_text(case.error, case.details) for case in self.own]
        words = [endpoint_words(case) or "" for case in self.own]
        said = [_without_own_prefix(message(case)) for case in self.own]
        observed = [w for case in self.own for w in sorted((difference(case) or (set(), set()))[0], key=len)[::-1]]
        # the endpoint's words first (any case's); for a compared value what only the observed one has; then the
        # failures' own messages
        spoken = [fragment for text in words for fragment in fragments(text)]
        literals = spoken + (observed if self.signature.startswith("differs:") else [])
        literals += [fragment for text in said for fragment in fragments(text)] + observed
        usable = [f for f in dict.fromkeys(literals) if len(f) >= 2 and _pinnable(f)]
        simple = list(dict.fromkeys(p for text in [*words, *said] for p in simple_patterns(text)))

        def covers(candidate: str, literal: bool) -> set[int]:
            if literal:
                return {i for i, text in enumerate(texts) if candidate in text}
            compiled = re.compile(candidate)
            return {i for i, text in enumerate(texts) if compiled.search(text)}

        everywhere = set(range(len(texts)))
        literal = next((f for f in usable if covers(f, True) == everywhere), None)
        if literal is not None and len(literal) >= FRAGMENT_GOOD:
            return literal
        pattern = next((p for p in simple if len(p) > len(literal or "") and covers(p, False) == everywhere), None)
        if pattern is not None or literal is not None:
            return pattern or literal
        # several, each a fragment of some cases' symptoms: the fewest that cover them all
        options = [(f, covers(f, True)) for f in usable if len(f) >= FRAGMENT_GOOD and f in spoken]
        options += [(p, covers(p, False)) for p in simple]
        options += [(f, covers(f, True)) for f in usable if len(f) >= FRAGMENT_GOOD and f not in spoken]
        chosen: list[str] = []
        left = set(everywhere)
        while left and len(chosen) < MATCH_MANY:
            best, covered = max(options, key=lambda o: (len(o[1] & left), -options.index(o)), default=("", set()))
            if not covered & left:
                break
            chosen.append(best)
            left -= covered
        if not left:
            return chosen
        regex = symptom(said[self.own.index(self.representative)], MATCH_CHARS).regex
        return regex if regex and covers(regex, False) == everywhere else None


def find_causes(cases: Iterable[CaseRecord]) -> list[Cause]:
    """The non-conformant cases (a retried case by its last record) grouped by signature, largest first; a case
    failed only by the endpoint's transient or capacity answer is no cause (`apart`)."""
    latest = {case.id: case for case in cases}
    groups: dict[str, list[CaseRecord]] = {}
    signatures: dict[str, str] = {}
    failing = [
        case for case in sorted(latest.values(), key=lambda c: c.id) if not case.conformant and apart(case) is None
    ]
    for case in failing:
        signatures[case.id] = signature(case)

    def root(case: CaseRecord, seen: frozenset[str] = frozenset()) -> str:
        """A case that did not run because a case it needs failed belongs to that case's cause: one root."""
        needed = _DEPENDS.match(case.error or "") if case.outcome == "error" else None
        prerequisite = latest.get(case_id(case.suite, case.runner, needed[1])) if needed else None
        if prerequisite is None or prerequisite.id not in signatures or prerequisite.id in seen:
            return signatures[case.id]
        return root(prerequisite, seen | {case.id})

    for case in failing:
        groups.setdefault(root(case), []).append(case)
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


def cause_words(cause: Cause) -> str | None:
    """What the cause is, in the endpoint's words: `the endpoint said: …`, or `observed …` where a compared value
    differs from E2B's (None for a failed check of the harness's own)."""
    example = cause.representative
    if cause.signature.startswith("endpoint: "):
        words = endpoint_words(example)
        return f"the endpoint said: {' '.join(words.split())}" if words else None
    differs = difference(example) if cause.signature.startswith("differs: ") else None
    if differs is None:
        return None
    observed, lacking = differs
    return (
        f"observed {', '.join(sorted(observed))} where E2B's differs"
        if observed
        else (f"lacks {', '.join(sorted(lacking))} that E2B's has")
    )


def terminal_lines(run: Run, width: int = 100) -> list[str]:
    """What `report RUN --causes` prints: the headline, then each cause with its cases and one re-run line."""
    causes = find_causes(run.cases)
    lines = [f"{run.run_id}: {headline(causes)}"]
    moments = [case.id for case in {c.id: c for c in run.cases}.values() if not case.conformant and apart(case)]
    if moments:
        lines.append(f"({len(moments)} more failed only by the endpoint's transient or capacity answer: no cause)")
    for number, cause in enumerate(causes, start=1):
        document = cause_document(run, cause)
        shown = " ".join(document["message"].split())
        shown = shown if len(shown) <= width else shown[: width - 1] + "…"
        lines.append(f"\n{number}. {'/'.join(cause.outcomes)} x{len(cause.cases)} [{cause.key}] {shown}")
        lines.append(f"   suites: {', '.join(document['suites'])}; runners: {', '.join(document['runners'])}")
        said = cause_words(cause)
        if said is not None:
            lines.append(f"   {said if len(said) <= width else said[: width - 1] + '…'}")
        for case in cause.cases:
            lines.append(f"   - {case.id}")
        lines.append(f"   re-run {document['representative']['id']}: {document['representative']['rerun']}")
    return lines
