"""The terminal of `e2b-bench run`: a header, progress while the cases run, and one closing verdict line.

A pytest plugin object the CLI registers for `run` only (`selftest` stays plain pytest). It stands in for
pytest's terminal reporter: it writes to a copy of the terminal's file descriptor taken before pytest
captures output, so progress shows while runner threads work, and it counts a case done when its runner
reports the step (judged against the declarations), not only when pytest reaches the item.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO
from urllib.parse import urlsplit

import pytest

from bench.conformance import BenchSession
from bench.expectations import judge
from bench.plugin import STASH
from bench.repro.commands import follow_up_lines
from bench.results import CaseRecord, Run, RunError, case_id, read_run
from bench.triage.causes import cause_document, find_causes
from bench.triage.hygiene import hygiene_lines
from bench.verdict import preflight_error, rerun_command, verdict

CAUSES_JSON = "causes.json"
CI_INTERVAL_S = 30.0  # a progress line this often when the terminal is not a TTY (CI logs)
INTERVAL_ENV = "E2B_BENCH_PROGRESS_S"  # overrides it
TTY_INTERVAL_S = 1.0  # the live bar's redraw
BAR_WIDTH = 24
LISTED_CAUSES = 10  # causes of the non-conformant cases shown before the verdict
LISTED_SUITE_RERUNS = 3  # re-run lines of one cause: its representative's, then one per other suite it shows in
NOT_RUN = "not run"  # the message of a case the run never got to
HARNESS_LOGGER = "e2b-bench"


@dataclass
class Pair:
    """Progress of one (suite, runner): its selected cases, those done, those not conformant."""

    total: int
    done: set[str] = field(default_factory=set)
    failing: set[str] = field(default_factory=set)
    started: float = field(default_factory=time.monotonic)
    ended: float | None = None


def _listed(value: object) -> str:
    return ",".join(sorted(map(str, value))) if isinstance(value, list | tuple | set | frozenset) else str(value)


def ci_interval() -> float:
    """Seconds between progress lines off a TTY: `E2B_BENCH_PROGRESS_S` when it is a positive number."""
    try:
        value = float(os.environ.get(INTERVAL_ENV, ""))
    except ValueError:
        return CI_INTERVAL_S
    return value if value > 0 else CI_INTERVAL_S


def origin(url: str) -> str:
    """`scheme://host[:port]` of an endpoint URL: no credentials, path or query reach the terminal."""
    parts = urlsplit(url)
    if not parts.scheme or not parts.hostname:
        return ""
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{parts.hostname}{port}"


def elapsed(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def causes_count(run_path: Path) -> int | None:
    """How many causes `causes.json` groups the failures into, when the run has one."""
    try:
        document = json.loads((run_path / CAUSES_JSON).read_text("utf-8"))
    except (OSError, ValueError):
        return None
    causes = document.get("causes") if isinstance(document, dict) else document
    return len(causes) if isinstance(causes, list) else None


def verdict_line(run_path: Path, report: Path | None) -> str:
    """The one closing line: what the gate says of the run in `run_path`, and where to read more."""
    where = f"report: {report}" if report is not None else f"run directory: {run_path}"
    problem = preflight_error(run_path)
    try:
        run = read_run(run_path, allow_truncated=True)
    except RunError as exc:
        if problem is not None:
            return f"ENDPOINT UNUSABLE: {problem}; nothing ran; gate FAILED; {where}"
        return f"NO RESULTS: {exc}; gate FAILED; {where}"
    if problem is not None:  # the footer's exit code says whose fault: the harness's environment (3) or not
        fault = "HARNESS ENVIRONMENT FAULT" if (run.footer or {}).get("exit_code") == 3 else "ENDPOINT UNUSABLE"
        return f"{fault}: {problem}; nothing ran; gate FAILED; {where}"
    records = list({case.id: case for case in run.cases}.values())
    failing = sum(not case.conformant for case in records)
    gate = verdict([run], records)
    if (run.footer or {}).get("exit_code") == 3:  # some cases could not run here at all: the harness's fault
        why = (run.footer or {}).get("harness_fault") or "a runner could not be built or started"
        return (
            f"HARNESS ENVIRONMENT FAULT: {why}; {len(records)} case(s) recorded, {failing} not conformant; "
            f"gate FAILED; {where}"
        )
    if run.status != "completed":
        skipped = sum(not case.conformant and not_run(case) for case in records)
        ran = f"{len(records) - skipped} of {len(records)} case(s) ran ({skipped} not run), " if skipped else ""
        return (
            f"{run.status.upper()}: {ran or f'{len(records)} case(s) recorded, '}{failing - skipped} not conformant; "
            f"gate FAILED; {where}"
        )
    if gate.passed and not records and isinstance(shard := run.header.get("shard"), dict):
        return (
            f"CONFORMANT: 0 cases: shard {shard.get('index')}/{shard.get('total')} was dealt none of the "
            f"{shard.get('selected')} selected (whole runners go to one shard); an empty shard, for merge; "
            f"gate passed; {where}"
        )
    if gate.passed:
        return f"CONFORMANT: {len(records)} cases; gate passed; {where}"
    causes = causes_count(run_path)
    grouped = f" in {causes} cause{'s' if causes != 1 else ''}" if causes is not None else ""
    return f"NOT CONFORMANT: {failing} of {len(records)} cases{grouped}; gate FAILED; {where}"


def not_run(case: CaseRecord) -> bool:
    """A case the run never got to (a budget, an interruption): no verdict on the endpoint."""
    return case.outcome == "error" and (case.error or "").startswith(NOT_RUN)


def cause_lines(run: Run, declarations: str | None = None, width: int = 160) -> list[str]:
    """What the terminal lists after the progress: the top causes, the cases not run, the next commands."""
    records = list({case.id: case for case in run.cases}.values())
    skipped = [case for case in records if not case.conformant and not_run(case)]
    causes = find_causes(case for case in records if not not_run(case))
    lines = []
    for number, cause in enumerate(causes[:LISTED_CAUSES], start=1):
        document = cause_document(run, cause)
        words = " ".join(str(document["message"]).split())
        words = words if len(words) <= width else words[: width - 1] + "…"
        runners = ", ".join(document["runners"])
        lines.append(f"✘ cause {number}: {len(cause.cases)} case(s), {cause.outcome}, in {runners} — {words}")
        by_suite: dict[str, CaseRecord] = {}
        for case in cause.cases:
            by_suite.setdefault(case.suite, case)
        first = cause.representative
        shown = [first, *(case for suite, case in by_suite.items() if suite != first.suite)]
        for case in shown[:LISTED_SUITE_RERUNS]:
            lines.append(f"    {case.id}  re-run: {rerun_command(run, case)}")
            lines.extend(f"      {line}" for line in follow_up_lines(run, case))  # repro and, with a reference, diff
        if len(shown) > LISTED_SUITE_RERUNS:
            lines.append(f"    … and cases of {len(shown) - LISTED_SUITE_RERUNS} more suite(s)")
    if len(causes) > LISTED_CAUSES:
        lines.append(f"… and {len(causes) - LISTED_CAUSES} more cause(s)")
    if skipped:
        reasons = sorted({(case.error or "")[len(NOT_RUN) :].strip(" :") for case in skipped})
        lines.append(f"{len(skipped)} case(s) not run ({'; '.join(reasons)[:width]}): no verdict on them")
    if causes:
        where = run.path
        lines.append("next:")
        lines.append(f"  e2b-bench report --causes {where}    every cause with its cases")
        target = declarations or "expectations/ENDPOINT.toml"
        lines.append(f"  e2b-bench expectations {where} --write {target}    declare them as known differences")
    return lines


class HarnessLog(logging.Handler):
    """The harness's own warnings (loop devices, template builds): on the terminal with -v, else counted."""

    def __init__(self, console: Console) -> None:
        super().__init__(logging.WARNING)
        self.console = console
        self.hidden = 0

    def emit(self, record: logging.LogRecord) -> None:
        if self.console.verbosity > 0:
            self.console.write(self.format(record))
        else:
            self.hidden += 1


