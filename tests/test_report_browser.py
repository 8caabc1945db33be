"""The rendered report in a real headless Chromium: the matrix is drawn, the verdict comes first, the filter and
the click-through work under real mouse clicks."""

import json
import subprocess
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path

import pytest

from bench.redaction import Redactor
from bench.report import ReportPaths, render
from bench.results import CaseRecord, RunDir, make_header
from tests.cdp import CHROMIUM, Page, chromium_command

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

pytestmark = [
    pytest.mark.chromium,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium at /usr/bin/chromium"),
]


def chromium(profile: Path, *arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        chromium_command(profile, *arguments),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )


class Matrix(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.ready: str | None = None
        self.cells: list[tuple[str, str]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attributes = dict(attrs)
        if tag == "table" and attributes.get("id") == "matrix":
            self.ready = attributes.get("data-ready")
        if tag == "td" and "cell" in (attributes.get("class") or "").split():
            self.cells.append((attributes["data-case"] or "", attributes["data-outcome"] or ""))


@pytest.fixture
def rendered(tmp_path: Path) -> ReportPaths:
    url = "http://127.0.0.1:49999"
    endpoint = {
        "name": "local",
        "api_url": url,
        "sandbox_url": url,
        "kind": "embedded",
        "key_env": "E2B_API_KEY",
    }
    header = make_header(endpoint, {"py-e2b-2.63.0": {"e2b": "2.63.0"}}, ["e2b-bench", "run"])
    run = RunDir.create(tmp_path / "results", "quickstart", "local", header, Redactor())
    for step, outcome in (("py01_create", "pass"), ("py02_run", "fail"), ("py06_volumes", "refused")):
        run.record(
            CaseRecord(
                id=f"quickstart/py-e2b-2.63.0/{step}",
                suite="quickstart",
                runner="py-e2b-2.63.0",
                case=step,
                outcome=outcome,  # type: ignore[arg-type]
                expected="pass",
                conformant=outcome == "pass",
                duration_ms=3.0,
            )
        )
    run.finish("completed", 1)
    return render([run.path], tmp_path / "out")


def test_scripts_run_and_cells_are_in_the_dom(rendered: ReportPaths, tmp_path: Path) -> None:
    dom = chromium(tmp_path / "profile", "--dump-dom", rendered.html.as_uri()).stdout
    matrix = Matrix()

    matrix.feed(dom)

    assert (matrix.ready, sorted(matrix.cells)) == (
        "1",
        [
            ("quickstart/py01_create", "pass"),
            ("quickstart/py02_run", "fail"),
            ("quickstart/py06_volumes", "refused"),
        ],
    )


def test_screenshot_is_a_real_png(rendered: ReportPaths, tmp_path: Path) -> None:
    shot = tmp_path / "report.png"

    chromium(tmp_path / "profile", f"--screenshot={shot}", "--window-size=1280,900", rendered.html.as_uri())

    data = shot.read_bytes()
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert (data[:8], width, height, len(data) > 10_000) == (PNG_SIGNATURE, 1280, 900, True)


FIXTURE_RUN = Path(__file__).parent / "fixtures" / "runs" / "nightly-02"
VISIBLE = "[...document.querySelectorAll({selector})].filter(e => e.offsetParent !== null).map(e => e.dataset.{key})"


@pytest.fixture
def page(tmp_path: Path) -> Iterator[Page]:
    report = render([FIXTURE_RUN], tmp_path / "out")
    with Page(tmp_path / "cdp-profile") as browser:
        browser.goto(report.html.as_uri())
        yield browser


def visible(page: Page, selector: str, key: str) -> list[str]:
    return list(page.evaluate(VISIBLE.format(selector=json.dumps(selector), key=key)))


def test_the_verdict_line_comes_first(page: Page) -> None:
    verdict = page.evaluate(
        "(() => { const v = document.querySelector('h1').nextElementSibling;"
        " return [v.id, v.textContent, v.getBoundingClientRect().top < document.querySelector('#matrix')"
        ".getBoundingClientRect().top, getComputedStyle(v).backgroundColor]; })()"
    )

    assert verdict == ["verdict", "GATE FAILED: 6 case(s), 3 conformant, 3 non-conformant", True, "rgb(253, 226, 226)"]


def test_failures_only_filter_hides_conformant_rows_and_cases(page: Page) -> None:
    before = visible(page, "#matrix tr.case-row", "nc")

    page.click("#failures-only")
    rows = visible(page, "#matrix tr.case-row", "nc")
    suites = visible(page, "#matrix tbody.suite", "suite")
    cases = visible(page, "details.case", "case")
    page.click("#failures-only")

    assert before == ["true", "false", "true", "false", "true", "false"]
    assert (rows, suites, cases) == (
        ["true", "true", "true"],
        ["frameworks", "probes", "quickstart"],
        ["quickstart/py02_run_echo", "probes/pr10_metrics", "frameworks/fw01_proof_task"],
    )
    assert visible(page, "#matrix tr.case-row", "nc") == before


def test_clicking_a_cell_opens_its_case_with_transcript_and_wire_excerpt(page: Page) -> None:
    page.click('td.cell[data-case="frameworks/fw01_proof_task"]')

    opened = page.evaluate("[...document.querySelectorAll('details.case[open]')].map(d => d.dataset.case)")
    shown = page.evaluate(
        "(() => { const d = document.querySelector('details.case[open]'); const t = d.querySelector('pre.transcript');"
        ' return [t.offsetParent !== null, t.textContent.includes(\'"command": "uname -a"\'),'
        " d.querySelector('pre.wire').textContent,"
        " document.querySelector('td.cell.selected').dataset.case]; })()"
    )

    assert opened == ["frameworks/fw01_proof_task"]
    assert shown == [
        True,
        True,
        "02:01:00.000 POST http://127.0.0.1:9/process.Process/Start → 502 (1.0 ms) error: upstream unreachable",
        "frameworks/fw01_proof_task",
    ]


def test_clicking_a_failure_in_the_verdict_opens_its_case(page: Page) -> None:
    page.click('ul.gate-failures li[data-case="probes/py-e2b-2.63.0/pr10_metrics"] a')

    opened = page.evaluate("[...document.querySelectorAll('details.case[open]')].map(d => d.dataset.case)")
    selected = page.evaluate("document.querySelector('td.cell.selected').dataset.case")

    assert (opened, selected) == (["probes/pr10_metrics"], "probes/pr10_metrics")
