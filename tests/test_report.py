import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from bench.redaction import Redactor
from bench.report import ReportPaths, render
from bench.results import CaseRecord, RunDir, make_header, read_run

KEY = "e2b_0123456789abcdef0123456789"
RUNNER = "py-e2b-2.63.0"
LONG_ERROR = "SandboxException: " + "x" * 300


def endpoint(name: str) -> dict[str, Any]:
    url = "http://127.0.0.1:49999"
    return {"name": name, "api_url": url, "sandbox_url": url, "kind": "embedded", "key_env": "E2B_API_KEY"}


def make_run(root: Path, name: str, cases: list[tuple[str, str, str, bool]], finished: bool) -> RunDir:
    """A run of `cases` = (step, outcome, expected, conformant), finished or cut short."""
    header = make_header(endpoint(name), {RUNNER: {"e2b": "2.63.0"}}, ["e2b-bench", "run"])
    now = datetime(2026, 11, 30, 1, 2, 3, tzinfo=UTC)
    run = RunDir.create(root, "quickstart", name, header, Redactor([KEY]), now=now)
    for step, outcome, expected, conformant in cases:
        run.record(
            CaseRecord(
                id=f"quickstart/{RUNNER}/{step}",
                suite="quickstart",
                runner=RUNNER,
                case=step,
                outcome=outcome,  # type: ignore[arg-type]
                expected=expected,  # type: ignore[arg-type]
                conformant=conformant,
                duration_ms=42.0,
                error=None if outcome == "pass" else LONG_ERROR,
                details={"status_code": 400, "apiKey": KEY},
            )
        )
    if finished:
        run.finish("completed", 1)
    return run


@dataclass
class Page(HTMLParser):
    """The matrix cells, the table's attributes and the status badges of a report."""

    cells: list[dict[str, str]] = field(default_factory=list)
    table: dict[str, str] = field(default_factory=dict)
    badges: list[str] = field(default_factory=list)
    external: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        super().__init__()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attributes = {name: value or "" for name, value in attrs}
        classes = attributes.get("class", "").split()
        if tag == "section" and attributes.get("id") == "matrix":
            self.table = attributes
        if tag == "td" and "cell" in classes:
            self.cells.append(attributes)
        if tag == "span" and "badge" in classes:
            self.badges.append(classes[1])
        if tag in {"script", "img", "link"} and ("src" in attributes or "href" in attributes):
            self.external.append(tag)


def parse(path: Path) -> Page:
    page = Page()
    page.feed(path.read_text())
    return page


@dataclass(frozen=True)
class Rendered:
    paths: ReportPaths
    local: RunDir
    b3os: RunDir


@pytest.fixture
def report(tmp_path: Path) -> Rendered:
    local = make_run(
        tmp_path / "results",
        "local",
        [("py01_create", "pass", "pass", True), ("py02_run", "fail", "pass", False)],
        finished=True,
    )
    b3os = make_run(
        tmp_path / "results",
        "b3os-beta",
        [("py01_create", "pass", "pass", True), ("py06_volumes", "refused", "refused", True)],
        finished=False,
    )
    return Rendered(render([local.path, b3os.path], tmp_path / "out"), local, b3os)


def test_matrix_has_one_cell_per_case_and_run(report: Rendered) -> None:
    paths, local, b3os = report.paths, report.local, report.b3os

    cells = parse(paths.html).cells

    assert sorted(
        (cell["data-case"], cell["data-run"], cell["data-outcome"], "nc" in cell["class"].split()) for cell in cells
    ) == sorted(
        [
            ("quickstart/py01_create", local.path.name, "pass", False),
            ("quickstart/py02_run", local.path.name, "fail", True),
            ("quickstart/py01_create", b3os.path.name, "pass", False),
            ("quickstart/py06_volumes", b3os.path.name, "refused", False),
        ]
    )


def test_cell_title_carries_the_duration(report: Rendered) -> None:
    paths = report.paths

    cell = next(c for c in parse(paths.html).cells if c["data-case"] == "quickstart/py02_run")

    assert cell["title"] == "fail · 42.0 ms · non-conformant (expected pass)"


def test_truncated_run_has_a_badge(report: Rendered) -> None:
    paths = report.paths

    assert parse(paths.html).badges == ["completed", "truncated"]


def test_html_is_self_contained(report: Rendered) -> None:
    paths = report.paths
    page = parse(paths.html)

    assert (page.table["id"], page.external, "http://" in paths.html.read_text().split("<body>")[0]) == (
        "matrix",
        [],
        False,
    )


def test_case_details_are_pretty_printed_and_redacted(report: Rendered) -> None:
    paths = report.paths

    html = paths.html.read_text()

    assert KEY not in html
    assert "&#34;apiKey&#34;: &#34;[REDACTED]&#34;,\n  &#34;status_code&#34;: 400" in html


def test_markdown_summary(report: Rendered) -> None:
    paths, local, b3os = report.paths, report.local, report.b3os

    lines = paths.markdown.read_text().splitlines()

    stamp = "2026-11-30 01:02:03Z"
    assert lines[0] == (
        "## e2b-bench: ❌ GATE FAILED: 4 case(s), 3 conformant, 1 non-conformant; 1 run(s) did not finish normally"
    )
    assert f"| case | local · {RUNNER} · {stamp} | b3os-beta · {RUNNER} · {stamp} |" in lines
    assert "| `py02_run` | ✘ **NC** |  |" in lines
    assert "| `py06_volumes` |  | ⊘ *D* |" in lines  # refused as declared: a declared difference, not red
    assert f"- **local** `{local.path.name}` — completed: 1 pass, 1 fail · 1 conformant, 1 non-conformant" in lines
    assert f"- **b3os-beta** `{b3os.path.name}` — truncated (no footer: the run did not finish): " in "\n".join(lines)


