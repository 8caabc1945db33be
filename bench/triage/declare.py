"""`e2b-bench expectations RUN --write FILE`: declarations written from a run, one per cause.

Only a finished run is declared from (`--finished-only`: the cases an interrupted run finished, said so). The
run's cases are judged again by FILE (when it exists): what FILE already declares as observed is left alone;
what is no answer of the endpoint's is never declared (the harness's own faults, runner deaths, cases not run
or depending on another, the leak check, the endpoint's transient or capacity answers: `apart`). Every other
failing case is run again once, in one `run --case ...` against the same endpoint (`confirm`), and only one
that fails again with the same signature is declared; the rest are listed as not recurring. The failing cases
then belong to causes (bench/triage/causes.py), and each cause becomes a declaration whose patterns cover
exactly its cases in the run (the fewest: `suite/*/case`, the same body under another flavour, ...), with the
outcome the judge compares, `match` a fragment of the endpoint's words and the observed message as `reason`,
under a `# generated from RUN` comment for a person to edit. A declaration that already has the pattern is
updated, keeping a reason a person wrote. Declarations whose every case in the run passed are stale: listed,
and removed with `--prune`. FILE is written whole, atomically; its comments are kept.
"""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

from bench.expectations import Expectations, ExpectationsError, case_matches, judge
from bench.results import CaseRecord, Run, RunError, atomic_write, read_run
from bench.triage.causes import Cause, apart, find_causes, judged_outcome, message, signature
from bench.verdict import endpoint_flags

GENERATED = "# generated from "
REASON_CHARS = 200
_HEADER = re.compile(r"^\s*\[\s*cases\s*\..+\]\s*(#.*)?$")
_REFUSAL_KEYS = ("status", "code", "message")
CONFIRM_TIMEOUT_S = 3600  # the re-run of the cases to declare: as long as a whole run may take
OUTPUT_TAIL = 2000  # of a re-run that failed to run, what the error quotes

# The cases to declare run again -> that run (None: it could not be run).
Confirm = Callable[[Run, Sequence[CaseRecord]], Run]


class DeclareError(Exception):
    """The run cannot be declared from as asked (not finished, or its failures could not be run again)."""


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
    partial: str | None = None  # the run did not finish: only the cases it finished were declared from
    apart: dict[str, list[str]] = field(default_factory=dict)  # why -> failing cases never declared
    not_recurred: list[str] = field(default_factory=list)  # passed when run again: not declared
    changed: list[str] = field(default_factory=list)  # failed differently when run again: not declared
    # failed both times, the same outcome in other words: declared with either symptom (first, second)
    either: list[tuple[CaseRecord, CaseRecord]] = field(default_factory=list)
    confirmed_by: Path | None = None  # the run that ran the cases to declare again

    def lines(self) -> list[str]:
        said = [f"{self.path}: {self.causes} cause(s) declared: {len(self.added)} added, {len(self.updated)} updated"]
        if self.partial:
            said.insert(0, self.partial)
        said += [f"  added {pattern}" for pattern in self.added]
        said += [f"  updated {pattern}" for pattern in self.updated]
        for pattern in self.stale:
            verb = "removed stale" if pattern in self.pruned else "stale (every case passed; --prune removes it)"
            said.append(f"  {verb}: {pattern}")
        for why, cases in sorted(self.apart.items()):
            said.append(f"  not declared, {why}: {len(cases)} case(s)")
        if self.confirmed_by is not None:
            said.append(f"  each failure was run again to confirm it: {self.confirmed_by}")
        if self.not_recurred:
            said.append(f"  not declared, passed when run again (did not recur): {len(self.not_recurred)} case(s)")
            said += [f"    {case}" for case in self.not_recurred]
        if self.changed:
            said.append(f"  not declared, failed differently when run again: {len(self.changed)} case(s)")
            said += [f"    {case}" for case in self.changed]
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
        if isinstance(value, list):
            lines.append(f"{key} = [{', '.join(_toml_string(str(item)) for item in value)}]")
        else:
            lines.append(f"{key} = {value if isinstance(value, int) else _toml_string(str(value))}")
    return lines


