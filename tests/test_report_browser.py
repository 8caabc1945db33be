"""The rendered report in a real headless Chromium (Playwright driving the system's browser) at 1400x1000: the
first screen says what is wrong, anchors land and open their target, causes and cases expand and collapse under
real mouse clicks, and nothing scrolls sideways."""

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page

from bench.redaction import Redactor
from bench.report import render
from bench.results import CaseRecord, RunDir, make_header
from tests.browser import chromium

pytestmark = [pytest.mark.chromium]

RUNS = Path(__file__).parent / "fixtures" / "runs"
# Apart from runs/, whose every run is a night of `report --history`
B3OS_BETA = Path(__file__).parent / "fixtures" / "failing" / "b3os-beta"
WIDTH, HEIGHT = 1400, 1000
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
PY = "py-e2b-2.63.0"
VISIBLE = "(s) => [...document.querySelectorAll(s)].filter(e => e.offsetParent !== null).map(e => e.dataset.{key})"
# Where an element is in the window: [top, bottom] of its box, or null when it is not displayed.
BOX = "(e) => { const r = e.getBoundingClientRect(); return e.offsetParent === null ? null : [r.top, r.bottom]; }"
SIDEWAYS = "() => [document.documentElement.scrollWidth, document.documentElement.clientWidth]"


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with chromium() as launched:
        yield launched


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """nightly-02 (3 causes, transcripts, wire logs) and a b3os-beta run judged by the faithful declarations (121
    failing cases in 34 causes over 14 runners, every runner's full pins)."""
    out = tmp_path_factory.mktemp("reports")
    return {
        "nightly-02": render([RUNS / "nightly-02"], out / "nightly-02").html,
        "b3os-beta": render([B3OS_BETA], out / "b3os-beta").html,
    }


def open_page(browser: Browser, report: Path, fragment: str = "") -> Page:
    page = browser.new_page(viewport={"width": WIDTH, "height": HEIGHT})
    page.goto(report.as_uri() + fragment)
    page.wait_for_function("document.getElementById('matrix').dataset.ready === '1'")
    return page


@pytest.fixture
def page(browser: Browser, reports: dict[str, Path]) -> Iterator[Page]:
    shown = open_page(browser, reports["nightly-02"])
    yield shown
    shown.close()


def visible(page: Page, selector: str, key: str) -> list[str]:
    return list(page.evaluate(VISIBLE.format(key=key), selector))


def box(page: Page, selector: str) -> list[float] | None:
    found = page.evaluate(f"(s) => ({BOX})(document.querySelector(s))", selector)
    return None if found is None else list(found)


def opened(page: Page) -> list[str]:
    return list(page.evaluate("[...document.querySelectorAll('details.case[open]')].map(d => d.dataset.case)"))


def test_scripts_run_and_cells_are_in_the_dom(page: Page) -> None:
    cells = page.evaluate("[...document.querySelectorAll('td.cell')].map(c => [c.dataset.case, c.dataset.state])")

    assert sorted(map(tuple, cells)) == [
        ("frameworks/fw01_proof_task", "nc"),
        ("housekeeping/leak_check", "pass"),
        ("probes/pr10_metrics", "nc"),
        ("quickstart/py01_create", "pass"),
        ("quickstart/py02_run_echo", "nc"),
        ("quickstart/ts01_create", "pass"),
    ]


def test_screenshot_is_a_real_png(page: Page) -> None:
    data = page.screenshot()

    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert (data[:8], width, height, len(data) > 10_000) == (PNG_SIGNATURE, WIDTH, HEIGHT, True)


def test_the_first_screen_is_the_verdict_then_every_cause(page: Page) -> None:
    verdict = page.evaluate(
        "(() => { const v = document.querySelector('h1').nextElementSibling;"
        " return [v.id, v.textContent, getComputedStyle(v).backgroundColor]; })()"
    )
    rows = page.evaluate(f"[...document.querySelectorAll('details.cause > summary')].map({BOX})")

    assert verdict == ["verdict", "GATE FAILED: 6 case(s), 3 conformant, 3 non-conformant", "rgb(253, 226, 226)"]
    assert len(rows) == 3 and all(0 < top < bottom <= HEIGHT for top, bottom in rows)
    # the rows are the first thing under the verdict; the run section (pins) and the matrix come after
    assert rows[0][0] < (box(page, "#runs") or [0])[0] < (box(page, "#matrix") or [0])[0]


