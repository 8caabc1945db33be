"""Case ids are selectors: `run --case PATTERN` picks cases of every suite, and the re-run line printed for a
failing case runs exactly that case again, against the same endpoint with the same flags.

Each suite gets one failing case, from a quirk of the embedded endpoint or from a declaration that does
not hold (a case declared `fail` that passes is not conformant), in a first run of a few of its cases.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest

from bench.results import CaseRecord, read_run
from bench.runners.catalog import default_runners
from bench.selection import runners_named
from tests.run_cli import e2b_bench

PY = "py-e2b-2.63.0"
HOUSEKEEPING = "housekeeping/harness/leak_check"


@dataclass(frozen=True)
class Failing:
    selection: str  # the first run's --case: a few cases of the suite, one of them failing
    case: str  # the one that fails
    quirk: str | None = None  # makes it fail; None: a declaration that it fails (it passes)


SUITES = {
    "quickstart": Failing(f"quickstart/{PY}/py0[12]_*", f"quickstart/{PY}/py02_run_echo"),  # py02 needs py01
    "probes": Failing(f"probes/{PY}/pr0[13]_*", f"probes/{PY}/pr03_setsid", "session_leader"),
    "refusals": Failing(f"refusals/{PY}/rf0[19]_*", f"refusals/{PY}/rf01_create_mcp", "refuse_create_options=mcp"),
    "tokens": Failing(f"tokens/{PY}/tk0[12]_*", f"tokens/{PY}/tk01_list_and_get_hide_the_token"),
    "isolation": Failing(f"isolation/{PY}/is0[34]_*", f"isolation/{PY}/is03_proc_sys_read_only"),
    "behaviours": Failing(
        f"behaviours/{PY}/sync_run_[es]*", f"behaviours/{PY}/sync_run_streams", "mutations=stderr_dropped"
    ),
    "properties": Failing(f"properties/{PY}/pp0[34]_*", f"properties/{PY}/pp03_env_values"),
    "code-interpreter": Failing(
        "code-interpreter/py-code-interpreter-2.11.5/ci0[12]_*",
        "code-interpreter/py-code-interpreter-2.11.5/ci02_state_across_cells",  # needs ci01_create
    ),
    "frameworks": Failing("frameworks/ag2-1.2.1/fw0[23]_*", "frameworks/ag2-1.2.1/fw02_exit_code"),
    "computer": Failing(  # co02 needs co01; without useradd the agent user cannot be made
        "computer/js-e2b-2.51.0/co0[12]_*", "computer/js-e2b-2.51.0/co02_template_agent_user", "no_useradd"
    ),
}


def suite_cases(run_dir: Path) -> list[CaseRecord]:
    return [case for case in read_run(run_dir).cases if case.id != HOUSEKEEPING]


def latest_run(results: Path) -> Path:
    return Path(json.loads((results / "latest.json").read_text())["run_dir"])


@pytest.mark.parametrize("suite", SUITES)
def test_the_printed_rerun_of_a_failing_case_runs_exactly_that_case(suite: str, tmp_path: Path) -> None:
    failing = SUITES[suite]
    results = tmp_path / "results"
    flags = ["--results-dir", str(results)]
    if failing.quirk:
        flags += ["--quirk", failing.quirk]
    else:
        declared = tmp_path / "declared.toml"
        declared.write_text(
            f'[endpoint]\nname = "local"\n\n[cases."{failing.case}"]\noutcome = "fail"\nreason = "declared wrongly"\n'
        )
        flags += ["--expectations", str(declared)]
    first = e2b_bench("run", "--case", failing.selection, *flags, timeout=900)
    assert first.returncode == 1, first.stdout[-3000:] + first.stderr[-3000:]
    first_run = latest_run(results)
    reruns = [line.split("re-run: ", 1)[1] for line in first.stdout.splitlines() if "re-run: " in line]

    again = e2b_bench(*shlex.split(reruns[0])[1:], timeout=900) if reruns else None

    assert len(suite_cases(first_run)) > 1
    assert reruns == [f"./e2b-bench run --endpoint local {shlex.join(flags)} --case {failing.case}"]
    assert f"  `{reruns[0]}`" in (first_run / "summary.md").read_text().splitlines()
    assert again is not None and again.returncode == 1, again and again.stdout[-3000:] + again.stderr[-3000:]
    rerun = suite_cases(latest_run(results))
    before = next(case for case in suite_cases(first_run) if case.id == failing.case)
    assert latest_run(results) != first_run
    # Exactly that case, judged as before: same endpoint flags, and its prerequisites ran (unrecorded).
    assert [(c.id, c.outcome, c.conformant) for c in rerun] == [(failing.case, before.outcome, False)]


def test_a_pattern_naming_a_pin_brings_that_runner_and_a_wildcard_keeps_the_defaults() -> None:
    defaults = [runner.name for runner in default_runners()]

    named = runners_named(["quickstart/py-e2b-2.45.1/py02_run_echo", "behaviours/js-e2b-2.50.0/*"])

    assert "py-e2b-2.45.1" not in defaults and "js-e2b-2.50.0" not in defaults
    assert named == [*defaults, "py-e2b-2.45.1", "js-e2b-2.50.0"]
    assert runners_named(["quickstart/*/py02_run_echo"]) == []  # [] = the defaults, as without --case
