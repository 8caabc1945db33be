"""Verdict first: the report, the summary and junit.xml of fixture runs say the same about the gate."""

import json
import shutil
import stat
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from bench.junit import write_junit
from bench.report import ReportPaths, render
from bench.results import read_run
from bench.verdict import rerun_command
from tests.html_dom import elements, select

RUNS = Path(__file__).parent / "fixtures" / "runs"
PY = "py-e2b-2.63.0"
PREFLIGHT = (
    "preflight failed, no case ran: endpoint staging at http://127.0.0.1:9 is unreachable (connection refused): "
    "check E2B_API_URL"
)
RERUN_PY02 = "./e2b-bench run --endpoint staging --step-timeout 120 --case quickstart/py-e2b-2.63.0/py02_run_echo"


def rendered(tmp_path: Path, *names: str) -> ReportPaths:
    return render([RUNS / name for name in names], tmp_path / "out")


@pytest.mark.parametrize(
    ("run", "headline", "passed"),
    [
        ("nightly-01", "GATE PASSED: 6 case(s), 6 conformant, 0 non-conformant", "true"),
        ("nightly-02", "GATE FAILED: 6 case(s), 3 conformant, 3 non-conformant", "false"),
        (
            "aborted-preflight",
            "GATE FAILED: 0 case(s), 0 conformant, 0 non-conformant; 1 run(s) did not finish normally",
            "false",
        ),
        (
            "interrupted",
            "GATE FAILED: 1 case(s), 1 conformant, 0 non-conformant; 1 run(s) did not finish normally",
            "false",
        ),
    ],
)
def test_report_and_summary_open_with_the_verdict(tmp_path: Path, run: str, headline: str, passed: str) -> None:
    paths = rendered(tmp_path, run)

    verdict = select(paths.html.read_text(), "p", id="verdict")
    first_line = paths.markdown.read_text().splitlines()[0]

    assert [(v.text, v.attrs["data-passed"]) for v in verdict] == [(headline, passed)]
    assert first_line == f"## e2b-bench: {'✅' if passed == 'true' else '❌'} {headline}"


def test_verdict_lists_each_nonconformant_case_with_symptom_and_rerun_command(tmp_path: Path) -> None:
    paths = rendered(tmp_path, "nightly-02")

    items = select(paths.html.read_text(), "li", data_case=f"quickstart/{PY}/py02_run_echo")

    assert [" ".join(item.text.split()) for item in items] == [
        f"quickstart/{PY}/py02_run_echo: fail, expected pass — CommandExitException: exit status 1 stderr: echo: "
        f"write error {RERUN_PY02}"
    ]
    assert f"  `{RERUN_PY02}`" in paths.markdown.read_text().splitlines()


@pytest.mark.parametrize(
    ("run", "reason"),
    [
        (
            "aborted-preflight",
            PREFLIGHT,
        ),
        ("interrupted", "interrupted (Ctrl-C or SIGTERM) before every selected case ran; 1 case(s) recorded"),
    ],
)
def test_a_run_that_did_not_finish_says_why_everywhere(tmp_path: Path, run: str, reason: str) -> None:
    paths = rendered(tmp_path, run)

    problems = [p.text for p in select(paths.html.read_text(), "p", class_="problem")]
    summary = paths.markdown.read_text().splitlines()

    assert problems == [reason]
    assert (f"- **{run}: {reason}**" in summary, f"  - why: {reason}" in summary) == (True, True)
    assert "No non-conformant case recorded." not in summary[:3]


@pytest.mark.parametrize(
    ("run", "status", "name", "message"),
    [
        (
            "aborted-preflight",
            None,
            "preflight",
            PREFLIGHT,
        ),
        (
            "interrupted",
            None,
            "not run",
            "interrupted (Ctrl-C or SIGTERM) before every selected case ran; 1 case(s) recorded",
        ),
        (
            "nightly-01",
            "interrupted",
            "not run",
            "interrupted (Ctrl-C or SIGTERM) before every selected case ran; 6 case(s) recorded",
        ),
    ],
)
def test_junit_of_a_run_that_did_not_finish_has_a_failing_case_with_the_reason(
    run: str, status: str | None, name: str, message: str
) -> None:
    root = ET.fromstring(write_junit(RUNS / run, status).split("\n", 1)[1])

    failing = [
        (case.get("classname"), case.get("name"), failure.get("message"), failure.text)
        for case in root.iter("testcase")
        for failure in case.iter("failure")
    ]

    assert failing == [("e2b-bench.run", name, message, message)]


