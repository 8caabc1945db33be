"""The code-interpreter suite end to end: the Python and npm code-interpreter runners against the embedded
endpoint's `code-interpreter-v1` template, once faithful and once as `b3os-beta`.

Each profile is one `e2b-bench run code-interpreter`; the tests read what it recorded (cases and their
details, the run header's pins, the wire logs, the report) and check it against facts of their own
(the manifest's step list, the PNG format, the code-interpreter protocol's port).
"""

from __future__ import annotations

import base64
import json
import struct
import subprocess
from dataclasses import dataclass
from itertools import groupby
from operator import itemgetter
from pathlib import Path
from typing import Any

import pytest
from run_cli import e2b_bench, only_run_dir, served_with

from bench.conformance import BenchSession, ModelChoice, RunOptions
from bench.expectations import Expectations
from bench.localbox.api import TEMPLATES
from bench.localbox.template import RECIPES
from bench.report import render
from bench.results import Run, read_run
from bench.runners.catalog import available_runners
from bench.runners.manifest import load_manifest, load_steps

SUITE = "code-interpreter"
RUNNERS = {r.spec.family: name for name, r in available_runners().items() if r.has_suite(SUITE)}
PY, JS = RUNNERS["py-code-interpreter"], RUNNERS["js-code-interpreter"]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@dataclass(frozen=True)
class SuiteRun:
    done: subprocess.CompletedProcess[str]
    run: Run

    def case(self, runner: str, step: str) -> Any:
        (found,) = [c for c in self.run.cases if c.runner == runner and c.case == step]
        return found

    def wire(self, runner: str) -> list[dict[str, Any]]:
        lines = (self.run.path / "wire" / f"{runner}.jsonl").read_text().splitlines()
        return [json.loads(line) for line in lines]


def suite_run(results: Path, *args: str, env: dict[str, str] | None = None) -> SuiteRun:
    runners = ("--runner", PY, "--runner", JS)  # the report test renders it itself, from the run's records
    args = ("--results-dir", str(results), *runners, "--no-report", *args)
    done = e2b_bench("run", SUITE, *args, env=env, timeout=900)
    return SuiteRun(done, read_run(only_run_dir(results)))


@pytest.fixture(scope="module")
def faithful(tmp_path_factory: pytest.TempPathFactory, served: dict[str, str]) -> SuiteRun:
    return suite_run(tmp_path_factory.mktemp("faithful"), env=served_with(served, "code-interpreter-v1"))


@pytest.fixture(scope="module")
def b3os(tmp_path_factory: pytest.TempPathFactory) -> SuiteRun:
    return suite_run(tmp_path_factory.mktemp("b3os"), "--profile", "b3os-beta")


def test_only_framework_runners_are_told_about_the_model() -> None:
    model = ModelChoice("http://127.0.0.1:9/v1", "some-model", "MY_MODEL_KEY", "secret", scripted=None)
    session = BenchSession(RunOptions(), None, [], Expectations(), model=model)  # type: ignore[arg-type]
    runners = available_runners()
    framework = next(r for r in runners.values() if r.has_suite("frameworks"))

    assert session._options(runners[PY]) == {} and session._options(runners[JS]) == {}
    assert session._options(framework)["model"] == {
        "base_url": "http://127.0.0.1:9/v1",
        "name": "some-model",
        "key_env": "MY_MODEL_KEY",
        "scripted": False,
    }


def test_both_runners_have_the_embedded_endpoint_build_their_template_before_they_start() -> None:
    tables = load_manifest()[SUITE]

    assert {name: table["templates"] for name, table in tables.items()} == {
        "py-code-interpreter": ["code-interpreter-v1"],
        "js-code-interpreter": ["code-interpreter-v1"],
    }
    assert "code-interpreter-v1" in TEMPLATES and "code-interpreter-v1" in RECIPES


def test_each_language_runs_the_manifest_s_steps_with_the_same_ids() -> None:
    python = [s.id for s in load_steps(SUITE, "py-code-interpreter")]
    assert python == [s.id for s in load_steps(SUITE, "js-code-interpreter")]
    assert python[0] == "ci01_create" and python[-1] == "ci16_kill" and len(python) == 16


# --- the faithful endpoint ----------------------------------------------------------------------------


def test_every_case_passes_in_both_languages_in_manifest_order(faithful: SuiteRun) -> None:
    cases = [c for c in faithful.run.cases if c.suite == SUITE]

    assert faithful.done.returncode == 0, faithful.done.stdout[-3000:] + faithful.done.stderr[-3000:]
    for family, runner in RUNNERS.items():
        assert [c.case for c in cases if c.runner == runner] == [s.id for s in load_steps(SUITE, family)]
    assert {(c.outcome, c.conformant) for c in cases} == {("pass", True)}
    assert [c.outcome for c in faithful.run.cases if c.case == "leak_check"] == ["pass"]


def test_the_header_pins_the_code_interpreter_sdks_and_the_e2b_they_run_on(faithful: SuiteRun) -> None:
    pins = faithful.run.header["pins"]

    assert (pins[PY]["e2b-code-interpreter"], pins[PY]["e2b"]) == ("2.11.5", "2.63.0")
    assert (pins[JS]["@e2b/code-interpreter"], pins[JS]["e2b"]) == ("2.8.0", "2.51.0")