def test_the_causes_of_a_b3os_beta_run_fit_two_screens_with_pins_once_and_nothing_sideways(
    browser: Browser, reports: dict[str, Path]
) -> None:
    page = open_page(browser, reports["b3os-beta"])

    failures = box(page, "#failures")
    rows = page.evaluate("document.querySelectorAll('details.cause.nc').length")
    pins = page.evaluate("document.body.innerText.split('@ai-sdk/provider==').length - 1")  # a pin of mastra
    sideways = page.evaluate(SIDEWAYS)
    page.close()

    assert failures is not None and rows == 34
    assert failures[1] - failures[0] <= 2 * HEIGHT, failures
    assert pins == 0  # the pins are folded in the run section, once: never per cause
    assert sideways == [WIDTH, WIDTH]


def test_the_pins_are_in_the_run_section_once(browser: Browser, reports: dict[str, Path]) -> None:
    page = open_page(browser, reports["b3os-beta"])

    page.click("#runs details.pins > summary")
    text = page.evaluate("document.body.innerText")
    inside = page.evaluate("document.querySelector('#runs').innerText")
    page.close()

    pin = "@ai-sdk/provider==4.0.38"  # a transitive pin of the mastra runner
    assert text.count(pin) == inside.count(pin) >= 1
    assert text.count("==") == inside.count("==") > 1000  # every pin of every runner, there and nowhere else


def test_failures_anchor_lands_on_the_causes_and_keeps_only_non_conformant_cases(
    browser: Browser, reports: dict[str, Path]
) -> None:
    page = open_page(browser, reports["nightly-02"], "#failures")

    where = box(page, "#failures")
    rows = visible(page, "#matrix tr.case-row", "nc")
    suites = visible(page, "#matrix tbody.suite", "suite")
    checked = page.evaluate("document.getElementById('failures-only').checked")
    page.close()

    assert where is not None and abs(where[0]) <= 1
    assert (checked, rows, suites) == (True, ["true", "true", "true"], ["frameworks", "probes", "quickstart"])


def test_a_cause_anchor_opens_that_cause_on_screen(browser: Browser, reports: dict[str, Path]) -> None:
    page = open_page(browser, reports["b3os-beta"], "#cause-30")

    state = page.evaluate("[...document.querySelectorAll('details.cause[open]')].map(d => d.id)")
    where = box(page, "#cause-30")
    page.close()

    assert state == ["cause-30"]
    assert where is not None and 0 <= where[0] < HEIGHT


def test_a_case_anchor_is_the_case_id_and_opens_it_on_screen(browser: Browser, reports: dict[str, Path]) -> None:
    case = f"probes/{PY}/pr10_metrics"
    page = open_page(browser, reports["nightly-02"], f"#{case}")

    state = opened(page)
    where = page.evaluate(f"(id) => ({BOX})(document.getElementById(id))", case)
    page.close()

    assert state == ["probes/pr10_metrics"]
    assert where is not None and 0 <= where[0] < HEIGHT


def test_a_cause_expands_to_its_cases_and_reruns_and_collapses(page: Page) -> None:
    rerun = f"./e2b-bench run --endpoint staging --step-timeout 120 --case quickstart/{PY}/py02_run_echo"

    page.click("#cause-1 > summary")
    expanded = page.evaluate(
        "(() => { const d = document.getElementById('cause-1'); return [d.open,"
        " [...d.querySelectorAll('ul.gate-failures li')].map(li => li.dataset.case),"
        " [...d.querySelectorAll('code.rerun')].filter(c => c.offsetParent !== null).map(c => c.textContent)]; })()"
    )
    page.click("#cause-1 > summary")
    collapsed = page.evaluate("document.getElementById('cause-1').open")

    assert expanded == [True, [f"quickstart/{PY}/py02_run_echo"], [rerun, rerun]]
    assert collapsed is False


