import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from bench.redaction import Redactor
from bench.report import ReportPaths, render
from bench.results import CaseRecord, RunDir, make_header

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