_VERSIONED = re.compile(r"^(?P<family>.+?)-\d[\w.]*$")  # a runner named with its pin: `mastra-0.8.0`


def _candidates(case: CaseRecord) -> list[str]:
    """Patterns that could cover this case, preferred first: the case under every runner, under every pin of its
    runner, the same body under another flavour (`sync_`, `async_`), then in any suite (`*_stdin`), the runner's
    whole suite, the id itself."""
    name, suite = case.case, case.suite
    tokens = name.split("_")
    tails = ["_".join(tokens[start:]) for start in range(1, len(tokens))]  # longest first
    versioned = _VERSIONED.match(case.runner)
    family = [f"{suite}/{versioned['family']}-*/{name}"] if versioned is not None else []
    found = [f"{suite}/*/{name}", *family, *(f"{suite}/*/*_{tail}" for tail in tails), f"*/*/{name}"]
    found += [f"*/*/*_{tail}" for tail in tails]
    found += [f"{suite}/{versioned['family']}-*/*"] if versioned is not None else []
    return [*found, f"{suite}/*", case.id]


def patterns(chosen: Sequence[CaseRecord], every: Iterable[str]) -> list[str]:
    """Fewest fnmatch patterns matching exactly `chosen` among the run's case ids `every` (the most cases first;
    between equals the one preferred in `_candidates`)."""
    wanted = {case.id for case in chosen}
    universe = set(every) | wanted
    coverage: dict[str, set[str]] = {}
    rank: dict[str, int] = {}
    for case in chosen:
        for index, candidate in enumerate(_candidates(case)):
            if candidate not in coverage:
                covered = {identifier for identifier in universe if fnmatchcase(identifier, candidate)}
                if not covered <= wanted:
                    continue
                coverage[candidate] = covered
            rank[candidate] = min(rank.get(candidate, index), index)
    remaining = set(wanted)
    picked: list[str] = []
    while remaining:
        best = max(coverage, key=lambda candidate: (len(coverage[candidate] & remaining), -rank[candidate], candidate))
        picked.append(best)
        remaining -= coverage.pop(best)
    return sorted(picked)


def _rejudged(run: Run, declared: Expectations) -> list[CaseRecord]:
    """The run's cases as FILE would judge them (a retried case by its last record)."""
    latest = {case.id: case for case in run.cases}
    judged = []
    for case in latest.values():
        compared = judged_outcome(case)
        details = {k: v for k, v in case.details.items() if k != "observed_outcome"}
        if case.details.get("observed_outcome") and compared != case.details["observed_outcome"]:
            details["observed_outcome"] = case.details["observed_outcome"]  # a transient's, kept as recorded
        verdict = judge(compared, details, case.error, declared.for_case(case.id))  # type: ignore[arg-type]
        if verdict.outcome != compared:
            details.setdefault("observed_outcome", compared)
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
            governed.setdefault(pattern, []).append(judged_outcome(case))
    return sorted(pattern for pattern, seen in governed.items() if seen and all(o == "pass" for o in seen))


def _by_outcome(cause: Cause) -> list[Cause]:
    """A cause split by the outcome the judge compares: a declaration has one outcome."""
    return [
        Cause(cause.signature, tuple(case for case in cause.cases if judged_outcome(case) == outcome))
        for outcome in cause.outcomes
    ]


def _declaration(cause: Cause, run_id: str, pattern: str | None = None) -> tuple[dict[str, Any], str]:
    """The table a cause is declared with under `pattern` (its `match` found in the symptom of each of the
    cause's cases the pattern covers), and its comment."""
    covered = Cause(cause.signature, tuple(c for c in cause.cases if pattern is None or case_matches(c.id, pattern)))
    part = covered if covered.cases else cause
    said = " ".join(message(part.representative).split())
    said = said if len(said) <= REASON_CHARS else said[: REASON_CHARS - 1] + "…"
    table: dict[str, Any] = {"outcome": cause.outcome, "reason": said}
    pinned = part.match()
    if pinned is not None:
        table["match"] = pinned
    comment = f"{GENERATED}{run_id} ({len(cause.cases)} case(s), cause {cause.key}): edit the reason"
    return table, comment