def test_markdown_lists_nonconformant_cases_with_a_short_error_and_a_rerun_command(
    report: Rendered,
) -> None:
    paths = report.paths

    text = paths.markdown.read_text()
    listed = [line for line in text.splitlines() if line.startswith("- `quickstart/")]
    rerun = text.splitlines()[text.splitlines().index(listed[0]) + 2]

    assert len(listed) == 1
    assert listed[0].startswith(f"- `quickstart/{RUNNER}/py02_run` (local · {RUNNER} · ")
    assert listed[0].endswith(f": `{LONG_ERROR[:199]}…`")
    assert rerun == f"  `./e2b-bench run --endpoint local --case quickstart/{RUNNER}/py02_run`"


def test_everything_written_is_redacted(tmp_path: Path) -> None:
    run = make_run(tmp_path, "local", [("py02_run", "fail", "pass", False)], finished=True)
    # A record written by some other tool, not through RunDir, still leaves the report clean.
    leaky = json.loads((run.path / "cases.jsonl").read_text())
    leaky["error"] = f"X-API-KEY: {KEY}"
    (run.path / "cases.jsonl").write_text(json.dumps(leaky) + "\n")

    paths = render([run.path], tmp_path / "out")

    assert [KEY in path.read_text() for path in (paths.html, paths.markdown)] == [False, False]


def test_a_run_without_cases_renders_and_does_not_read_as_green(tmp_path: Path) -> None:
    run = make_run(tmp_path, "local", [], finished=False)

    paths = render([run.path], tmp_path / "out")

    lines = paths.markdown.read_text().splitlines()
    assert (parse(paths.html).cells, lines[:3], "No non-conformant case recorded." in lines) == (
        [],
        [
            "## e2b-bench: ❌ GATE FAILED: 0 case(s), 0 conformant, 0 non-conformant; 1 run(s) did not finish normally",
            "",
            f"- **{run.path.name}: no footer: the run did not finish (killed, or still running); 0 case(s) recorded**",
        ],
        False,
    )


SUMMARY_BYTES = 64 * 1024


def failing_run(root: Path, name: str, failing: int, error_bytes: int, passing: bool = False) -> RunDir:
    """A run of `failing` cases, each failing its own way with an error of `error_bytes` (one cause each), over
    ten suites; or all of them passing."""
    header = make_header(endpoint(name), {RUNNER: {f"package-{n}": "1.0.0" for n in range(150)}}, ["e2b-bench", "run"])
    run = RunDir.create(root, "many", name, header, Redactor([KEY]))
    for n in range(failing):
        suite, step = f"suite{n % 10}", f"case_{n:03d}_" + "long_name_" * 4
        tag = "".join(chr(ord("a") + n // 26**i % 26) for i in range(3))  # a word of its own: a cause of its own
        words = f"check {tag} failed: " + ("the sandbox answered something else " * (error_bytes // 36 + 1))
        run.record(
            CaseRecord(
                id=f"{suite}/{RUNNER}/{step}",
                suite=suite,
                runner=RUNNER,
                case=step,
                outcome="pass" if passing else "fail",
                expected="pass",
                conformant=passing,
                duration_ms=1.0,
                error=None if passing else f"AssertionError: {words[:error_bytes]}",
            )
        )
    run.finish("completed", 0 if passing else 1)
    return run


@pytest.mark.parametrize("error_bytes", [80, 5000])
def test_summary_of_200_failing_cases_fits_a_ci_step_summary(tmp_path: Path, error_bytes: int) -> None:
    from bench.compare import diff

    baseline = failing_run(tmp_path / "results", "base", 200, error_bytes, passing=True)
    run = failing_run(tmp_path / "results", "local", 200, error_bytes)
    changes = diff(read_run(baseline.path), read_run(run.path)).to_model()

    paths = render([run.path], tmp_path / "out", changes=changes)

    text = paths.markdown.read_text()
    lines = text.splitlines()
    assert len(text.encode()) <= SUMMARY_BYTES
    assert lines[0] == "## e2b-bench: ❌ GATE FAILED: 200 case(s), 0 conformant, 200 non-conformant"
    assert [line for line in lines if line.startswith("### 200")] == ["### 200 failing cases, 200 causes"]
    table = [line for line in lines if line.startswith("| ") and "🔴" in line]
    # the largest causes first, the rest named with their count and where they are
    assert 5 <= len(table) < 200 and table[0].startswith("| 1 | 1 | 🔴 ✘ fail | suite0 | py-e2b-2.63.0 | `")
    more = [line for line in lines if "more cause(s): report.html" in line]
    assert more == [f"| | {200 - len(table)} | | | | … and {200 - len(table)} more cause(s): report.html |"]
    assert "### What changed since `" in text and "new failure" in text
    assert text.index("failing cases, 200 causes") < text.index("### What changed since")
    # everything is in the report
    html = paths.html.read_text()
    assert html.count('<details class="cause nc"') == 200


def test_summary_keeps_everything_when_it_fits(tmp_path: Path) -> None:
    run = failing_run(tmp_path / "results", "local", 5, 80)

    text = render([run.path], tmp_path / "out").markdown.read_text()

    assert ("more cause(s)" in text, "<summary>Pins</summary>" in text, text.count("\n- `suite")) == (False, True, 5)
