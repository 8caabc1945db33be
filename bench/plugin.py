"""The pytest plugin: one item per case and runner against the endpoint chosen for the session.

Suite modules under `sandboxes/` and `frameworks/` declare a test function with a `case` argument and
a `suite` marker; this plugin parametrizes it over the selected runners and their manifest steps and
drives a `BenchSession` (bench/conformance.py) from pytest's hooks: started after collection, each
item judged as it runs, ended (leak sweep, JUnit, footer, report) at session finish.
"""

from __future__ import annotations

import contextlib
import gc
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from .conformance import BenchSession, RunOptions
from .exits import ExitCode, defer_interrupts, interrupted_code
from .expectations import case_matches
from .lifecycle import Lifecycle
from .listing import LIST_HELP, listed
from .paths import RESULTS_DIR, SUITE_DIRS
from .redaction import Redactor
from .remote.budget import MAX_MINUTES_HELP, MAX_SANDBOXES_HELP
from .remote.slowness import STEP_TIMEOUT_HELP
from .results import case_id
from .runners.catalog import Runner, default_runners
from .runners.manifest import load_steps
from .selection import SelectionError, runners_named, select
from .shards import Shard, ShardError, deselect_items

__all__ = ["BenchSession", "check_case"]  # what suite modules import

STASH = pytest.StashKey[BenchSession]()
MARKERS = (
    "suite(name): a conformance suite parametrized over runners and steps",
    "slow: takes more than a few seconds of waiting (excluded by default in CI)",
    "bench: benchmarks (excluded by default)",
)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("e2b-bench", "e2b-bench conformance runs")
    group.addoption("--bench", action="store_true", help="record a run (implied when sandboxes/ suites are collected)")
    group.addoption(
        "--endpoint",
        default=os.environ.get("E2B_BENCH_ENDPOINT", "local"),
        help="local (embedded, default) | env (E2B_API_KEY + E2B_API_URL/E2B_SANDBOX_URL or E2B_DOMAIN) | a name "
        "from endpoints.toml",
    )
    group.addoption("--runner", action="append", default=[], help="runner name (repeatable); default: one per language")
    group.addoption("--matrix", action="store_true", help="every registered runner (all SDK pins)")
    group.addoption("--results-dir", default=str(RESULTS_DIR), help="where run directories go")
    group.addoption("--step-timeout", type=float, default=90.0, help=STEP_TIMEOUT_HELP)
    group.addoption("--max-sandboxes", type=int, default=None, help=MAX_SANDBOXES_HELP)
    group.addoption("--max-minutes", type=float, default=None, help=MAX_MINUTES_HELP)
    group.addoption("--quirk-profile", default="e2b", help="quirk profile of the embedded endpoint")
    group.addoption("--quirk", action="append", default=[], help="NAME[=VALUE] quirk of the embedded endpoint")
    group.addoption("--no-report", action="store_true", help="do not render the report at the end")
    group.addoption("--expectations", default=None, help="declarations file to judge against (default: the endpoint's)")
    group.addoption(
        "--model-base-url",
        default=None,
        help="OpenAI-compatible base URL of a real model for the framework suite (default: the scripted model)",
    )
    group.addoption("--model", default=None, help="model name to ask for (with --model-base-url)")
    group.addoption(
        "--model-key-env",
        default=None,
        help="NAME of the environment variable holding the model's API key (never the key itself)",
    )
    group.addoption("--attempts", type=int, default=2, help="tries of a framework's proof task before it fails")
    group.addoption("--list-cases", action="store_true", help=LIST_HELP)
    group.addoption("--shard", default=None, help="K/N: run only shard K of N (whole runners; see `e2b-bench merge`)")
    group.addoption(
        "--case",
        action="append",
        default=[],
        help="PATTERN: only the cases whose id (suite/runner/case) is PATTERN or matches it as fnmatch (repeatable)",
    )


def _suite_mode(config: pytest.Config) -> bool:
    if config.getoption("bench"):
        return True
    paths = [Path(arg.split("::")[0]).resolve() for arg in config.args]
    return any(path.is_relative_to(root) for path in paths for root in SUITE_DIRS)


