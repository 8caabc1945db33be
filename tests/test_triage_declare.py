"""Declarations written from a run (`e2b-bench expectations RUN --write FILE`, bench/triage/declare.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bench.expectations import Expectations, ExpectationsError, judge
from bench.results import CaseRecord, Run
from bench.triage.declare import patterns, update_file

PY, JS = "py-e2b-2.63.0", "js-e2b-2.51.0"


def case(case_id: str, outcome: str, error: str | None = None, expected: str = "pass", **details: Any) -> CaseRecord:
    suite, runner, name = case_id.split("/", 2)
    return CaseRecord(
        id=case_id,
        suite=suite,
        runner=runner,
        case=name,
        outcome=outcome,  # type: ignore[arg-type]
        expected=expected,  # type: ignore[arg-type]
        conformant=outcome == expected,
        error=error,
        details=dict(details),
    )


def run_of(*cases: CaseRecord) -> Run:
    header = {"run_id": "20261201T000000Z-probes-local", "endpoint": {"name": "local"}, "argv": [], "pins": {}}
    return Run(path=Path("/nonexistent"), header=header, footer={"status": "completed"}, cases=list(cases))


def conformant_under(path: Path, run: Run) -> dict[str, bool]:
    declared = Expectations.load(path)
    return {
        c.id: judge(
            c.details.get("observed_outcome", c.outcome), c.details, c.error, declared.for_case(c.id)
        ).conformant
        for c in run.cases
    }


STDIN = "stdin is not supported: pass input in the command instead"
QUIRKY = run_of(
    case(f"probes/{PY}/pr05_stdin", "refused", f"commands.run(stdin=True): InvalidArgumentException: {STDIN}",
         status_code=400, error_code="invalid_argument", message=STDIN),
    case(f"probes/{JS}/pj02_stdin", "refused", f"commands.run({{stdin: true}}): InvalidArgumentError: {STDIN}",
         status_code=400, error_code="invalid_argument", message=f"[invalid_argument] {STDIN}"),
    case(f"behaviours/{PY}/sync_stdin", "fail", "Sandbox abcd1234efgh5678ijkl not found"),
    case(f"behaviours/{PY}/async_stdin", "fail", "Sandbox zyxw9876vuts5432rqpo not found"),
    case(f"behaviours/{PY}/sync_kill", "pass"),
    case(f"probes/{PY}/pr01_default_cwd", "pass"),
)  # fmt: skip


@pytest.mark.parametrize(
    ("chosen", "expected"),
    [
        # the same body under both flavours and nothing else of the run: one pattern
        ([f"behaviours/{PY}/sync_stdin", f"behaviours/{PY}/async_stdin"], ["behaviours/*/*_stdin"]),
        # one case under every runner that ran it
        ([f"probes/{PY}/pr05_stdin"], ["probes/*/pr05_stdin"]),
        # a compact pattern would cover a case of the run that is not the cause's: the id itself
        ([f"behaviours/{PY}/sync_stdin"], ["behaviours/*/sync_stdin"]),
    ],
)
def test_a_pattern_is_compact_only_when_it_covers_exactly_the_causes_cases(
    chosen: list[str], expected: list[str]
) -> None:
    by_id = {c.id: c for c in QUIRKY.cases}

    assert patterns([by_id[i] for i in chosen], by_id) == expected


def test_a_compact_pattern_that_covers_another_case_of_the_run_is_not_used() -> None:
    cases = [case(f"behaviours/{runner}/sync_kill", "fail", "x") for runner in (PY, JS)]

    # the case under every pin of its own runner, not under the other runner
    assert patterns(cases[:1], [c.id for c in cases]) == ["behaviours/py-e2b-*/sync_kill"]


def test_declarations_written_from_a_run_make_it_conformant_one_per_cause(tmp_path: Path) -> None:
    path = tmp_path / "mine.toml"

    change = update_file(QUIRKY, path)

    assert change.causes == 2
    # pr05_stdin and pj02_stdin are the run's only cases named *_stdin in probes: one compact pattern
    assert sorted(change.added) == ["behaviours/*/*_stdin", "probes/*/*_stdin"]
    assert all(conformant_under(path, QUIRKY).values())
    text = path.read_text()
    assert text.startswith('[endpoint]\nname = "local"\n')
    assert text.count("# generated from 20261201T000000Z-probes-local") == 2
    declared = Expectations.load(path)
    assert declared.cases["behaviours/*/*_stdin"].outcome == "fail"
    assert declared.cases["behaviours/*/*_stdin"].match == r"Sandbox \S+ not found"
    assert declared.cases["probes/*/*_stdin"].reason == f"invalid_argument: {STDIN}"


def test_a_different_failure_of_a_written_declaration_fails_the_gate(tmp_path: Path) -> None:
    path = tmp_path / "mine.toml"
    update_file(QUIRKY, path)
    broken = run_of(case(f"behaviours/{PY}/sync_stdin", "fail", "SandboxException: 502 Bad Gateway"))

    assert conformant_under(path, broken) == {f"behaviours/{PY}/sync_stdin": False}


PERSON = """# b3os: what a person knows
[endpoint]
name = "b3os"
description = "kept"

# stdin: the vendor says it is on the roadmap
[cases."probes/*/pr05_stdin"]
outcome = "fail"
reason = "a person's reason"

[cases."probes/*/pr01_default_cwd"]
outcome = "deviation"
reason = "cwd was /workspace"
"""


def test_an_update_keeps_a_persons_reasons_and_comments_and_lists_what_went_stale(tmp_path: Path) -> None:
    path = tmp_path / "b3os.toml"
    path.write_text(PERSON)

    change = update_file(QUIRKY, path)

    text = path.read_text()
    declared = Expectations.load(path)
    assert change.updated == ["probes/*/pr05_stdin"]
    assert change.stale == ["probes/*/pr01_default_cwd"]
    assert (declared.cases["probes/*/pr05_stdin"].outcome, declared.cases["probes/*/pr05_stdin"].reason) == (
        "refused",
        "a person's reason",
    )
    assert text.startswith('# b3os: what a person knows\n[endpoint]\nname = "b3os"\ndescription = "kept"\n')
    assert '# stdin: the vendor says it is on the roadmap\n[cases."probes/*/pr05_stdin"]' in text
    assert "probes/*/pr01_default_cwd" in declared.cases  # listed, kept without --prune
    assert "stale (every case passed; --prune removes it): probes/*/pr01_default_cwd" in "\n".join(change.lines())


def test_prune_removes_the_stale_declarations(tmp_path: Path) -> None:
    path = tmp_path / "b3os.toml"
    path.write_text(PERSON)

    change = update_file(QUIRKY, path, prune=True)

    assert change.pruned == ["probes/*/pr01_default_cwd"]
    assert "pr01_default_cwd" not in path.read_text()
    assert all(conformant_under(path, QUIRKY).values())


def test_an_unreadable_file_is_left_as_it_was(tmp_path: Path) -> None:
    path = tmp_path / "broken.toml"
    path.write_text("[endpoint\n")

    with pytest.raises(ExpectationsError, match=r"broken\.toml"):
        update_file(QUIRKY, path)

    assert path.read_text() == "[endpoint\n"