def test_junit_of_a_finished_run_has_no_run_case() -> None:
    root = ET.fromstring(write_junit(RUNS / "nightly-01").split("\n", 1)[1])

    assert (
        sorted({case.get("classname") for case in root.iter("testcase")}),
        [case for case in root.iter("testcase") if list(case)],
    ) == (
        [
            "frameworks.ag2-1_2_1",
            "housekeeping.harness",
            "probes.py-e2b-2_63_0",
            "quickstart.js-e2b-2_51_0",
            "quickstart.py-e2b-2_63_0",
        ],
        [],
    )


def test_junit_failure_carries_symptom_details_and_rerun_command() -> None:
    root = ET.fromstring(write_junit(RUNS / "nightly-02").split("\n", 1)[1])

    case = next(c for c in root.iter("testcase") if c.get("name") == "py02_run_echo")
    failure = case.find("failure")

    assert failure is not None
    assert (case.get("classname"), failure.get("type"), failure.get("message")) == (
        "quickstart.py-e2b-2_63_0",
        "fail",
        "fail (declared pass): CommandExitException: exit status 1",
    )
    assert failure.text == (
        "outcome: fail, declared: pass\n\n"
        "note: declared pass; observed fail\n\n"
        "error:\nCommandExitException: exit status 1\nstderr: echo: write error\n\n"
        f"re-run: {RERUN_PY02}"
    )


def test_matrix_groups_rows_by_suite_with_runners_as_columns(tmp_path: Path) -> None:
    html = rendered(tmp_path, "nightly-02").html.read_text()

    suites = [(body.attrs["data-suite"], body.attrs["data-nc"]) for body in select(html, "tbody", class_="suite")]
    # one table per suite, with the runners that ran it as its columns: the matrix fits the width
    headers = {
        table: [th.text for th in select(part, "th", data_run="nightly-02")]
        for table, part in zip(
            [t.attrs["data-suite"] for t in select(html, "table", class_="matrix")],
            html.split('<table class="matrix"')[1:],
            strict=True,
        )
    }

    assert suites == [("frameworks", "true"), ("housekeeping", "false"), ("probes", "true"), ("quickstart", "true")]
    assert headers == {
        "frameworks": ["ag2-1.2.1"],
        "housekeeping": ["harness"],
        "probes": [PY],
        "quickstart": [PY, "js-e2b-2.51.0"],
    }


def test_pins_are_collapsed_and_not_redacted(tmp_path: Path) -> None:
    html = rendered(tmp_path, "nightly-02").html.read_text()

    pins = select(html, "details", class_="pins")

    assert [" ".join(p.text.split()) for p in pins] == [
        "pins (3 runner(s)) py-e2b-2.63.0 e2b==2.63.0httpx==0.28.1 js-e2b-2.51.0 e2b==2.51.0cookie==0.7.2 "
        "ag2-1.2.1 ag2==1.2.1openai==3.57.0e2b==2.63.0"
    ]
    assert "open" not in pins[0].attrs


def test_click_through_of_a_framework_case_shows_its_transcript_and_its_sandbox_exchanges(tmp_path: Path) -> None:
    html = rendered(tmp_path, "nightly-02").html.read_text()

    case = select(html, "details", data_case="frameworks/fw01_proof_task")[0]
    transcript = [p.text for p in select(html, "pre", class_="transcript")]

    assert case.attrs["data-conformant"] == "false"
    assert len(transcript) == 1 and '"command": "uname -a"' in transcript[0] and transcript[0] in case.text
    assert (
        "wire: exchanges with sandbox i4k2sm0x7v1c9q3e5t8z\n"
        "  02:01:00.000 POST http://127.0.0.1:9/process.Process/Start → 502 (1.0 ms) error: upstream unreachable"
    ) in case.text