def _bench(config: pytest.Config) -> BenchSession | None:
    return config.stash.get(STASH, None)


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    for marker in MARKERS:
        config.addinivalue_line("markers", marker)
    if not _suite_mode(config):
        return
    try:
        chosen = select(
            config.getoption("endpoint"),
            profile=config.getoption("quirk_profile"),
            quirks=config.getoption("quirk"),
            expectations=config.getoption("expectations"),
            runners=config.getoption("runner") or runners_named(config.getoption("case")),
            matrix=config.getoption("matrix"),
        )
        shard = Shard.parse(config.getoption("shard")) if config.getoption("shard") else None
    except (SelectionError, ShardError) as exc:
        raise pytest.UsageError(str(exc)) from exc
    lifecycle = Lifecycle(
        chosen.endpoint,
        results_dir=Path(config.getoption("results_dir")),
        redactor=Redactor(),
        quirks=chosen.quirks,
        report=not config.getoption("no_report"),
    )
    options = RunOptions(
        step_timeout_s=config.getoption("step_timeout"),
        max_sandboxes=config.getoption("max_sandboxes"),
        max_minutes=config.getoption("max_minutes"),
        model_base_url=config.getoption("model_base_url"),
        model=config.getoption("model"),
        model_key_env=config.getoption("model_key_env"),
        attempts=config.getoption("attempts"),
    )
    session = BenchSession(
        options=options, lifecycle=lifecycle, runners=chosen.runners, expectations=chosen.expectations, shard=shard
    )
    session.progress = _progress(config)
    config.stash[STASH] = session


def _progress(config: pytest.Config) -> Callable[[str], None]:
    """A line on the terminal while the run prepares (output capture suspended, so it shows at once)."""

    def say(line: str) -> None:
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        capture = config.pluginmanager.get_plugin("capturemanager")
        with capture.global_and_fixture_disabled() if capture is not None else contextlib.nullcontext():
            if reporter is not None:
                reporter.write_line(f"e2b-bench: {line}")
            else:
                print(f"e2b-bench: {line}", file=sys.stderr)

    return say


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    marker = metafunc.definition.get_closest_marker("suite")
    if marker is None or "case" not in metafunc.fixturenames:
        return
    session = _bench(metafunc.config)
    suite = marker.args[0]
    runners = session.runners if session else default_runners()
    cases = []
    for runner in runners:
        if not runner.has_suite(suite):
            continue
        for step in load_steps(suite, runner.table(suite)):  # type: ignore[arg-type]
            marks = [pytest.mark.slow] if step.slow else []
            cases.append(pytest.param((suite, runner, step.id), id=f"{runner.name}/{step.id}", marks=marks))
    metafunc.parametrize("case", cases)


def _case(item: pytest.Item) -> tuple[str, Runner, str] | None:
    """The (suite, runner, step) an item runs; None for anything else, e.g. pytest's placeholder for a suite
    that none of the selected runners has."""
    callspec = getattr(item, "callspec", None)
    case = callspec.params.get("case") if callspec else None
    return case if isinstance(case, tuple) else None


def _keep(config: pytest.Config, items: list[pytest.Item], wanted: Callable[[pytest.Item], bool]) -> None:
    """Keep the `wanted` items in place; the others are reported deselected."""
    dropped = [item for item in items if not wanted(item)]
    if dropped:
        items[:] = [item for item in items if wanted(item)]
        config.hook.pytest_deselected(items=dropped)


@pytest.hookimpl(tryfirst=True)  # before -k/-m: how many cases the suites and runners gave
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    session = _bench(config)
    if session is None:
        return
    _keep(config, items, lambda item: _case(item) is not None or item.get_closest_marker("suite") is None)
    session.narrowing.append(("suites and runners", len(items)))


