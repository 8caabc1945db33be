"""`e2b-bench expectations RUN --write FILE`: declarations written from a run, one per cause.

The run's cases are judged again by FILE (when it exists): what FILE already declares as observed is left
alone; every other failing case belongs to a cause (bench/triage/causes.py), and each cause becomes a
declaration whose pattern covers exactly its cases in the run (`suite/*/case` when that is exact, else the
ids themselves), with the outcome observed, `match` from the cause's signature and the observed message as
`reason`, under a `# generated from RUN` comment for a person to edit. A declaration that already has the
pattern is updated, keeping a reason a person wrote. Declarations whose every case in the run passed are
stale: listed, and removed with `--prune`. FILE is written whole, atomically; its comments are kept.
"""

from __future__ import annotations

import dataclasses
import json
import re
import tomllib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

from bench.expectations import Expectations, ExpectationsError, judge
from bench.results import CaseRecord, Run, atomic_write
from bench.triage.causes import Cause, find_causes, message, observed_outcome

GENERATED = "# generated from "
REASON_CHARS = 200
_HEADER = re.compile(r"^\s*\[\s*cases\s*\..+\]\s*(#.*)?$")
_REFUSAL_KEYS = ("status", "code", "message")


@dataclass
class Block:
    """One `[cases."pattern"]` table of the file as written: its comment lines above, header and body."""

    pattern: str
    comments: list[str]
    header: str
    body: list[str]

    @property
    def generated(self) -> bool:
        return any(line.lstrip().startswith(GENERATED) for line in self.comments)

    def text(self) -> list[str]:
        return [*self.comments, self.header, *self.body]


@dataclass
class Change:
    """What `update_file` did to FILE."""

    path: Path
    added: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    stale: list[str] = field(default_factory=list)
    pruned: list[str] = field(default_factory=list)
    causes: int = 0

    def lines(self) -> list[str]:
        said = [f"{self.path}: {self.causes} cause(s) declared: {len(self.added)} added, {len(self.updated)} updated"]
        said += [f"  added {pattern}" for pattern in self.added]
        said += [f"  updated {pattern}" for pattern in self.updated]
        for pattern in self.stale:
            verb = "removed stale" if pattern in self.pruned else "stale (every case passed; --prune removes it)"
            said.append(f"  {verb}: {pattern}")
        return said


def _split(text: str) -> tuple[list[str], list[Block]]:
    """The file's lines before its first case table, and each case table with the comments right above it."""
    lines = text.splitlines()
    preamble: list[str] = []
    blocks: list[Block] = []
    pending: list[str] = []
    for line in lines:
        if _HEADER.match(line):
            pattern = next(iter(tomllib.loads(line)["cases"]))
            if not blocks:
                # comments right above the first table are its own; the rest is the preamble
                cut = len(pending)
                while cut > 0 and pending[cut - 1].lstrip().startswith("#"):
                    cut -= 1
                preamble, pending = pending[:cut], pending[cut:]
            blocks.append(Block(pattern, pending, line, []))
            pending = []
        elif blocks and not line.lstrip().startswith("#") and line.strip():
            blocks[-1].body += [*pending, line]
            pending = []
        else:
            pending.append(line)
    if not blocks:
        return [*pending], []
    # trailing comments and blank lines: the next table's, or the end of the last one
    blocks[-1].body += pending
    for index in range(len(blocks) - 1):
        body = blocks[index].body
        while body and body[-1].strip() == "":
            body.pop()
    return preamble, blocks


def _toml_string(value: str) -> str:
    return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")


def _table_lines(table: dict[str, Any]) -> list[str]:
    order = ["outcome", "reason", *_REFUSAL_KEYS, "match"]
    lines = []
    for key in sorted(table, key=lambda k: order.index(k) if k in order else len(order)):
        value = table[key]
        lines.append(f"{key} = {value if isinstance(value, int) else _toml_string(str(value))}")
    return lines


