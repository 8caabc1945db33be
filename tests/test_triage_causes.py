"""Causes (bench/triage/causes.py): failing cases grouped by symptom, causes.json, the report and terminal views."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench.report import render
from bench.results import CaseRecord, Run, read_run, schema_errors
from bench.triage.causes import CAUSES_JSON, find_causes, headline, signature, symptom, terminal_lines, write_causes

REPO = Path(__file__).resolve().parents[1]
RUNS = REPO / "tests" / "fixtures" / "runs"


def case(case_id: str, error: str | None, outcome: str = "fail", expected: str = "pass", **details: Any) -> CaseRecord:
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


@pytest.mark.parametrize(
    ("message", "normalized"),
    [
        ("Sandbox i4k2sm0x7v1c9q3e5t8z not found", "Sandbox <id> not found"),
        ("request 3f2b8c1e-0d4a-4e6b-9c7d-112233445566 failed", "request <uuid> failed"),
        ("ended at 2026-12-01T19:44:06.123Z", "ended at <time>"),
        ("connect to http://127.0.0.1:43111 refused", "connect to <host> refused"),
        ("wrote /home/user/e2b-bench/case-7/file.txt", "wrote <path>"),
        ("digest deadbeef01234567 differs", "digest <id> differs"),
        ("read 1048576 bytes in 12.5ms", "read <n> bytes in <n>ms"),
        ("HTTP 404: metrics are not supported", "HTTP 404: metrics are not supported"),
        ("status 502 after retry", "status 502 after retry"),
        ("pinned e2b 2.63.0 step py01_create", "pinned e2b 2.63.0 step py01_create"),
    ],
)
def test_what_differs_from_case_to_case_is_normalized_and_what_names_the_symptom_stays(
    message: str, normalized: str
) -> None:
    assert symptom(message).normalized == normalized


@pytest.mark.parametrize(
    ("python", "npm"),
    [
        (
            "commands.run(stdin=True): InvalidArgumentException: stdin is not supported",
            "commands.run({stdin: true}): InvalidArgumentError: [invalid_argument] stdin is not supported",
        ),
        (
            "get_metrics: SandboxNotFoundException: Sandbox qu61vyh3cguhjobyhg4t not found",
            "getMetrics: SandboxNotFoundError: Sandbox l3dyzx6pae2ifgdfiubc not found",
        ),
        (
            'observed {"default": "/workspace", "cwd=/tmp": "/workspace"}, E2B: {"default": "/home/user"}',
            'observed {"default":"/workspace","cwd=/tmp":"/workspace"}, E2B: {"default":"/home/user"}',
        ),
        ("AssertionError: exists() returned False", "AssertionError [ERR_ASSERTION]: exists() returned false"),
    ],
)
def test_one_symptom_seen_by_two_languages_is_one_signature_and_one_match(python: str, npm: str) -> None:
    py_case, js_case = case("probes/py-e2b-2.63.0/pr01", python), case("probes/js-e2b-2.51.0/pj01", npm)

    [cause] = find_causes([py_case, js_case])

    assert signature(py_case) == signature(js_case)
    assert cause.match() is not None
    assert all(re.search(str(cause.match()), text) for text in (python, npm))


def test_one_broken_behaviour_through_many_cases_is_one_cause_and_two_symptoms_are_two() -> None:
    cases = [
        case(f"behaviours/py-e2b-2.63.0/{flavour}_{name}", f"Sandbox {sandbox} not found")
        for flavour, name, sandbox in (
            ("sync", "kill", "aaaa1111bbbb2222cccc"),
            ("async", "kill", "dddd3333eeee4444ffff"),
            ("sync", "metrics", "gggg5555hhhh6666iiii"),
        )
    ]
    cases.append(case("behaviours/js-e2b-2.51.0/sync_kill", "kill() returned false, expected true"))
    cases.append(case("probes/py-e2b-2.63.0/pr05_stdin", "declared refused", "pass", "refused"))

    causes = find_causes(cases)

    assert [(len(c.cases), c.outcome) for c in causes] == [(3, "fail"), (1, "fail"), (1, "pass")]
    assert [c.id for c in causes[0].cases] == sorted(c.id for c in cases[:3])
    assert headline(causes) == "5 failing cases, 3 causes"
    assert causes[2].match() is None  # a stale declaration has no symptom to pin


def test_a_refusal_groups_by_the_endpoints_own_words_whichever_route_met_it() -> None:
    sdk = case(
        "probes/py-e2b-2.63.0/pr05_stdin",
        "commands.run(stdin=True): InvalidArgumentException: stdin is not supported: pass input instead",
        "refused",
        status_code=400,
        error_code="invalid_argument",
        message="stdin is not supported: pass input instead",
    )
    wire = case(
        "refusals/py-e2b-2.63.0/rf10_envd_stdin",
        "/process.Process/Start: invalid_argument: stdin is not supported: pass input instead",
        "refused",
        status_code=200,
        error_code="invalid_argument",
        message="stdin is not supported: pass input instead",
    )
    other = case(
        "refusals/py-e2b-2.63.0/rf11_envd_pty",
        "/process.Process/Start: invalid_argument: pty is not supported",
        "refused",
        error_code="invalid_argument",
        message="pty is not supported",
    )

    causes = find_causes([sdk, wire, other])

    assert [sorted(c.case for c in cause.cases) for cause in causes] == [
        ["pr05_stdin", "rf10_envd_stdin"],
        ["rf11_envd_pty"],
    ]
    # a literal fragment of the endpoint's words, as a person reads it
    assert causes[0].match() == "stdin is not supported: pass input instead"


def test_a_retried_case_counts_by_its_last_record_and_conformant_cases_are_no_cause() -> None:
    first = case("quickstart/py-e2b-2.63.0/py02_run_echo", "CommandExitException: exit status 1")
    retried = case("quickstart/py-e2b-2.63.0/py02_run_echo", None, "pass")

    assert find_causes([first, retried]) == []


def test_causes_json_is_written_valid_and_the_report_opens_with_the_causes(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    shutil.copytree(RUNS / "nightly-02", run_dir)

    path = write_causes(run_dir)
    html = render([run_dir], tmp_path / "out").html.read_text()
    markdown = (tmp_path / "out" / "summary.md").read_text()

    document = json.loads(path.read_text())
    assert path == run_dir / CAUSES_JSON
    assert schema_errors("causes", document) == []
    assert (document["headline"], [c["count"] for c in document["causes"]]) == ("3 failing cases, 3 causes", [1, 1, 1])
    assert {c["representative"]["id"] for c in document["causes"]} == {
        "quickstart/py-e2b-2.63.0/py02_run_echo",
        "probes/py-e2b-2.63.0/pr10_metrics",
        "frameworks/ag2-1.2.1/fw01_proof_task",
    }
    # the causes come first: before the per-case list of the gate and the matrix
    assert html.index("3 failing cases, 3 causes") < html.index('class="gate-failures"') < html.index('id="matrix"')
    assert html.count('<details class="cause nc"') == 3
    assert "--case probes/py-e2b-2.63.0/pr10_metrics" in html.split('id="matrix"')[0]
    assert markdown.index("### 3 failing cases, 3 causes") < markdown.index("### Runs")


def test_report_causes_prints_each_cause_with_its_cases_and_rerun_line(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    shutil.copytree(RUNS / "nightly-03", run_dir)

    shown = subprocess.run(
        [sys.executable, "-m", "bench.cli", "report", str(run_dir), "--causes"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )

    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0] == f"{read_run(run_dir).run_id}: 1 failing case, 1 cause"
    assert lines[2].startswith("1. refused x1 [") and lines[2].endswith(
        "] GET /sandboxes/{id}/metrics: HTTP 501: metrics are not implemented"
    )
    assert lines[4] == "   - probes/py-e2b-2.63.0/pr10_metrics"
    assert lines[5].startswith("   re-run probes/py-e2b-2.63.0/pr10_metrics: ./e2b-bench run ")
    assert not (run_dir / "report.html").exists()  # printing writes nothing


def test_a_case_shows_its_own_exchanges_and_a_harness_cause_renders(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    shutil.copytree(RUNS / "nightly-02", run_dir)
    cases = [json.loads(line) for line in (run_dir / "cases.jsonl").read_text().splitlines()]
    exchange = {"ts": "2026-11-30T02:00:12.300Z", "method": "GET", "path": "/sandboxes/x/metrics", "status": 404}
    for record in cases:
        if record["case"] == "pr10_metrics":
            record["evidence"] = [{**exchange, "duration_ms": 3.5, "response": '{"message": "no metrics"}'}]
    leak = {**cases[0], "id": "housekeeping/harness/leak_check", "suite": "housekeeping", "runner": "harness"}
    leak.update(case="leak_check", outcome="fail", conformant=False, error="1 sandbox left running", details={})
    (run_dir / "cases.jsonl").write_text("".join(json.dumps(record) + "\n" for record in [*cases, leak]))

    html = render([run_dir], tmp_path / "out").html.read_text()

    case = html.split('data-case="probes/pr10_metrics"', 2)[2]
    assert "wire: exchanges while this case ran" in case.split("</details>")[0]
    shown = "02:00:12.300 GET /sandboxes/x/metrics → 404 (3.5 ms)\n    response: {&#34;message&#34;: &#34;no metrics"
    assert shown in html
    assert "4 failing cases, 4 causes" in html
    assert '<span class="runners" title="harness">harness</span>' in html


# --- one root, one cause ------------------------------------------------------------------------------------------

AUTO_RESUME = "unsupported_option: 'lifecycle.autoResume' is not supported by this endpoint"
STDIN = "stdin is not supported: pass input in the command instead"


def test_what_the_harness_and_frameworks_put_around_the_endpoints_words_is_no_part_of_the_cause() -> None:
    cases = [
        case("refusals/py-e2b-2.63.0/rf02_create_auto_resume", f"HTTP 400: {AUTO_RESUME}", "refused",
             status_code=400, message=AUTO_RESUME),
        case("behaviours/js-e2b-2.51.0/js_auto_resume", f"SandboxError: 400: {AUTO_RESUME}",
             raised={"exception": "SandboxError", "message": f"400: {AUTO_RESUME}"}),
        case("frameworks/openai-agents-0.24.0/fw01_proof_task",
             f"attempt 2/2: the agent run raised SandboxException: 400: {AUTO_RESUME}; the agent never ran uname"),
        case("frameworks/tanstack-ai-0.58.0/fw02_exit_code",
             f"`exit 5` raised InvalidArgumentError: [invalid_argument] {STDIN}"),
        case("frameworks/tanstack-ai-0.58.0/fw04_spawn_stdin",
             f"spawn('cat') refused: InvalidArgumentError: [invalid_argument] {STDIN}"),
        case("frameworks/mastra-0.8.0/fw01_proof_task",
             f"attempt 2/2: no uname result shows 'Linux': \"Error: [invalid_argument] {STDIN}\"; answer \"Error:\""),
    ]  # fmt: skip

    causes = find_causes(cases)

    assert [sorted(c.case for c in cause.cases) for cause in causes] == [
        ["fw01_proof_task", "js_auto_resume", "rf02_create_auto_resume"],
        ["fw01_proof_task", "fw02_exit_code", "fw04_spawn_stdin"],
    ]
    words = AUTO_RESUME.split(": ", 1)[1]
    assert [cause.signature for cause in causes] == [
        'endpoint: "lifecycle.auto_resume" is not supported by this endpoint',  # one spelling of a name
        f"endpoint: {STDIN}",
    ]
    assert [cause.match() for cause in causes] == [words, STDIN]


def answer(status: int, message: str) -> dict[str, Any]:
    body = json.dumps({"code": status, "message": message})
    return {"ts": "2026-12-06T07:00:00.000Z", "method": "GET", "path": "/x", "status": status, "response": body}


def test_a_clients_own_rendering_of_an_answer_is_one_cause_with_the_answer_its_exchanges_hold() -> None:
    said = "metrics are not supported by this endpoint"
    sdk = case(
        "behaviours/py-e2b-2.63.0/sync_metrics",
        "SandboxNotFoundException: Sandbox sbx-0a1b2c3d4e5f6g not found",
        raised={"exception": "SandboxNotFoundException", "message": "Sandbox sbx-0a1b2c3d4e5f6g not found"},
    )
    raw = case(
        "refusals/py-e2b-2.63.0/rf15_get_metrics",
        f"GET /sandboxes/x/metrics: HTTP 404: {said}",
        "refused",
        status_code=404,
        message=said,
    )
    # the same 404 the SDK renders, while another answer (the next case's) is in the window: the case's own words
    pty = case(
        "probes/py-e2b-2.63.0/pr06_pty",
        "pty.create: InvalidArgumentException: pty is not supported",
        "refused",
        status_code=400,
        message="pty is not supported",
    )
    sdk, raw = (dataclasses.replace(c, evidence=[answer(404, said)]) for c in (sdk, raw))
    pty = dataclasses.replace(pty, evidence=[answer(400, "gzip uploads are not supported")])
    pty.evidence[0]["frames"] = ['end: {"error": {"code": "invalid_argument", "message": "pty is not supported"}}']

    causes = find_causes([sdk, raw, pty])

    assert [(cause.signature, len(cause.cases)) for cause in causes] == [
        (f"endpoint: {said}", 2),
        ("endpoint: pty is not supported", 1),
    ]
    assert causes[0].match() == [said, r"Sandbox \S+ not found"]


def test_checks_comparing_a_value_with_e2bs_are_one_cause_when_the_observed_value_differs_by_the_same_word() -> None:
    cases = [
        case("behaviours/py-e2b-2.63.0/sync_options_end_with_call",
             "given: got '/workspace\\nroot\\n1', expected '/tmp\\nroot\\n1'"),
        case("behaviours/js-e2b-2.51.0/js_process_info", 'cwd: got ["/tmp","/workspace"], expected ["/tmp","/tmp"]'),
        case("probes/py-e2b-2.63.0/pr01_default_cwd",
             'observed {"default": "/workspace"}, E2B: {"default": "/home/user"}', "deviation"),
        case("quickstart/js-e2b-2.51.0/ts06_run_envs_cwd",
             'stdout is "bar\\n/workspace\\n", expected "bar\\n/home/user/x\\n"'),
        case("probes/py-e2b-2.63.0/pr16_output_after_exit", 'observed "early\\n", E2B: "early\\nlate\\n"', "deviation"),
        case("frameworks/ag2-1.2.1/fw03_late_output",
             "no output from `sleep 1; echo late`: stdout '' (expected 'late')"),
    ]  # fmt: skip

    causes = find_causes(cases)

    assert [(cause.signature, sorted(c.case for c in cause.cases)) for cause in causes] == [
        ("differs: observed /workspace",
         ["js_process_info", "pr01_default_cwd", "sync_options_end_with_call", "ts06_run_envs_cwd"]),
        ("differs: lacks late", ["fw03_late_output", "pr16_output_after_exit"]),
    ]  # fmt: skip
    assert causes[0].match() == "/workspace"
    assert causes[0].outcomes == ["fail", "deviation"]


def test_the_endpoints_transient_or_capacity_answer_is_never_a_cause() -> None:
    transient = case(
        "behaviours/py-e2b-2.63.0/sync_kill",
        "endpoint transient (502): 502: sandbox was not found",
        "error",
        cause="endpoint transient (502)",
        observed_outcome="fail",
    )
    capacity = case(
        "refusals/py-e2b-2.63.0/rf18_create_egress_proxy",
        "429: at most 40 sandboxes at once",
        "refused",
        cause="endpoint capacity (429): at most 40 sandboxes at once",
    )
    real = case("probes/py-e2b-2.63.0/pr06_pty", "pty is not supported", "refused", message="pty is not supported")

    assert [[c.id for c in cause.cases] for cause in find_causes([transient, capacity, real])] == [[real.id]]
    header = {"run_id": "r", "endpoint": {"name": "local", "kind": "local"}, "argv": [], "pins": {}}
    run = Run(path=Path("/nonexistent"), header=header, footer=None, cases=[transient, capacity, real])
    assert terminal_lines(run)[:2] == [
        "r: 1 failing case, 1 cause",
        "(2 more failed only by the endpoint's transient or capacity answer: no cause)",
    ]


def test_a_case_kept_from_running_by_a_failed_prerequisite_joins_that_cases_cause() -> None:
    root = case(
        "computer/js-e2b-2.51.0/co02_template_agent_user", "SandboxError: 2: [unknown] missing EndStreamResponse"
    )
    other = case("computer/js-e2b-2.51.0/co01_open", "SandboxError: 2: [unknown] missing EndStreamResponse")
    kept = case("computer/js-e2b-2.51.0/co06_file_streams", "depends on co02_template_agent_user", "error")
    chained = case("computer/js-e2b-2.51.0/co07_release", "depends on co06_file_streams", "error")
    alone = case("computer/js-e2b-2.51.0/co09_x", "depends on co08_not_recorded", "error")

    causes = find_causes([root, other, kept, chained, alone])

    assert [sorted(c.case for c in cause.cases) for cause in causes] == [
        ["co01_open", "co02_template_agent_user", "co06_file_streams", "co07_release"],
        ["co09_x"],
    ]
    # what a declaration pins and shows is the root's own symptom, never "depends on"
    assert causes[0].representative.case in ("co01_open", "co02_template_agent_user")
    assert causes[0].match() == "missing EndStreamResponse" and causes[0].outcome == "fail"
