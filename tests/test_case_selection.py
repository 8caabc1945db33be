"""Case ids are selectors: `run --case PATTERN` picks cases of every suite, and the re-run line printed for a
failing case runs exactly that case again, against the same endpoint with the same flags.

Each suite gets one failing case, from a quirk of the embedded endpoint or from a declaration that does
not hold (a case declared `fail` that passes is not conformant), in a first run of a few of its cases (and of
two other suites', for the suites failed by a declaration: tests/shared_runs.py).
"""

from __future__ import annotations

import json
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
from shared_runs import Shared, shares

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


# The suites failed by a declaration share first runs, three suites a run (one declarations file, no quirk
# to interfere): each prints one re-run line per suite. A quirk's suite has a first run of its own.
DECLARED_GROUPS = [[suite for suite, failing in SUITES.items() if failing.quirk is None][start::2] for start in (0, 1)]


@dataclass(frozen=True)
class FirstRun:
    done: subprocess.CompletedProcess[str]
    run_dir: Path
    flags: list[str]  # the endpoint flags its re-run lines repeat

    def reruns(self) -> list[str]:
        return [line.split("re-run: ", 1)[1] for line in self.done.stdout.splitlines() if "re-run: " in line]


def first_run(directory: Path, suites: list[str]) -> FirstRun:
    """A run of a few cases of each of these suites, one of each failing (by its quirk or a wrong declaration)."""
    results = directory / "results"
    flags = ["--results-dir", str(results)]
    quirks = [SUITES[suite].quirk for suite in suites if SUITES[suite].quirk]
    flags += [arg for quirk in quirks for arg in ("--quirk", str(quirk))]
    declared = [SUITES[suite].case for suite in suites if SUITES[suite].quirk is None]
    if declared:
        declarations = directory / "declared.toml"
        declarations.write_text(
            '[endpoint]\nname = "local"\n'
            + "".join(f'\n[cases."{case}"]\noutcome = "fail"\nreason = "declared wrongly"\n' for case in declared)
        )
        flags += ["--expectations", str(declarations)]
    selection = [arg for suite in suites for arg in ("--case", SUITES[suite].selection)]
    done = e2b_bench("run", *selection, *flags, timeout=900)
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    return FirstRun(done, latest_run(results), flags)


def suites_run_with(suite: str) -> list[str]:
    return next((group for group in DECLARED_GROUPS if suite in group), [suite])


@pytest.mark.parametrize(
    "suite", [pytest.param(suite, marks=shares(f"case-selection {suites_run_with(suite)}")) for suite in SUITES]
)
def test_the_printed_rerun_of_a_failing_case_runs_exactly_that_case(suite: str, shared: Shared) -> None:
    failing = SUITES[suite]
    suites = suites_run_with(suite)
    first = shared.once(f"case-selection {suites}", lambda directory: first_run(directory, suites))
    rerun = f"./e2b-bench run --endpoint local {shlex.join(first.flags)} --case {failing.case}"
    results = first.run_dir.parent

    again = e2b_bench(*shlex.split(rerun)[1:], timeout=900) if rerun in first.reruns() else None

    assert len([case for case in suite_cases(first.run_dir) if case.suite == suite]) > 1
    # one line per failing case: this suite's, and the others' run with it
    expected = {f"./e2b-bench run --endpoint local {shlex.join(first.flags)} --case {SUITES[s].case}" for s in suites}
    assert sorted(first.reruns()) == sorted(expected)
    assert f"  `{rerun}`" in (first.run_dir / "summary.md").read_text().splitlines()
    assert again is not None and again.returncode == 1, again and again.stdout[-3000:] + again.stderr[-3000:]
    rerun_cases = suite_cases(latest_run(results))
    before = next(case for case in suite_cases(first.run_dir) if case.id == failing.case)
    assert latest_run(results) != first.run_dir
    # Exactly that case, judged as before: same endpoint flags, and its prerequisites ran (unrecorded).
    assert [(c.id, c.outcome, c.conformant) for c in rerun_cases] == [(failing.case, before.outcome, False)]


def test_a_pattern_naming_a_pin_brings_that_runner_and_a_wildcard_keeps_the_defaults() -> None:
    defaults = [runner.name for runner in default_runners()]

    named = runners_named(["quickstart/py-e2b-2.45.1/py02_run_echo", "behaviours/js-e2b-2.50.0/*"])

    assert "py-e2b-2.45.1" not in defaults and "js-e2b-2.50.0" not in defaults
    assert named == [*defaults, "py-e2b-2.45.1", "js-e2b-2.50.0"]
    assert runners_named(["quickstart/*/py02_run_echo"]) == []  # [] = the defaults, as without --case
