"""One run's lifecycle, shared by `run`, `bench` and `detect`.

endpoint -> (embedded server) -> preflight -> header (pins resolved up front) -> run directory ->
the command's work -> leak sweep -> JUnit -> footer -> report. The command only does the work in the
middle: it records cases in `lifecycle.run_dir` and says how the run ended; exit codes are `ExitCode`.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import platform
import shutil
import sys
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from .coverage import write_coverage
from .endpoints import Endpoint, PreflightError, preflight
from .exits import ExitCode
from .housekeeping import Sweep, leak_record, sweep
from .junit import write_junit
from .redaction import Redactor
from .results import CaseRecord, RunDir, Status, atomic_write, make_header, no_room
from .triage.causes import write_causes

if TYPE_CHECKING:
    from .localbox.quirks import Quirks
    from .localbox.server import LocalServer
    from .report import ReportPaths

PREFLIGHT_JSON = "preflight.json"
LATEST_JSON = "latest.json"  # in the results directory: the run that finished last
MIN_FREE_MB = 64  # what a run's wire logs, cases and report need at least: less is a full disk to come
HARNESS_PACKAGES = ("e2b", "connectrpc", "protobuf-py", "uvicorn", "starlette", "httptools", "uvloop", "httpx")


def harness_pins() -> dict[str, str]:
    """Versions of what the harness itself runs on (the embedded endpoint speaks through these)."""
    found = {}
    for package in HARNESS_PACKAGES:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            found[package] = importlib.metadata.version(package)
    found["python"] = platform.python_version()
    return found


class Lifecycle:
    """One recorded run against one endpoint; a context manager that stops what it started."""

    def __init__(
        self,
        endpoint: Endpoint,
        *,
        results_dir: Path,
        redactor: Redactor | None = None,
        quirks: Quirks | None = None,
        server: LocalServer | None = None,
        report: bool = True,
        argv: Sequence[str] | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.key: str | None = None
        self.results_dir = results_dir
        self.redactor = redactor or Redactor()
        self.quirks = quirks
        self.server = server  # the embedded server: given already listening (`serve --bench`), or started by serve()
        self.report = report
        self.argv = list(argv) if argv is not None else list(sys.argv)
        self.run_dir: RunDir | None = None
        self.report_paths: ReportPaths | None = None
        self.preflight_error: str | None = None
        self.fault: str | None = None  # the first write that found no room (a full disk), in one sentence
        self.stack = contextlib.ExitStack()

    def __enter__(self) -> Lifecycle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.stack.close()

    @property
    def run_id(self) -> str:
        return self.run_dir.path.name if self.run_dir else "unstarted"

    # --- before the work ---------------------------------------------------------------------------
    def serve(self, sandboxes: int | None = None) -> None:
        """Make the endpoint reachable: the embedded one is started (or the given server used). `sandboxes`: how
        many the work is expected to create, when it knows; the embedded one prepares no more than that ahead."""
        if not self.endpoint.provider.embedded:
            self.key = self.endpoint.api_key()
        else:
            from .localbox.server import LocalServer, in_thread

            if self.server is None:
                self.server = LocalServer(quirks=self.quirks, pool_total=sandboxes)
            local = self.stack.enter_context(in_thread(self.server))
            self.key = local.api_key
            self.endpoint = self.endpoint.bound(local.api_url)
        self.redactor.add(self.key)

    def preflight(self, python_sdks: Mapping[str, str] | None = None) -> bool:
        """Is the endpoint usable with the key (and by the Python SDKs `python_sdks` pins: runner -> e2b
        version)? On failure `preflight_error` says why, in one sentence."""
        try:
            preflight(self.endpoint, self.key, python_sdks=python_sdks)
        except PreflightError as exc:
            self.preflight_error = str(exc)
        return self.preflight_error is None

    def open(self, suite: str, pins: Mapping[str, Mapping[str, str]], **header: Any) -> RunDir:
        """Create the run directory; its header holds every pin, resolved before the work starts."""
        info = {k: getattr(self.endpoint, k) for k in ("name", "kind", "api_url", "sandbox_url", "key_env")}
        info["sandbox_url"] = info["sandbox_url"] or ""  # none given: the SDK derives it from the domain
        full = make_header(info, {**pins, "harness": harness_pins()}, self.argv)
        full.update(header)
        self.run_dir = RunDir.create(self.results_dir, suite, self.endpoint.name, full, self.redactor)
        return self.run_dir

    # --- after the work ----------------------------------------------------------------------------
    def sweep(self, own: Collection[str] = ()) -> CaseRecord:
        """Record the `housekeeping/harness/leak_check` case: any sandbox of this run still alive is deleted
        (`own`: ids the run knows it created; others must show the run's tag to be deleted)."""
        assert self.run_dir is not None
        started = time.monotonic()
        found, error = Sweep(), None
        try:
            found = sweep(self.endpoint.api_url, self.key, self.run_id, own)
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
            error = f"leak check could not list sandboxes: {exc}"
        record = leak_record(found, error, round((time.monotonic() - started) * 1000, 1))
        run_dir = self.run_dir
        self.guarded(lambda: run_dir.record(record))
        return record

    def abort(
        self,
        reason: str,
        suite: str,
        pins: Mapping[str, Mapping[str, str]] | None = None,
        code: ExitCode = ExitCode.USAGE,
    ) -> ExitCode:
        """End a run that could not start (the preflight failed: exit 2; the harness's environment: exit 3):
        a run directory that says why."""
        if self.run_dir is None:
            self.open(suite, pins or {})
        assert self.run_dir is not None
        self.run_dir.write_json(PREFLIGHT_JSON, {"error": reason})
        return self.finish("aborted", code)

    def no_room(self, exc: BaseException) -> bool:
        """Is `exc` a write that found no room? The first one is kept as the run's harness fault (exit 3)."""
        sentence = no_room(exc, self.results_dir)
        if sentence is not None and self.fault is None:
            self.fault = sentence
        return sentence is not None

    def guarded(self, what: Callable[[], Any]) -> Any:
        """`what()`, or None when it found no room: a full disk loses what is left to write, never the rest."""
        try:
            return what()
        except OSError as exc:
            if not self.no_room(exc):
                raise
            return None

    def disk_fault(self) -> str | None:
        """Why the results directory cannot hold a run (too little free space), in one sentence, or None."""
        self.results_dir.mkdir(parents=True, exist_ok=True)
        free_mb = shutil.disk_usage(self.results_dir).free / 2**20
        if free_mb >= MIN_FREE_MB:
            return None
        return (
            f"the results directory {self.results_dir} has {free_mb:.1f} MB free, less than the {MIN_FREE_MB} MB "
            "a run needs: free some space or choose another --results-dir"
        )

    def finish(self, status: Status, exit_code: int, **footer: Any) -> ExitCode:
        """JUnit, footer (with `footer`'s members, e.g. the cost) and report; returns the exit code. A write that
        finds no room (a full disk) ends the run `aborted`, exit 3, with the footer naming it if it fits: each
        file is written as far as it can be, and none of the others is lost to it."""
        run_dir = self.run_dir
        assert run_dir is not None
        if self.fault is not None:
            status, exit_code = "aborted", ExitCode.HARNESS
        self.guarded(lambda: run_dir.write_text("junit.xml", write_junit(run_dir.path, status)))
        coverage = None
        try:  # from the wire logs and the runners' reports, if any; a log it cannot read must not lose the run
            coverage = write_coverage(run_dir.path)
        except (OSError, ValueError) as exc:
            if not self.no_room(exc):
                print(f"e2b-bench: coverage.json not written: {exc}", file=sys.stderr)
        if self.fault is not None:  # found now, or before
            status, exit_code = "aborted", ExitCode.HARNESS
            footer["harness_fault"] = self.fault
        self.guarded(lambda: run_dir.finish(status, int(exit_code), coverage, **footer))
        with contextlib.suppress(Exception):  # like the report: grouping the failures must not lose the run
            write_causes(run_dir.path, self.redactor)
        if self.report:
            from .report import render

            with contextlib.suppress(Exception):  # a report that fails to render must not lose the run
                self.report_paths = render([run_dir.path], run_dir.path, self.redactor)
        self._point_latest(status, int(exit_code))
        if self.fault is not None:
            print(f"e2b-bench: {self.fault}", file=sys.stderr)
            return ExitCode.HARNESS
        return ExitCode(exit_code)

    def _point_latest(self, status: Status, exit_code: int) -> None:
        """`<results>/latest.json` names the run that finished last, so a script finds it without scraping."""
        assert self.run_dir is not None
        path = self.run_dir.path.resolve()
        report = self.report_paths
        pointer = {
            "run_dir": str(path),
            "status": status,
            "exit_code": exit_code,
            "junit": str(path / "junit.xml"),
            "report": str(report.html.resolve()) if report else None,
            "summary": str(report.markdown.resolve()) if report else None,
        }
        latest = self.results_dir / LATEST_JSON
        try:
            atomic_write(latest, json.dumps(pointer, indent=2) + "\n")
        except OSError as exc:
            if not self.no_room(exc):
                raise
            # A pointer left naming the previous run would pass it off as the latest: none is better.
            with contextlib.suppress(OSError):
                latest.unlink(missing_ok=True)