def unfinished(run: Run) -> str | None:
    """Why `run` did not finish (None when it completed)."""
    if run.footer is None:
        return "has no footer (it was cut short or is still running)"
    if run.status != "completed":
        return f"did not finish (status {run.status})"
    return None


def update_file(
    run: Run, path: Path, prune: bool = False, finished_only: bool = False, confirm: Confirm | None = None
) -> Change:
    """Write FILE's declarations from `run` (see the module); `confirm` runs the cases to declare again (None:
    they are declared unconfirmed). Raises DeclareError for a run that did not finish (unless `finished_only`)
    and ExpectationsError when FILE is unreadable."""
    why_unfinished = unfinished(run)
    if why_unfinished is not None and not finished_only:
        raise DeclareError(
            f"{run.path} {why_unfinished}: an unfinished run's failures are not all the endpoint's; run it to the "
            "end, or pass --finished-only to declare only the cases it finished"
        )
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
    if why_unfinished is not None:
        finished = sum(1 for case in judged if apart(case, declaring=True) != "not run")
        change.partial = f"{run.path} {why_unfinished}: only the {finished} case(s) it finished are declared from"
    stale = set(_stale(declared, judged))
    change.stale = sorted(stale)
    by_pattern = {block.pattern: block for block in blocks}
    failing = [case for case in judged if not case.conformant and case.outcome != "pass"]
    for case in failing:
        why = apart(case, declaring=True)
        if why is not None:
            change.apart.setdefault(why, []).append(case.id)
    chosen = [case for case in failing if apart(case, declaring=True) is None]
    if confirm is not None and chosen:
        chosen = _confirmed(run, chosen, declared, confirm, change)
    causes = find_causes(chosen)
    change.causes = len(causes)
    for cause in (part for whole in causes for part in _by_outcome(whole)):
        for pattern in _existing(declared, cause, judged) + patterns(_undeclared(declared, cause, judged), every):
            table, comment = _declaration(cause, run.run_id, pattern)
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
                for key in _refusal_keys_not_holding(merged, cause, pattern):
                    merged.pop(key)
                change.updated.append(pattern)
            block.body = _table_lines(merged)
    if prune:
        blocks = [block for block in blocks if block.pattern not in stale]
        change.pruned = sorted(stale)
    text = _render(preamble, blocks)
    written = _parse(text, path)
    # A longer pattern already in FILE could still decide some case: those get their own id.
    for cause in (part for whole in causes for part in _by_outcome(whole)):
        for case in cause.cases:
            table, comment = _declaration(cause, run.run_id, case.id)
            if written.for_case(case.id).outcome != table["outcome"] and case.id not in by_pattern:
                blocks.append(Block(case.id, ["", comment], f"[cases.{_toml_string(case.id)}]", _table_lines(table)))
                by_pattern[case.id] = blocks[-1]
                change.added.append(case.id)
    for first, second in change.either:
        if first.id in by_pattern:
            continue
        table, comment = _declaration(Cause(signature(first), (first,)), run.run_id, first.id)
        other, _ = _declaration(Cause(signature(second), (second,)), run.run_id, first.id)
        matches = [m for t in (table, other) for m in _as_list(t.get("match"))]
        if len(matches) < 2:  # a symptom with nothing to pin: the outcome alone is declared
            table.pop("match", None)
        else:
            table["match"] = list(dict.fromkeys(matches))
        table["reason"] = f"fails each time, in either way: {table['reason']}"
        blocks.append(Block(first.id, ["", comment], f"[cases.{_toml_string(first.id)}]", _table_lines(table)))
        by_pattern[first.id] = blocks[-1]
        change.added.append(first.id)
    text = _render(preamble, blocks)
    _parse(text, path)
    atomic_write(path, text)
    return change


def _as_list(match: object) -> list[str]:
    if isinstance(match, str):
        return [match]
    return [str(item) for item in match] if isinstance(match, list) else []


