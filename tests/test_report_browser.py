"""The rendered report in a real headless Chromium: inline scripts run and the matrix is drawn."""

import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

from bench.redaction import Redactor
from bench.report import ReportPaths, render
from bench.results import CaseRecord, RunDir, make_header

CHROMIUM = Path("/usr/bin/chromium")
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

pytestmark = [
    pytest.mark.chromium,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium at /usr/bin/chromium"),
]


def chromium(profile: Path, *arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            str(CHROMIUM),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            f"--user-data-dir={profile}",
            *arguments,
        ],
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