def test_click_through_of_an_sdk_case_shows_the_runners_failed_exchanges(tmp_path: Path) -> None:
    html = rendered(tmp_path, "nightly-02").html.read_text()

    case = select(html, "details", data_case="quickstart/py02_run_echo")[0]

    assert "wire: exchanges of py-e2b-2.63.0 that failed (the wire log does not say which step sent them)" in case.text
    assert "02:00:12.300 GET http://127.0.0.1:9/sandboxes/i4k2sm0x7v1c9q3e5t8z/metrics → 404 (3.5 ms)" in case.text
    assert RERUN_PY02 in case.text


def test_coverage_tables_and_percentages(tmp_path: Path) -> None:
    paths = rendered(tmp_path, "nightly-02")
    html = paths.html.read_text()

    rows = {row.attrs["data-route"]: row.text for row in select(html, "tr") if "data-route" in row.attrs}
    sdk = select(html, "table", data_runner=PY)

    assert rows == {
        "/sandboxes": "POST/sandboxes201, 400, 401201, 400, 401—",
        "/sandboxes/{sandboxID}/metrics": "GET/sandboxes/{sandboxID}/metrics200, 404404200the endpoint refuses metrics",
        "/sandboxes/{sandboxID}/pause": (
            "POST/sandboxes/{sandboxID}/pause204, 409—204, 409no suite pauses a paused sandbox"
        ),
    }
    assert "75.0% of public methods exercised; untested: Sandbox.beta_pause" in sdk[0].text
    assert (
        "  - coverage: spec 62.5% of documented operation/status pairs; py-e2b-2.63.0 75.0% of public methods"
        in paths.markdown.read_text().splitlines()
    )


def test_every_artifact_is_readable_by_group_and_others(tmp_path: Path) -> None:
    paths = rendered(tmp_path, "nightly-02")

    assert [stat.S_IMODE(p.stat().st_mode) for p in (paths.html, paths.markdown)] == [0o644, 0o644]


def test_junit_written_while_finishing_a_run_has_no_run_case(tmp_path: Path) -> None:
    # The writer of a run calls write_junit before the footer: no footer and no status is not "truncated".
    run = tmp_path / "finishing"
    shutil.copytree(RUNS / "nightly-01", run)
    document = json.loads((run / "run.json").read_text())
    del document["footer"]
    (run / "run.json").write_text(json.dumps(document))

    root = ET.fromstring(write_junit(run).split("\n", 1)[1])

    assert [case.get("name") for case in root.iter("testcase") if case.get("classname") == "e2b-bench.run"] == []


def test_a_sandbox_named_in_the_error_picks_the_wire_excerpt(tmp_path: Path) -> None:
    run = tmp_path / "named"
    shutil.copytree(RUNS / "nightly-02", run)
    cases = [json.loads(line) for line in (run / "cases.jsonl").read_text().splitlines()]
    for case in cases:
        if case["case"] == "py02_run_echo":
            case["error"] = "SandboxNotFoundException: Sandbox i4k2sm0x7v1c9q3e5t8z not found"
    (run / "cases.jsonl").write_text("".join(json.dumps(case) + "\n" for case in cases))

    html = render([run], tmp_path / "out").html.read_text()

    case = select(html, "details", data_case="quickstart/py02_run_echo")[0]
    assert (
        "wire: exchanges with sandbox i4k2sm0x7v1c9q3e5t8z\n"
        "  02:00:12.300 GET http://127.0.0.1:9/sandboxes/i4k2sm0x7v1c9q3e5t8z/metrics → 404 (3.5 ms)\n"
        "02:00:13.000 POST http://127.0.0.1:9/process.Process/Start → 200 (40.0 ms)\n"
    ) in case.text


@pytest.mark.parametrize(
    ("run_dir", "case", "rerun"),
    [
        (
            RUNS / "nightly-02",
            "housekeeping/harness/leak_check",
            "./e2b-bench run --endpoint staging --step-timeout=120",
        ),
        (
            RUNS.parent / "bench-history" / "20261130T105815Z-bench-local",
            "bench/py-e2b-2.63.0/upload",
            "./e2b-bench bench -n 3 --runner py-e2b-2.63.0 --modes sequential --transfer-mib 1 "
            "--results-dir /tmp/gate-bench --no-report",
        ),
    ],
)
def test_a_case_no_suite_holds_is_rerun_by_the_command_that_made_it(run_dir: Path, case: str, rerun: str) -> None:
    run = read_run(run_dir, allow_truncated=True)
    record = next(record for record in run.cases if record.id == case)

    assert rerun_command(run, record) == rerun