@pytest.mark.parametrize("runner", [PY, JS])
def test_the_sandbox_is_made_on_code_interpreter_v1_and_cells_go_to_port_49999(faithful: SuiteRun, runner: str) -> None:
    created = faithful.case(runner, "ci01_create").details
    wire = faithful.wire(runner)
    cells = [e for e in wire if e["method"] == "POST" and e["url"].endswith("/execute")]
    contexts = [(e["method"], e["url"].split("/contexts")[1][:1], e["status"]) for e in wire if "/contexts" in e["url"]]

    assert "code-interpreter-v1" in set(created["info"].values())
    assert any(e["method"] == "POST" and e["url"].endswith("sandboxes") and e["status"] == 201 for e in wire)
    # Every cell (22 run_code calls: the interrupted one and the one in a removed context included) and
    # context call carries the sandbox id and port 49999 (the code interpreter's server).
    assert len(cells) == 22 and [e["status"] for e in cells].count(404) == 1
    for exchange in cells:
        headers = {k.lower(): v for k, v in exchange["request_headers"].items()}
        assert (headers["e2b-sandbox-id"], headers["e2b-sandbox-port"]) == (created["sandbox_id"], "49999")
    # create, list, restart, list again after the remove, remove: in the order the steps make them
    assert contexts == [("POST", "", 200), ("GET", "", 200), ("POST", "/", 200), ("DELETE", "/", 200), ("GET", "", 200)]


@pytest.mark.parametrize("runner", [PY, JS])
def test_the_recorded_figure_is_a_png_of_the_size_its_header_says(faithful: SuiteRun, runner: str) -> None:
    png = faithful.case(runner, "ci04_display_png").details["png"]

    head = base64.b64decode(png["head"])
    assert head[:8] == PNG_SIGNATURE and head[12:16] == b"IHDR"
    assert list(struct.unpack(">II", head[16:24])) == list(png["size"])
    assert png["bytes"] > 1000


@pytest.mark.parametrize("runner", [PY, JS])
def test_streamed_output_error_and_interrupt_are_recorded_as_seen(faithful: SuiteRun, runner: str) -> None:
    stream = faithful.case(runner, "ci03_stream_callbacks").details
    error = faithful.case(runner, "ci07_error").details
    interrupt = faithful.case(runner, "ci13_timeout_interrupts").details

    # in order, each stream's text whole (the kernel may flush a line in two messages on a busy host)
    runs = [(name, "".join(text for _, text in run)) for name, run in groupby(stream["callbacks"], key=itemgetter(0))]
    assert runs == [("stdout", "out-1\n"), ("stderr", "err-1\n"), ("stdout", "out-2\n")]
    assert error["cell"]["error"] == {"name": "ZeroDivisionError", "value": "division by zero"}
    assert "ZeroDivisionError" in error["traceback"]
    assert interrupt["timeout"]["exception"] == ("TimeoutException" if runner == PY else "TimeoutError")
    assert interrupt["timeout"]["message"].startswith("Execution timed out")
    assert interrupt["next"]["text"] == "True"


def test_coverage_lists_the_code_interpreter_s_routes_outside_the_spec_with_placeholders(faithful: SuiteRun) -> None:
    coverage = json.loads((faithful.run.path / "coverage.json").read_text())
    unspecified = {(u["method"], u["route"]): u["seen"] for u in coverage["spec"]["unspecified"]}

    assert {key: seen for key, seen in unspecified.items() if "/contexts" in key[1] or key[1] == "/execute"} == {
        ("POST", "/execute"): [200, 404],
        ("POST", "/contexts"): [200],
        ("GET", "/contexts"): [200],
        ("POST", "/contexts/{contextID}/restart"): [200],
        ("DELETE", "/contexts/{contextID}"): [200],
    }


# --- the b3os-beta profile ----------------------------------------------------------------------------


def test_b3os_beta_is_judged_by_its_declarations_and_every_case_conforms(b3os: SuiteRun) -> None:
    cases = [c for c in b3os.run.cases if c.suite == SUITE]

    assert b3os.run.header["endpoint"]["name"] == "local-b3os-beta"
    assert str(b3os.run.header["expectations"]).endswith("expectations/b3os-beta.toml")
    assert b3os.done.returncode == 0, b3os.done.stdout[-3000:] + b3os.done.stderr[-3000:]
    assert len(cases) == 32 and all(c.conformant for c in cases)


def test_b3os_beta_serves_the_code_interpreter_and_every_case_passes_there(b3os: SuiteRun) -> None:
    # What expectations/b3os-beta.toml says of the suite: no documented deviation touches it.
    cases = [c for c in b3os.run.cases if c.suite == SUITE]

    assert {(c.expected, c.outcome) for c in cases} == {("pass", "pass")}
    assert b3os.case(PY, "ci01_create").details["sandbox_id"].startswith("sbx-")  # the profile's own ids
    assert b3os.case(JS, "ci13_timeout_interrupts").details["next"]["text"] == "True"


# --- both ---------------------------------------------------------------------------------------------


def test_the_report_has_a_code_interpreter_table_with_both_profiles_side_by_side(
    faithful: SuiteRun, b3os: SuiteRun, tmp_path: Path
) -> None:
    summary = render([faithful.run.path, b3os.run.path], tmp_path).markdown.read_text()
    rows = {
        line.split("|")[1].strip(" `"): [cell.strip() for cell in line.split("|")[2:-1]]
        for line in summary.split("### code-interpreter (16 case(s))")[1].splitlines()
        if line.startswith("| `ci")
    }
    header = next(line for line in summary.splitlines() if line.startswith("| case | env · py-code"))

    assert list(rows) == [s.id for s in load_steps(SUITE, "py-code-interpreter")]
    for profile in ("env", "local-b3os-beta"):
        assert f"{profile} · {PY}" in header and f"{profile} · {JS}" in header
    assert {tuple(cells[:2]) for cells in rows.values()} == {("✔", "✔")}  # the faithful run's two columns