def _refusal_keys_not_holding(table: dict[str, Any], cause: Cause, pattern: str) -> list[str]:
    """The refusal keys (`status`, `code`, `message`) of a declaration being updated that a case of the cause it
    now declares contradicts: a declared refusal the endpoint now gives differently."""
    covered = [case for case in cause.cases if case_matches(case.id, pattern)]
    wrong = []
    for key, holds in (
        ("status", lambda case, value: case.details.get("status_code") == value),
        ("code", lambda case, value: case.details.get("error_code") == value),
        (
            "message",
            lambda case, value: value in " ".join(str(t) for t in (case.error, case.details.get("message")) if t),
        ),
    ):
        if key in table and not all(holds(case, table[key]) for case in covered):
            wrong.append(key)
    return wrong


def _confirmed(
    run: Run, chosen: Sequence[CaseRecord], declared: Expectations, confirm: Confirm, change: Change
) -> list[CaseRecord]:
    """The cases of `chosen` that failed again, the same way, when `confirm` ran them again; the others are
    noted in `change` (passed: did not recur; failed otherwise: changed)."""
    again = confirm(run, chosen)
    change.confirmed_by = again.path
    rerun = {case.id: case for case in _rejudged(again, declared)}
    kept = []
    for case in chosen:
        second = rerun.get(case.id)
        if second is None or second.conformant or second.outcome == "pass":
            change.not_recurred.append(case.id)
        elif apart(second, declaring=True) is not None:
            change.changed.append(case.id)
        elif not _same_failure(case, second):
            if judged_outcome(case) == judged_outcome(second):  # it fails each time, in words that vary
                change.either.append((case, second))
            else:
                change.changed.append(case.id)
        else:
            kept.append(second if case.evidence is None else case)  # the record with its exchanges
    return kept


def _same_failure(first: CaseRecord, second: CaseRecord) -> bool:
    """Did the case fail the same way twice? By signature; a record without exchanges (a case the run's own
    declarations judged conformant keeps none) is compared with the other's without them."""
    if first.evidence is None or second.evidence is None:
        first, second = dataclasses.replace(first, evidence=None), dataclasses.replace(second, evidence=None)
    return signature(first) == signature(second)


def rerun(run: Run, cases: Sequence[CaseRecord]) -> Run:
    """`cases` run again in one `e2b-bench run --case ...` against `run`'s endpoint (its endpoint flags: profile,
    quirks, step timeout...), judged by no declaration, in a directory of its own under the system's temp."""
    flags = endpoint_flags(run)
    kept: list[str] = []
    skip = False
    for index, item in enumerate(flags):  # its own results directory and declarations, not the run's
        if skip:
            skip = False
            continue
        if item in ("--expectations", "--results-dir"):
            skip = index + 1 < len(flags)
            continue
        kept.append(item)
    argv = [str(item) for item in run.header.get("argv", [])]
    if "--max-sandboxes" in argv[:-1]:  # what the endpoint could hold at once
        kept += ["--max-sandboxes", argv[argv.index("--max-sandboxes") + 1]]
    results = Path(tempfile.mkdtemp(prefix="e2b-bench-confirm-"))
    nothing = results / "nothing.toml"
    nothing.write_text(f"[endpoint]\nname = {_toml_string(str(run.header['endpoint']['name']))}\n", "utf-8")
    command = [sys.executable, "-m", "bench.cli", "run", *kept, "--results-dir", str(results / "runs")]
    command += ["--expectations", str(nothing), "--no-report", "-q"]
    command += [item for case in cases for item in ("--case", case.id)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=CONFIRM_TIMEOUT_S, check=False)
    made = sorted(p for p in (results / "runs").glob("*") if p.is_dir()) if (results / "runs").is_dir() else []
    if done.returncode not in (0, 1) or len(made) != 1:
        output = (done.stdout + done.stderr)[-OUTPUT_TAIL:]
        raise DeclareError(
            f"the failures to declare could not be run again to confirm them (exit {done.returncode}): {output}"
        )
    try:
        return read_run(made[0])
    except RunError as error:
        raise DeclareError(f"the run confirming the failures to declare is unreadable: {error}") from None


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
