"""Declarations written from a run (`e2b-bench expectations RUN --write FILE`, bench/triage/declare.py)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from bench.expectations import Expectations, ExpectationsError, compared_outcome, judge
from bench.results import CaseRecord, Run
from bench.triage.declare import DeclareError, patterns, update_file

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
            compared_outcome(c.outcome, c.details, c.note),  # type: ignore[arg-type]
            c.details,
            c.error,
            declared.for_case(c.id),
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


# --- a fixed point: only a finished run, only the endpoint's behaviour, only what recurs -------------------------

NOT_RUN = "not run: the run was interrupted"  # bench/runners/protocol.py INTERRUPTED
AUTO_RESUME = "unsupported_option: 'lifecycle.autoResume' is not supported by this endpoint"


def unfinished_run(footer: dict[str, Any] | None, *cases: CaseRecord) -> Run:
    return dataclasses.replace(run_of(*cases), footer=footer)


@pytest.mark.parametrize(
    ("footer", "why"),
    [
        ({"status": "interrupted"}, "did not finish (status interrupted)"),
        (None, "has no footer (it was cut short or is still running)"),
    ],
)
def test_a_run_that_did_not_finish_is_refused_unless_only_its_finished_cases_are_asked_for(
    tmp_path: Path, footer: dict[str, Any] | None, why: str
) -> None:
    path = tmp_path / "endpoint.toml"
    finished = case(f"probes/{PY}/pr05_stdin", "refused", STDIN, status_code=400, message=STDIN)
    not_run = case(f"probes/{PY}/pr06_pty", "error", NOT_RUN)
    run = unfinished_run(footer, finished, not_run)

    with pytest.raises(DeclareError) as refused:
        update_file(run, path)
    change = update_file(run, path, finished_only=True)

    assert str(refused.value) == (
        f"/nonexistent {why}: an unfinished run's failures are not all the endpoint's; run it to the end, "
        "or pass --finished-only to declare only the cases it finished"
    )
    assert change.partial == f"/nonexistent {why}: only the 1 case(s) it finished are declared from"
    assert change.lines()[0] == change.partial
    assert change.added == ["probes/*/pr05_stdin"]
    assert change.apart == {"not run": [not_run.id]}
    declared = Expectations.load(path)
    assert declared.for_case(not_run.id).outcome == "pass"


def test_what_is_no_behaviour_of_the_endpoints_is_never_declared(tmp_path: Path) -> None:
    path = tmp_path / "endpoint.toml"
    behaviour = case(f"behaviours/{PY}/sync_auto_resume", "fail", f"SandboxException: 400: {AUTO_RESUME}")
    others = {
        "the harness's own check of the run (the leak check)": case(
            "housekeeping/harness/leak_check", "error", "1 sandbox left running: sbx-0a1b2c3d4e5f6g7h8i9j"
        ),
        "its runner died": case(
            f"behaviours/{JS}/js_kill", "error", "runner died before this step: exit code 1; stderr tail: Error"
        ),
        "not run": case(f"behaviours/{JS}/js_metrics", "error", NOT_RUN),
        "it depends on a case that did not answer": case(
            "code-interpreter/js-code-interpreter-2.8.0/ci11_context_isolation", "error", "depends on ci02_state"
        ),
        "a harness fault": case(
            "frameworks/ag2-1.2.1/fw01_proof_task", "error", "runner environment ag2-1.2.1 could not be built: x"
        ),
        "the endpoint's transient or capacity answer, not its behaviour": case(
            f"behaviours/{PY}/sync_kill",
            "error",
            "endpoint transient (502): SandboxException: 502: sandbox was not found",
            cause="endpoint transient (502)",
            observed_outcome="fail",
        ),
    }
    capacity = case(
        f"refusals/{PY}/rf18_create_egress_proxy",
        "refused",
        "429: at most 40 sandboxes at once",
        cause="endpoint capacity (429): at most 40 sandboxes at once",
    )
    run = run_of(behaviour, *others.values(), capacity)

    change = update_file(run, path)

    assert change.added == ["behaviours/*/sync_auto_resume"]
    transient = "the endpoint's transient or capacity answer, not its behaviour"
    assert change.apart == {
        **{why: [c.id] for why, c in others.items() if why != transient},
        transient: sorted([others[transient].id, capacity.id]),
    } or change.apart == {
        **{why: [c.id] for why, c in others.items() if why != transient},
        transient: [capacity.id, others[transient].id],
    }
    assert list(Expectations.load(path).cases) == ["behaviours/*/sync_auto_resume"]
    assert Expectations.load(path).cases["behaviours/*/sync_auto_resume"].match == AUTO_RESUME.split(": ", 1)[1]


def test_the_outcome_declared_is_the_one_the_judge_compares(tmp_path: Path) -> None:
    path = tmp_path / "endpoint.toml"
    # the judge made a declared failure a deviation (its match differed): it compared what the runner observed
    rematched = case(
        f"behaviours/{PY}/sync_stdin",
        "deviation",
        f"InvalidArgumentException: {STDIN}",
        expected="fail",
        observed_outcome="fail",
    )
    rematched = dataclasses.replace(
        rematched, note=f"declared fail (match 'x'), observed a different failure: InvalidArgumentException: {STDIN}"
    )
    # recorded `error` (the runner's `fail` turned into an error before judgement): the judge compared `error`
    errored = case(f"behaviours/{PY}/sync_pty_bytes", "error", "pty is not supported", observed_outcome="fail")
    errored = dataclasses.replace(errored, note="declared pass; observed error")
    run = run_of(rematched, errored)

    update_file(run, path)

    declared = Expectations.load(path)
    assert declared.for_case(rematched.id).outcome == "fail"
    assert declared.for_case(errored.id).outcome == "error"
    assert all(conformant_under(path, run).values())


def test_only_a_failure_that_recurs_the_same_way_is_declared(tmp_path: Path) -> None:
    path = tmp_path / "endpoint.toml"
    recurs = case(f"probes/{PY}/pr05_stdin", "refused", STDIN, status_code=400, message=STDIN)
    passes = case(f"probes/{PY}/pr13_large_output", "fail", "TimeoutException: Request timed out")
    changes = case(f"probes/{PY}/pr06_pty", "refused", "pty is not supported", message="pty is not supported")
    again = [
        recurs,
        case(passes.id, "pass"),
        case(changes.id, "fail", "SandboxException: 502: sandbox was not found"),
    ]
    asked: list[list[str]] = []

    def confirm(run: Run, cases: Sequence[CaseRecord]) -> Run:
        asked.append([c.id for c in cases])
        return dataclasses.replace(run_of(*again), path=tmp_path / "again")

    change = update_file(run_of(recurs, passes, changes), path, confirm=confirm)

    assert [sorted(ids) for ids in asked] == [sorted([recurs.id, passes.id, changes.id])]
    assert change.added == ["probes/*/pr05_stdin"]
    assert (change.not_recurred, change.changed, change.confirmed_by) == ([passes.id], [changes.id], tmp_path / "again")
    said = "\n".join(change.lines())
    assert f"not declared, passed when run again (did not recur): 1 case(s)\n    {passes.id}" in said
    assert f"not declared, failed differently when run again: 1 case(s)\n    {changes.id}" in said


def test_a_case_that_fails_each_time_in_other_words_is_declared_with_either_symptom(tmp_path: Path) -> None:
    # an endpoint whose timing decides how a case fails (a command pool, a 502 after a delete): it fails each time
    path = tmp_path / "endpoint.toml"
    first = case(f"behaviours/{PY}/sync_connect_command", "fail", "CommandExitException: Command exited with code -1")
    second = case(first.id, "fail", "TimeoutException: Request timed out: the total time a long running request")

    change = update_file(
        run_of(first), path, confirm=lambda run, cases: dataclasses.replace(run_of(second), path=tmp_path / "again")
    )

    declared = Expectations.load(path).for_case(first.id)
    assert (change.added, change.changed) == ([first.id], [])
    assert declared.outcome == "fail" and isinstance(declared.match, tuple) and len(declared.match) == 2
    assert all(conformant_under(path, run_of(record)).values() for record in (first, second))
    # a third way it was never seen to fail is not declared
    third = case(first.id, "fail", "SandboxException: 500: internal error")
    assert conformant_under(path, run_of(third)) == {first.id: False}


def test_an_updated_refusal_drops_what_the_endpoint_now_answers_differently(tmp_path: Path) -> None:
    path = tmp_path / "endpoint.toml"
    path.write_text(
        '[endpoint]\nname = "x"\n\n[cases."probes/*/pr11_template_build"]\noutcome = "refused"\n'
        'reason = "no builds"\nstatus = 501\ncode = "not_implemented"\nmessage = "cannot build templates"\n'
    )
    said = "template builds are not implemented by this endpoint"
    built = case(
        f"probes/{PY}/pr11_template_build",
        "deviation",
        f"POST /v3/templates: HTTP 501: {said}",
        expected="refused",
        status_code=501,
        error_code="not_implemented",
        message=said,
        observed_outcome="refused",
    )
    built = dataclasses.replace(built, note="refused differently: message lacks 'cannot build templates'")

    change = update_file(run_of(built), path)

    declared = Expectations.load(path).cases["probes/*/pr11_template_build"]
    assert change.updated == ["probes/*/pr11_template_build"]
    assert (declared.status, declared.code, declared.message, declared.reason) == (
        501,
        "not_implemented",
        None,
        "no builds",
    )
    assert declared.match == said
    assert all(conformant_under(path, run_of(built)).values())


def test_a_failure_recorded_without_its_exchanges_recurs_when_run_again_with_them(tmp_path: Path) -> None:
    # judged conformant by the run's own declarations, a case keeps no exchanges; run again, it has them
    gone = "Sandbox sbx-0a1b2c3d4e5f6g7h not found"
    first = case(f"behaviours/{PY}/sync_metrics", "fail", f"SandboxNotFoundException: {gone}",
                 raised={"exception": "SandboxNotFoundException", "message": gone})  # fmt: skip
    answer = {"ts": "2026-12-06T07:00:00.000Z", "method": "GET", "path": "/sandboxes/x/metrics", "status": 404,
              "response": '{"code": 404, "message": "metrics are not supported by this endpoint"}'}  # fmt: skip
    second = dataclasses.replace(first, evidence=[answer])

    change = update_file(
        run_of(first), tmp_path / "endpoint.toml", confirm=lambda run, cases: dataclasses.replace(run_of(second))
    )

    assert (change.added, change.changed, change.not_recurred) == (["behaviours/*/sync_metrics"], [], [])