class Console:
    """`run`'s terminal: `verbosity` -1 (`-q`: the verdict line only), 0 (default) or 1 (`-v`)."""

    def __init__(
        self,
        verbosity: int = 0,
        stream: TextIO | None = None,
        tty: bool | None = None,
        interval_s: float | None = None,
    ) -> None:
        self.verbosity = verbosity
        # A copy of the terminal taken now, before pytest captures fd 1 for each test.
        self.owned = stream is None
        self.out = stream or os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1, errors="replace")
        self.tty = self.out.isatty() if tty is None else tty
        self.interval_s = interval_s or (TTY_INTERVAL_S if self.tty else ci_interval())
        self.bench: BenchSession | None = None
        self.pairs: dict[tuple[str, str], Pair] = {}
        self.item_cases: dict[str, tuple[str, str, str]] = {}  # pytest node id -> (suite, runner, step)
        self.empty_selection: str | None = None
        self.lock = threading.RLock()
        self.drawn = 0  # lines of the live bar on screen
        self.started = time.monotonic()
        self.finished = threading.Event()
        self.ticker: threading.Thread | None = None
        self.log = HarnessLog(self)

    # --- writing ----------------------------------------------------------------------------------
    def write(self, text: str) -> None:
        """A line on the terminal, the live bar kept below it."""
        with self.lock:
            self._erase()
            self.out.write(text + "\n")
            self._draw()
            self.out.flush()

    def say(self, line: str) -> None:
        """A message while the run prepares or runs (not with -q)."""
        if self.verbosity >= 0:
            self.write(f"e2b-bench: {line}")

    def _erase(self) -> None:
        if self.drawn:
            self.out.write(f"\x1b[{self.drawn}F\x1b[J")
            self.drawn = 0

    def _draw(self) -> None:
        if not (self.tty and self.verbosity >= 0 and self.ticker is not None and not self.finished.is_set()):
            return
        lines = list(self._bars())
        self.out.write("".join(line + "\n" for line in lines))
        self.drawn = len(lines)

    def _bars(self) -> Iterator[str]:
        now = time.monotonic()
        width = max(len(f"{suite}/{runner}") for suite, runner in self.pairs)
        for (suite, runner), pair in sorted(self.pairs.items()):
            filled = BAR_WIDTH * len(pair.done) // max(pair.total, 1)
            bar = "#" * filled + "-" * (BAR_WIDTH - filled)
            failing = f"  {len(pair.failing)} failing" if pair.failing else ""
            took = elapsed((pair.ended or now) - pair.started)
            yield f"  {suite + '/' + runner:<{width}} [{bar}] {len(pair.done)}/{pair.total}  {took}{failing}"

    def progress_line(self) -> str:
        """The whole run in one line, for logs: totals, then each (suite, runner) not finished."""
        done = sum(len(pair.done) for pair in self.pairs.values())
        total = sum(pair.total for pair in self.pairs.values())
        failing = sum(len(pair.failing) for pair in self.pairs.values())
        going = [
            f"{suite}/{runner} {len(pair.done)}/{pair.total}" + (f" ({len(pair.failing)} failing)" * bool(pair.failing))
            for (suite, runner), pair in sorted(self.pairs.items())
            if len(pair.done) < pair.total
        ]
        rest = f": {', '.join(going)}" if going else ""
        return f"{done}/{total} cases done, {failing} failing, {elapsed(time.monotonic() - self.started)}{rest}"

    def _tick(self) -> None:
        while not self.finished.wait(self.interval_s):
            if self.tty:
                with self.lock:
                    self._erase()
                    self._draw()
                    self.out.flush()
            else:
                self.say(self.progress_line())

    # --- progress ---------------------------------------------------------------------------------
    def step_reported(self, suite: str, runner: str, event: dict[str, Any]) -> None:
        """A runner reported a step (from its thread): counted when selected, judged by the declarations."""
        for line in hygiene_lines(suite, runner, event):  # what the runner's kit did between cases, as it happens
            self.say(line)
        pair, step = self.pairs.get((suite, runner)), str(event.get("id"))
        if pair is None or self.bench is None or step not in self.bench.selected.get((suite, runner), ()):
            return
        declared = self.bench.expectations.for_case(case_id(suite, runner, step))
        details = dict(event.get("details") or {})
        if "skip" in event:
            details["skip_reason"] = (event.get("skip") or {}).get("reason")
        judged = judge(event.get("outcome", "error"), details, event.get("error"), declared)
        self._count(suite, runner, step, judged.conformant)

    def _count(self, suite: str, runner: str, step: str, conformant: bool) -> None:
        with self.lock:
            pair = self.pairs[(suite, runner)]
            pair.done.add(step)
            if not conformant:
                pair.failing.add(step)
            else:  # a step run again (bench/remote/rerun.py) that passed this time
                pair.failing.discard(step)
            if len(pair.done) >= pair.total and pair.ended is None:
                pair.ended = time.monotonic()
            if self.tty:
                self._erase()
                self._draw()
                self.out.flush()

    # --- pytest hooks -----------------------------------------------------------------------------
    @pytest.hookimpl(trylast=True)
    def pytest_configure(self, config: pytest.Config) -> None:
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:  # this console is the run's terminal
            config.pluginmanager.unregister(reporter)
        self.bench = config.stash.get(STASH, None)
        if self.bench is not None:
            self.bench.progress = self.say
            self.bench.on_step = self.step_reported
        harness = logging.getLogger(HARNESS_LOGGER)
        harness.addHandler(self.log)
        harness.propagate = False  # not through logging's last resort onto the terminal

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.failed:
            text = str(report.longrepr).strip()
            last = text.splitlines()[-1] if text else "collection failed"
            self.write(f"e2b-bench: cannot collect {report.nodeid or 'the suites'}: {last}")
            if self.verbosity > 0:
                self.write(text)

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_finish(self, session: pytest.Session) -> None:
        bench = self.bench
        if bench is None or not bench.selected:
            return
        self.started = time.monotonic()
        for (suite, runner), steps in bench.selected.items():
            self.pairs[(suite, runner)] = Pair(total=len(steps))
        for item in session.items:
            callspec = getattr(item, "callspec", None)
            case = callspec.params.get("case") if callspec else None
            if isinstance(case, tuple):
                self.item_cases[item.nodeid] = (case[0], case[1].name, case[2])
        if self.verbosity >= 0:
            for line in self.header(bench):
                self.write(line)

    def header(self, bench: BenchSession) -> list[str]:
        endpoint = bench.endpoint
        where = "embedded" if endpoint.provider.embedded else origin(endpoint.api_url) or endpoint.kind
        quirks = bench.lifecycle.quirks
        active = quirks.active() if quirks is not None else {}
        shown = [name if value is True else f"{name}={_listed(value)}" for name, value in active.items()]
        shaped = f", quirks {' '.join(shown)}" if shown else ""
        runners = sorted({runner for _, runner in bench.selected})
        cases = sum(pair.total for pair in self.pairs.values())
        return [
            f"e2b-bench run: endpoint {endpoint.name} ({bench.redactor.redact_text(where)}{shaped})",
            f"  suites: {', '.join(sorted(bench.suites))}",
            f"  runners: {', '.join(runners)}",
            f"  cases: {cases}",
        ]

    @pytest.hookimpl(trylast=True, specname="pytest_collection_finish")
    def pytest_started_run(self, session: pytest.Session) -> None:
        """After the bench plugin opened the run directory: say where it is and start the progress."""
        bench = self.bench
        if bench is None or bench.lifecycle.run_dir is None or bench.preflight_error:
            return
        if self.verbosity >= 0:
            self.write(f"  run directory: {bench.lifecycle.run_dir.path}")
        self.ticker = threading.Thread(target=self._tick, name="console", daemon=True)
        self.ticker.start()

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        case = self.item_cases.get(report.nodeid)
        if case is None or (report.when != "call" and not report.skipped and not report.failed):
            return
        suite, runner, step = case
        self._count(suite, runner, step, not report.failed)
        if self.verbosity > 0 and (report.when == "call" or report.skipped):
            word = "ok" if report.passed else "skip" if report.skipped else "NOT CONFORMANT"
            self.write(f"  {word}: {case_id(suite, runner, step)}")

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        """Before the bench plugin writes the results: the progress ends here."""
        self.finished.set()
        with self.lock:
            self._erase()
            self.out.flush()
        if self.ticker is not None and self.verbosity >= 0 and not self.tty:
            self.say(self.progress_line())
        bench = self.bench
        if bench is not None and bench.narrowing and not session.items and not bench.empty_shard_suites:
            self.empty_selection = empty_selection(bench.narrowing, session.config)

    @pytest.hookimpl(trylast=True, specname="pytest_sessionfinish")
    def pytest_closing(self, session: pytest.Session, exitstatus: int) -> None:
        """After the bench plugin wrote the results and the report: the failures and one verdict line."""
        bench = self.bench
        if bench is None or bench.lifecycle.run_dir is None:
            return
        run_path = bench.lifecycle.run_dir.path
        if self.verbosity >= 0:
            for line in self.failures(run_path):
                self.write(line)
            for line in bench.footer_lines():  # the run's cost, why it stopped, the sandboxes it left
                self.write(line)
            if self.log.hidden:
                self.write(f"e2b-bench: {self.log.hidden} harness warning(s) not shown (-v shows them)")
        report = bench.lifecycle.report_paths
        self.write(verdict_line(run_path, report.html if report is not None else None))

    def failures(self, run_path: Path) -> list[str]:
        """The causes of the non-conformant cases, largest first, each with its count, where it shows, the
        endpoint's words and a re-run per suite; the cases not run apart; then the commands to type next."""
        try:
            run = read_run(run_path, allow_truncated=True)
        except RunError:
            return []
        return cause_lines(run, declarations=self.declarations())

    def declarations(self) -> str | None:
        """Where this endpoint's declarations go: the file it is judged by, else the one it would be by default."""
        if self.bench is None:
            return None
        endpoint = self.bench.endpoint
        path = endpoint.expectations or Path("expectations") / f"{endpoint.name}.toml"
        try:
            return str(path.relative_to(Path.cwd()))
        except ValueError:
            return str(path)

    @pytest.hookimpl(trylast=True)  # after the bench plugin stopped the embedded endpoint (its disks log here)
    def pytest_unconfigure(self, config: pytest.Config) -> None:
        logging.getLogger(HARNESS_LOGGER).removeHandler(self.log)
        logging.getLogger(HARNESS_LOGGER).propagate = True
        if self.owned:
            self.out.close()