def test_clicking_a_cell_opens_its_case_in_place_with_transcript_and_wire_excerpt(page: Page) -> None:
    cell = 'td.cell[data-case="frameworks/fw01_proof_task"]'

    page.click(cell)
    shown = page.evaluate(
        "(() => { const d = document.querySelector('details.case[open]'); const row = d.closest('tr');"
        " const t = d.querySelector('pre.transcript');"
        " return [row.className, row.previousElementSibling.contains(document.querySelector('td.cell.selected')),"
        ' t.offsetParent !== null, t.textContent.includes(\'"command": "uname -a"\'),'
        " d.querySelector('pre.wire').textContent]; })()"
    )
    near = [box(page, cell), box(page, "details.case[open]")]
    sideways = page.evaluate(SIDEWAYS)
    page.click(cell)  # again: closed, and back among the cases
    closed = page.evaluate(
        "(() => [document.querySelectorAll('details.case[open]').length, document.querySelectorAll('tr.case-open')"
        ".length, document.querySelectorAll('#cases > details.case').length])()"
    )

    assert opened(page) == []
    assert shown == [
        "case-open",
        True,
        True,
        True,
        "02:01:00.000 POST http://127.0.0.1:9/process.Process/Start → 502 (1.0 ms) error: upstream unreachable",
    ]
    assert near[0] is not None and near[1] is not None and 0 <= near[1][0] - near[0][1] < 10  # right under it
    assert sideways == [WIDTH, WIDTH]
    assert closed == [0, 0, 6]


def test_clicking_a_case_of_a_cause_opens_it_under_the_cause(page: Page) -> None:
    page.click("#cause-3 > summary")
    page.click(f'#cause-3 li[data-case="probes/{PY}/pr10_metrics"] a')

    inside = page.evaluate("!!document.querySelector('#cause-3 li details.case[open]')")
    selected = page.evaluate("document.querySelector('td.cell.selected').dataset.case")

    assert (opened(page), inside, selected) == (["probes/pr10_metrics"], True, "probes/pr10_metrics")


def test_failures_only_filter_hides_conformant_rows_and_cases(page: Page) -> None:
    before = visible(page, "#matrix tr.case-row", "nc")

    page.click("#failures-only")
    rows = visible(page, "#matrix tr.case-row", "nc")
    suites = visible(page, "#matrix tbody.suite", "suite")
    cases = visible(page, "#cases details.case", "case")
    page.click("#failures-only")

    assert before == ["true", "false", "true", "false", "true", "false"]
    assert (rows, suites, cases) == (
        ["true", "true", "true"],
        ["frameworks", "probes", "quickstart"],
        ["quickstart/py02_run_echo", "probes/pr10_metrics", "frameworks/fw01_proof_task"],
    )
    assert visible(page, "#matrix tr.case-row", "nc") == before


def test_a_matrix_of_many_runners_and_long_names_fits_1400_px(browser: Browser, tmp_path: Path) -> None:
    url = "http://127.0.0.1:49999"
    endpoint = {"name": "local", "api_url": url, "sandbox_url": url, "kind": "embedded", "key_env": "E2B_API_KEY"}
    runners = [f"framework-with-a-long-name-{n}-1.2.{n}" for n in range(16)]
    header = make_header(endpoint, {runner: {"e2b": "2.63.0"} for runner in runners}, ["e2b-bench", "run"])
    run = RunDir.create(tmp_path / "results", "frameworks", "local", header, Redactor())
    for n, runner in enumerate(runners):
        for step in ("fw01_proof_task_" + "with_a_very_long_name_" * 6, "fw02_files"):
            run.record(
                CaseRecord(
                    id=f"frameworks/{runner}/{step}",
                    suite="frameworks",
                    runner=runner,
                    case=step,
                    outcome="pass" if n % 3 else "fail",
                    expected="pass",
                    conformant=bool(n % 3),
                    duration_ms=1.0,
                    error=None if n % 3 else "x" * 3000,  # one unbroken word
                )
            )
    run.finish("completed", 1)
    report = render([run.path], tmp_path / "out").html

    page = open_page(browser, report)
    before = page.evaluate(SIDEWAYS)
    page.click(f'td.cell[data-runner="{runners[0]}"]')
    after = page.evaluate(SIDEWAYS)
    page.close()
    shutil.rmtree(tmp_path / "results")

    assert (before, after) == ([WIDTH, WIDTH], [WIDTH, WIDTH])