@pytest.mark.parametrize(
    ("argv", "flags"),
    [
        (["run", "--wire-bodies", "--quirk=end_on_exit", "probes"], "--wire-bodies --quirk end_on_exit"),
        (["run", "--wire-bodies", "512", "--attempts", "3"], "--wire-bodies 512 --attempts 3"),
        (
            ["run", "--profile", "b3os-beta", "--matrix", "-k", "py0", "--wire-bodies=64"],
            "--profile b3os-beta --wire-bodies 64",
        ),
    ],
)
def test_the_rerun_repeats_the_flags_that_decide_what_a_case_meets(argv: list[str], flags: str) -> None:
    run = read_run(RUNS / "nightly-02", allow_truncated=True)
    run.header["argv"] = ["/ci/.venv/bin/e2b-bench", *argv]
    case = next(record for record in run.cases if record.id == f"quickstart/{PY}/py02_run_echo")

    assert rerun_command(run, case) == f"./e2b-bench run --endpoint staging {flags} --case {case.id}"


def declared_variant(tmp_path: Path, name: str, declared: set[str]) -> Path:
    """nightly-02 with the cases named declared as they failed (conformant: a declared difference)."""
    run = tmp_path / name
    shutil.copytree(RUNS / "nightly-02", run)
    cases = [json.loads(line) for line in (run / "cases.jsonl").read_text().splitlines()]
    for case in cases:
        if case["case"] in declared:
            case.update(expected=case["outcome"], conformant=True, note=None)
    (run / "cases.jsonl").write_text("".join(json.dumps(case) + "\n" for case in cases))
    return run


def test_the_causes_come_first_one_row_each_and_pins_appear_once_in_the_run_section(tmp_path: Path) -> None:
    html = rendered(tmp_path, "nightly-02").html.read_text()

    rows = select(html, "details", class_="cause")
    order = [html.index(marker) for marker in ('id="verdict"', 'id="failures"', 'id="runs"', 'id="matrix"')]

    assert order == sorted(order)
    assert [(row.attrs["id"], row.attrs["data-count"], row.attrs["data-declared"]) for row in rows] == [
        ("cause-1", "1", "false"),
        ("cause-2", "1", "false"),
        ("cause-3", "1", "false"),
    ]
    first = rows[0]
    summary = html.split('id="cause-1"', 1)[1].split("</summary>", 1)[0]
    assert [span.text for span in select(summary, "span")] == [
        *("1", "1", "✘ fail", "quickstart", PY),
        "exit status 1 stderr: echo: write error",  # the endpoint's words, without the exception's name
        f"quickstart/{PY}/py02_run_echo",
    ]
    # expanding a row shows its cases with their re-runs and the cause's re-run; no pin list per cause
    assert first.text.count(RERUN_PY02) == 2 and "httpx" not in first.text
    assert html.count("httpx==0.28.1") == 1 and html.index("httpx==0.28.1") > html.index('id="runs"')


def test_a_declared_difference_has_its_own_mark_and_only_undeclared_ones_are_red(tmp_path: Path) -> None:
    run = declared_variant(tmp_path, "declared-02", {"pr10_metrics"})

    paths = render([run], tmp_path / "out")
    html, markdown = paths.html.read_text(), paths.markdown.read_text()

    cells = {c.attrs["data-case"]: (c.attrs["data-state"], c.classes) for c in select(html, "td", class_="cell")}
    rows = [
        (r.attrs["id"], r.attrs["data-declared"], "nc" in r.classes) for r in select(html, "details", class_="cause")
    ]
    assert cells["probes/pr10_metrics"] == ("declared", ["cell", "refused", "declared"])
    assert cells["quickstart/py02_run_echo"] == ("nc", ["cell", "fail", "nc"])
    assert rows == [("cause-1", "false", True), ("cause-2", "false", True), ("declared-1", "true", False)]
    assert [d.attrs.get("open") for d in select(html, "details", class_="declared-all")] == [None]  # failures first
    assert "| `pr10_metrics` | ⊘ *D* |" in markdown.splitlines()
    assert any(line.startswith("| 1 | 1 | 🔵 ⊘ refused (declared) | probes |") for line in markdown.splitlines())