@pytest.hookimpl(trylast=True, specname="pytest_collection_modifyitems")  # after -k/-m: record only what will run
def pytest_select_cases(config: pytest.Config, items: list[pytest.Item]) -> None:
    session = _bench(config)
    if session is None:
        return
    session.narrowing.append(("-k/-m", len(items)))
    patterns = config.getoption("case")
    if patterns:

        def named(item: pytest.Item) -> bool:
            case = _case(item)
            return case is not None and any(case_matches(case_id(case[0], case[1].name, case[2]), p) for p in patterns)

        _keep(config, items, named)
        session.narrowing.append(("--case", len(items)))
    if session.shard is not None:
        before_shard = {case[0] for item in items if (case := _case(item)) is not None}
        session.shard_header = deselect_items(config, items, session.shard)
        session.narrowing.append(("--shard", len(items)))
        if not items and before_shard:  # a shard dealt no group still records itself: an empty, valid shard
            session.empty_shard_suites = sorted(before_shard)
    for item in items:
        if (case := _case(item)) is not None:
            suite, runner, step = case
            session.suites.add(suite)
            session.selected.setdefault((suite, runner.name), []).append(step)


def pytest_collection_finish(session: pytest.Session) -> None:
    bench = _bench(session.config)
    if bench is None:
        return
    suites = sorted(bench.suites) or bench.empty_shard_suites
    if suites and session.config.getoption("list_cases"):  # `run --list`: what would run, nothing run
        code, message = listed(bench, session.items)
        pytest.exit(message, returncode=code)
    if suites and not bench.start(suites):
        pytest.exit(f"e2b-bench: {bench.preflight_error}", returncode=bench.exit_code or ExitCode.USAGE)
    # What the run has imported and booted lives to its end (the process ends with the run): kept out of every
    # later garbage collection (the endpoint's, and pytest's five at the end that look for unraisable exceptions)
    gc.freeze()


@pytest.fixture
def bench_session(request: pytest.FixtureRequest) -> BenchSession:
    session = _bench(request.config)
    if session is None or session.lifecycle.run_dir is None:
        pytest.skip("not a recorded e2b-bench run")
    return session


def check_case(session: BenchSession, case: tuple[str, Runner, str]) -> None:
    """Run (once per runner) and judge one case; the pytest outcome says whether it conformed."""
    suite, runner, step = case
    observed = session.step_result(suite, runner, step)
    record, note = session.record(suite, runner, step, observed)
    if not record.conformant:
        detail = f"{record.outcome} (declared {record.expected})"
        reason = f": {record.error}" if record.error else ""
        pytest.fail(f"{detail}{reason}{f' — {note}' if note else ''}", pytrace=False)
    if record.outcome == "skip":
        pytest.skip(record.error or "skipped")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    bench = _bench(session.config)
    if bench is None or bench.lifecycle.run_dir is None or bench.preflight_error:
        return
    defer_interrupts()  # a signal after the last case must not cut the leak sweep, footer or report short
    interrupted = exitstatus == pytest.ExitCode.INTERRUPTED
    code: int = (
        ExitCode.OK
        if exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED)
        else ExitCode.NONCONFORMANT
    )
    status = "completed"
    if interrupted:
        code, status = interrupted_code(), "interrupted"
        bench.stop_runners()
    elif bench.stop_reason is not None:  # a budget ended the run: what did not run is not conformant
        code, status = ExitCode.NONCONFORMANT, "interrupted"
        bench.stop_runners()
    elif exitstatus in (pytest.ExitCode.INTERNAL_ERROR, pytest.ExitCode.USAGE_ERROR):
        status = "aborted"
    code = bench.end(status, code)
    overriding = (ExitCode.INTERRUPTED, ExitCode.TERMINATED, ExitCode.HARNESS, ExitCode.USAGE)
    empty_shard = bench.empty_shard_suites and exitstatus == pytest.ExitCode.NO_TESTS_COLLECTED
    if code != exitstatus and (code in overriding or exitstatus == pytest.ExitCode.OK or empty_shard):
        session.exitstatus = code


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    bench = _bench(config)
    if bench is None or bench.lifecycle.run_dir is None:
        return
    terminalreporter.section("e2b-bench")
    if bench.preflight_error:
        terminalreporter.write_line(f"endpoint unusable: {bench.preflight_error}")
    terminalreporter.write_line(f"run directory: {bench.lifecycle.run_dir.path}")
    for line in bench.footer_lines():
        terminalreporter.write_line(line)
    report = bench.lifecycle.report_paths
    if report is not None:
        terminalreporter.write_line(f"report: {report.html}")
        terminalreporter.write_line(f"summary: {report.markdown}")


def pytest_unconfigure(config: pytest.Config) -> None:
    bench = _bench(config)
    if bench is not None:
        bench.close()