def _candidates(case: CaseRecord) -> list[str]:
    """Patterns that could cover this case, preferred first: the case under every runner, the same body under
    another flavour (`sync_x`, `async_x`), the id itself."""
    name = case.case
    found = [f"{case.suite}/*/{name}"]
    head, _, rest = name.partition("_")
    if rest and head:
        found.append(f"{case.suite}/*/*_{rest}")  # the same body under another flavour (sync_, async_)
    return [*found, case.id]


def patterns(chosen: Sequence[CaseRecord], every: Iterable[str]) -> list[str]:
    """Fewest fnmatch patterns matching exactly `chosen` among the run's case ids `every`."""
    wanted = {case.id for case in chosen}
    universe = set(every) | wanted
    remaining = set(wanted)
    picked: list[str] = []
    while remaining:
        best: tuple[int, int, str, set[str]] | None = None
        for case in chosen:
            if case.id not in remaining:
                continue
            for rank, candidate in enumerate(_candidates(case)):
                covered = {identifier for identifier in universe if fnmatchcase(identifier, candidate)}
                if not covered <= wanted:
                    continue
                # most cases first; between equals the candidate named first (`suite/*/case` before the id)
                score = (len(covered & remaining), -rank, candidate, covered)
                if best is None or score[:2] > best[:2]:
                    best = score
        assert best is not None  # the case's own id always qualifies
        picked.append(best[2])
        remaining -= best[3]
    return sorted(picked)


def _rejudged(run: Run, declared: Expectations) -> list[CaseRecord]:
    """The run's cases as FILE would judge them (a retried case by its last record)."""
    latest = {case.id: case for case in run.cases}
    judged = []
    for case in latest.values():
        observed = observed_outcome(case)
        details = {k: v for k, v in case.details.items() if k != "observed_outcome"}
        verdict = judge(observed, details, case.error, declared.for_case(case.id))  # type: ignore[arg-type]
        if verdict.outcome != observed:
            details["observed_outcome"] = observed
        judged.append(
            dataclasses.replace(
                case,
                outcome=verdict.outcome,
                expected=verdict.expected,
                conformant=verdict.conformant,
                note=verdict.note,
                details=details,
            )
        )
    return judged


def winning_pattern(declared: Expectations, case_id: str) -> str | None:
    """The declaration key that decides `case_id` (see Expectations.for_case)."""
    if case_id in declared.cases:
        return case_id
    matching = [pattern for pattern in declared.cases if fnmatchcase(case_id, pattern)]
    return max(matching, key=len) if matching else None


def _governed(declared: Expectations, cases: Sequence[CaseRecord]) -> dict[str, set[str]]:
    """Each declaration of FILE with the run's cases it decides."""
    found: dict[str, set[str]] = {}
    for case in cases:
        pattern = winning_pattern(declared, case.id)
        if pattern is not None:
            found.setdefault(pattern, set()).add(case.id)
    return found


def _existing(declared: Expectations, cause: Cause, cases: Sequence[CaseRecord]) -> list[str]:
    """FILE's declarations that decide only cases of this cause: they are updated rather than shadowed."""
    ids = {case.id for case in cause.cases}
    return sorted(pattern for pattern, decided in _governed(declared, cases).items() if decided <= ids)


def _undeclared(declared: Expectations, cause: Cause, cases: Sequence[CaseRecord]) -> list[CaseRecord]:
    """The cause's cases no declaration of `_existing` decides."""
    updated = set(_existing(declared, cause, cases))
    return [case for case in cause.cases if winning_pattern(declared, case.id) not in updated]


def _stale(declared: Expectations, cases: Sequence[CaseRecord]) -> list[str]:
    """Declarations of a non-pass outcome whose every case in the run passed."""
    governed: dict[str, list[str]] = {}
    for case in cases:
        pattern = winning_pattern(declared, case.id)
        if pattern is not None and declared.cases[pattern].outcome != "pass":
            governed.setdefault(pattern, []).append(observed_outcome(case))
    return sorted(pattern for pattern, seen in governed.items() if seen and all(o == "pass" for o in seen))


def _by_outcome(cause: Cause) -> list[Cause]:
    """A cause split by the outcome its runners observed: a declaration has one outcome."""
    return [
        Cause(cause.signature, tuple(case for case in cause.cases if observed_outcome(case) == outcome))
        for outcome in cause.outcomes
    ]