def test_a_green_run_with_declared_differences_shows_no_red(tmp_path: Path) -> None:
    run = declared_variant(tmp_path, "green-02", {"pr10_metrics", "py02_run_echo", "fw01_proof_task"})

    html = render([run], tmp_path / "out").html.read_text()

    states = sorted(c.attrs["data-state"] for c in select(html, "td", class_="cell"))
    assert select(html, "p", id="verdict")[0].attrs["data-passed"] == "true"
    assert states == ["declared", "declared", "declared", "pass", "pass", "pass"]
    assert [e for e in elements(html) if "nc" in e.classes and e.tag in ("td", "details", "tr")] == []
    declared = select(html, "details", class_="declared-all")
    assert [(d.attrs.get("open"), " ".join(d.text.split()).startswith("3 declared difference(s) in 3 group(s)"))
            for d in declared] == [("", True)]  # fmt: skip


def test_a_bench_report_opens_with_the_benchmark_and_conformance_follows(tmp_path: Path) -> None:
    history = sorted((RUNS.parent / "bench-history").iterdir())
    runs = []
    for run in history:  # with coverage, as a bench run's conformance details have
        runs.append(tmp_path / run.name)
        shutil.copytree(run, runs[-1])
        shutil.copy(RUNS / "nightly-02" / "coverage.json", runs[-1])

    paths = render(runs, tmp_path / "out")
    html, markdown = paths.html.read_text(), paths.markdown.read_text()

    headings = [h.text for h in select(html, "h2")]
    order = [html.index(marker) for marker in ('id="verdict"', 'class="bench comparison"', 'data-run="', 'id="runs"')]
    assert headings[0] == "Benchmark" and headings.index("Matrix") < headings.index(f"Coverage · {history[0].name}")
    assert order == sorted(order) and html.index('id="coverage-spec"') > html.index('id="matrix"')
    sections = [line for line in markdown.splitlines() if line.startswith("### ")]
    assert sections[:2] == [
        "### Benchmark across runs: ratio to each run's baseline",
        f"### Benchmark: local `{history[0].name}`",
    ]
    assert markdown.index("### Benchmark") < markdown.index("### Runs")


def test_cases_not_run_are_told_apart_from_failing_ones(tmp_path: Path) -> None:
    run = tmp_path / "cut-02"
    shutil.copytree(RUNS / "nightly-02", run)
    cases = [json.loads(line) for line in (run / "cases.jsonl").read_text().splitlines()]
    for case in cases:
        if case["case"] in ("pr10_metrics", "fw01_proof_task", "leak_check"):
            case.update(outcome="error", conformant=False, error="not run: interrupted", details={}, note=None)
    (run / "cases.jsonl").write_text("".join(json.dumps(case) + "\n" for case in cases))

    paths = render([run], tmp_path / "out")
    html, markdown = paths.html.read_text(), paths.markdown.read_text()

    cells = {c.attrs["data-case"]: c.attrs["data-state"] for c in select(html, "td", class_="cell")}
    assert [h.text for h in select(html, "h2", class_="causes-headline")] == ["1 failing case, 1 cause"]
    assert [p.text for p in select(html, "p", class_="not-run")] == [
        "3 case(s) not run (interrupted): no verdict on them"
    ]
    assert [cells[case] for case in ("probes/pr10_metrics", "frameworks/fw01_proof_task")] == ["notrun", "notrun"]
    assert cells["quickstart/py02_run_echo"] == "nc"
    assert "3 case(s) not run (interrupted): no verdict on them." in markdown.splitlines()
    assert [line for line in markdown.splitlines() if line.startswith("- `") and " expected " in line] == [
        f"- `quickstart/{PY}/py02_run_echo`: fail, expected pass — declared pass; observed fail: "
        "`CommandExitException: exit status 1 stderr: echo: write error`"
    ]