def empty_selection(narrowing: Sequence[tuple[str, int]], config: pytest.Config) -> str:
    """One sentence naming what left no case: the suites, paths and runners, -k/-m, --case or --shard."""
    emptied = next((index for index, (_, left) in enumerate(narrowing) if left == 0), None)
    lead = "no case matched the selection"
    if emptied is None:
        return lead
    stage, before = narrowing[emptied][0], narrowing[emptied - 1][1] if emptied else 0
    if stage == "suites and runners":
        runners = ", ".join(config.getoption("runner")) or "the default runners"
        return (
            f"{lead}: the suites or paths given have no case for {runners} "
            "(`e2b-bench runners` lists the runners, `e2b-bench run --help` the suites)"
        )
    if stage == "-k/-m":
        given = [f"{flag} {value!r}" for flag, value in (("-k", config.option.keyword), ("-m", config.option.markexpr))
                 if value]  # fmt: skip
        return f"{lead}: {' and '.join(given) or '-k/-m'} left none of the {before} case(s) of the suites given"
    if stage == "--case":
        patterns = " ".join(f"--case {p!r}" for p in config.getoption("case"))
        return (
            f"{lead}: {patterns} matched none of the {before} case(s) selected (a case id is suite/runner/case, "
            "e.g. quickstart/py-e2b-2.63.0/py01_create; fnmatch patterns like 'behaviours/*/sync_files_*' work too)"
        )
    return f"{lead}: shard {config.getoption('shard')} got none of the {before} case(s) selected: use fewer shards"