def _declaration(cause: Cause, run_id: str) -> tuple[dict[str, Any], str]:
    """The table a cause is declared with, and its comment."""
    said = " ".join(message(cause.representative).split())
    said = said if len(said) <= REASON_CHARS else said[: REASON_CHARS - 1] + "…"
    table: dict[str, Any] = {"outcome": cause.outcome, "reason": said}
    pattern = cause.match()
    if pattern is not None:
        table["match"] = pattern
    comment = f"{GENERATED}{run_id} ({len(cause.cases)} case(s), cause {cause.key}): edit the reason"
    return table, comment


def update_file(run: Run, path: Path, prune: bool = False) -> Change:
    """Write FILE's declarations from `run` (see the module); raises ExpectationsError when FILE is unreadable."""
    existing = path.read_text("utf-8") if path.exists() else None
    declared = Expectations.load(path) if existing is not None else Expectations()
    raw_cases: dict[str, Any] = tomllib.loads(existing).get("cases", {}) if existing is not None else {}
    if existing is None:
        endpoint = run.header["endpoint"]["name"]
        existing = f"[endpoint]\nname = {_toml_string(endpoint)}\n"
    preamble, blocks = _split(existing)
    change = Change(path)

    judged = _rejudged(run, declared)
    every = [case.id for case in judged]
    stale = set(_stale(declared, judged))
    change.stale = sorted(stale)
    by_pattern = {block.pattern: block for block in blocks}
    causes = [cause for cause in find_causes(judged) if not cause.stale]
    change.causes = len(causes)
    for cause in (part for whole in causes for part in _by_outcome(whole)):
        table, comment = _declaration(cause, run.run_id)
        for pattern in _existing(declared, cause, judged) + patterns(_undeclared(declared, cause, judged), every):
            block = by_pattern.get(pattern)
            if block is None:
                block = Block(pattern, ["", comment], f"[cases.{_toml_string(pattern)}]", [])
                blocks.append(block)
                by_pattern[pattern] = block
                change.added.append(pattern)
                merged = dict(table)
            else:
                merged = {**raw_cases.get(pattern, {}), **table}
                if not block.generated:  # a person's reason stays
                    merged["reason"] = raw_cases.get(pattern, {}).get("reason", table["reason"])
                else:
                    block.comments = [line for line in block.comments if not line.lstrip().startswith(GENERATED)]
                    block.comments.append(comment)
                if "match" not in table:
                    merged.pop("match", None)
                if merged["outcome"] != "refused":
                    for key in _REFUSAL_KEYS:
                        merged.pop(key, None)
                change.updated.append(pattern)
            block.body = _table_lines(merged)
    if prune:
        blocks = [block for block in blocks if block.pattern not in stale]
        change.pruned = sorted(stale)
    text = _render(preamble, blocks)
    written = _parse(text, path)
    # A longer pattern already in FILE could still decide some case: those get their own id.
    for cause in (part for whole in causes for part in _by_outcome(whole)):
        table, comment = _declaration(cause, run.run_id)
        for case in cause.cases:
            if written.for_case(case.id).outcome != table["outcome"] and case.id not in by_pattern:
                blocks.append(Block(case.id, ["", comment], f"[cases.{_toml_string(case.id)}]", _table_lines(table)))
                by_pattern[case.id] = blocks[-1]
                change.added.append(case.id)
    text = _render(preamble, blocks)
    _parse(text, path)
    atomic_write(path, text)
    return change


def _render(preamble: list[str], blocks: list[Block]) -> str:
    lines = [*preamble]
    for block in blocks:
        lines += block.text()
    return "\n".join(lines).rstrip("\n") + "\n"


def _parse(text: str, path: Path) -> Expectations:
    """The declarations as they would be read back; nothing is written when they would not be."""
    try:
        return Expectations.parse(text, path)
    except ExpectationsError as error:
        raise ExpectationsError(f"{error} (in the declarations written from the run; {path} left as it was)") from None
