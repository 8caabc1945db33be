"""Run directories: run.json (header, then footer), cases.jsonl, wire logs and other redacted files."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from functools import cache
from importlib import resources
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, Literal, get_args

from jsonschema import Draft202012Validator
from referencing import Registry, Resource

from bench.redaction import Redactor

RUN_SCHEMA = "e2b-bench/run/1"

Outcome = Literal["pass", "fail", "refused", "deviation", "error", "skip"]
OUTCOMES: tuple[Outcome, ...] = get_args(Outcome)
Status = Literal["completed", "interrupted", "aborted"]
STATUSES: tuple[Status, ...] = get_args(Status)


class RunError(Exception):
    """A run directory cannot be written or read as asked."""


class NotARun(RunError):
    """The directory has no run.json."""


class InvalidRun(RunError):
    """A file of the run does not match its JSON Schema."""


class MissingFooter(RunError):
    """run.json has no footer: the run was cut short and its results are incomplete."""


NO_ROOM = frozenset({errno.ENOSPC, errno.EDQUOT})  # a full disk, or a full quota on it


def no_room(exc: BaseException, where: Path) -> str | None:
    """When `exc` is a write that found no room: the sentence saying so (the file, and what is free where the
    results go), else None."""
    if not isinstance(exc, OSError) or exc.errno not in NO_ROOM:
        return None
    try:
        free = f"{shutil.disk_usage(where).free / 2**20:.1f} MB free"
    except OSError:
        free = "free space unknown"
    return f"harness environment fault: {exc.filename or where}: no space left on device ({free})"


def utc_now(now: datetime | None = None) -> str:
    """`now` (default: the current time) as an RFC 3339 UTC timestamp with milliseconds."""
    return (now or datetime.now(UTC)).astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


@cache
def _schemas() -> Registry:
    """Every schema of bench/schemas, so one may refer to another (`run.schema.json#/$defs/header`)."""
    found = [
        json.loads(entry.read_text("utf-8"))
        for entry in resources.files("bench").joinpath("schemas").iterdir()
        if entry.name.endswith(".schema.json")
    ]
    return Registry().with_resources((schema["$id"], Resource.from_contents(schema)) for schema in found)


@cache
def _validator(name: str) -> Draft202012Validator:
    text = resources.files("bench").joinpath("schemas", f"{name}.schema.json").read_text("utf-8")
    return Draft202012Validator(json.loads(text), registry=_schemas())


def schema_errors(name: str, obj: Any) -> list[str]:
    """Every violation of schema `name` (run, case, wire) by `obj`, as `path: message`."""
    return [
        f"{error.json_path}: {error.message}"
        for error in sorted(_validator(name).iter_errors(obj), key=lambda e: list(map(str, e.path)))
    ]


def validate(name: str, obj: Any, where: str = "") -> None:
    """Raise `InvalidRun` naming `where` when `obj` violates schema `name`."""
    errors = schema_errors(name, obj)
    if errors:
        prefix = f"{where}: " if where else ""
        raise InvalidRun(f"{prefix}does not match {name}.schema.json: {'; '.join(errors)}")


def case_id(suite: str, runner: str, case: str) -> str:
    return f"{suite}/{runner}/{case}"


@dataclass(frozen=True)
class CaseRecord:
    """One case as it ended: what was observed, what was declared, and whether they agree."""

    id: str
    suite: str
    runner: str
    case: str
    outcome: Outcome
    expected: Outcome
    conformant: bool
    duration_ms: float | None = None
    error: str | None = None
    details: dict[str, Any] = field(default_factory=dict)
    started_at: str = field(default_factory=utc_now)
    note: str | None = None
    evidence: list[dict[str, Any]] | None = None  # a failing case's exchanges with the endpoint (bench/triage)

    def __post_init__(self) -> None:
        for name in ("outcome", "expected"):
            if getattr(self, name) not in OUTCOMES:
                raise ValueError(f"{name} must be one of {', '.join(OUTCOMES)}, not {getattr(self, name)!r}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CaseRecord:
        return cls(**data)


@dataclass(frozen=True)
class Run:
    """A run read back from disk."""

    path: Path
    header: dict[str, Any]
    footer: dict[str, Any] | None
    cases: list[CaseRecord]

    @property
    def run_id(self) -> str:
        return str(self.header["run_id"])

    @property
    def truncated(self) -> bool:
        return self.footer is None

    @property
    def status(self) -> str:
        """The footer's status, or `truncated` when there is no footer."""
        return "truncated" if self.footer is None else str(self.footer["status"])


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


ARTIFACT_MODE = 0o644  # every artifact: readable by all (redacted, so none holds a secret)


def atomic_write(path: Path, text: str) -> None:
    """Write `text` to `path` so that readers see the old content or the new, never a part."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fchmod(handle.fileno(), ARTIFACT_MODE)  # mkstemp makes 0600; artifacts hold no secret
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)


# Characters `str.splitlines` breaks at that JSON leaves as they are (a case's details may hold any text, e.g. a
# property test's generated values): escaped, so one record stays one line for every reader.
JSON_LINE_BREAKS = str.maketrans({"\x85": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"})


def json_line(obj: Any) -> str:
    """One JSON line (no newline): compact, and no character a reader splitting lines would tear it at."""
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).translate(JSON_LINE_BREAKS)


def append_line(path: Path, obj: Any) -> None:
    """Append one JSON line durably; safe across processes (pytest-xdist workers)."""
    data = (json_line(obj) + "\n").encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, ARTIFACT_MODE)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            os.fchmod(fd, ARTIFACT_MODE)  # whatever the umask
            end = os.lseek(fd, 0, os.SEEK_END)
            if os.write(fd, data) != len(data):  # a disk that filled mid-line: no torn line is left behind
                os.ftruncate(fd, end)
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        exc.filename = exc.filename or str(path)
        raise


def _stamp(now: datetime) -> str:
    return now.strftime("%Y%m%dT%H%M%SZ")


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-") or "run"


class RunDir:
    """A run directory being written. Every file goes through the run's `Redactor`."""

    RUN_JSON = "run.json"
    CASES = "cases.jsonl"

    def __init__(self, path: Path, redactor: Redactor) -> None:
        self._path = path
        self._redactor = redactor

    @property
    def path(self) -> Path:
        return self._path

    @classmethod
    def create(
        cls,
        root: Path,
        suite: str,
        endpoint: str,
        header: Mapping[str, Any],
        redactor: Redactor,
        now: datetime | None = None,
    ) -> RunDir:
        """Make `root/<stamp>-<suite>-<endpoint>[-N]/` and write its header (validated)."""
        now = now or datetime.now(UTC)
        base = f"{_stamp(now)}-{_slug(suite)}-{_slug(endpoint)}"
        root.mkdir(parents=True, exist_ok=True)
        for n in range(1, 10_000):
            path = root / (base if n == 1 else f"{base}-{n}")
            try:
                path.mkdir()
                break
            except FileExistsError:
                continue
        else:
            raise RunError(f"no free run directory name under {root} for {base}")
        full_header = {**header, "suite": suite, "run_id": path.name, "started_at": utc_now(now)}
        run = cls(path, redactor)
        try:
            run._store({"schema": RUN_SCHEMA, "header": full_header})
        except InvalidRun:
            shutil.rmtree(path)
            raise
        return run

    @classmethod
    def open(cls, path: Path, redactor: Redactor) -> RunDir:
        """Continue writing an existing run (e.g. from another process)."""
        if not (path / cls.RUN_JSON).is_file():
            raise NotARun(f"{path}: no {cls.RUN_JSON}")
        return cls(path, redactor)

    def _resolve(self, name: str) -> Path:
        target = (self._path / name).resolve()
        if not target.is_relative_to(self._path.resolve()) or target == self._path.resolve():
            raise RunError(f"{name!r} is not a file inside {self._path}")
        return target

    def record(self, case: CaseRecord) -> None:
        """Append one case, redacted, to cases.jsonl (flushed and fsynced)."""
        append_line(self._path / self.CASES, self._redactor.redact_obj(case.to_dict()))

    def amend(self, cases: Sequence[CaseRecord]) -> None:
        """Replace the recorded lines of these cases (by id) with them, in place, atomically."""
        path = self._path / self.CASES
        by_id = {case.id: self._redactor.redact_obj(case.to_dict()) for case in cases}
        lines = []
        for line in path.read_text("utf-8").splitlines():
            replaced = by_id.get(json.loads(line).get("id")) if line.strip() else None
            lines.append(line if replaced is None else json_line(replaced))
        atomic_write(path, "".join(f"{line}\n" for line in lines))

    def append_wire(self, runner: str, entry: Mapping[str, Any]) -> None:
        """Append one wire log line for `runner`, redacted, after checking it against wire.schema.json."""
        line = self._redactor.redact_obj(dict(entry))
        validate("wire", line, where=str(self.wire_path(runner)))
        append_line(self.wire_path(runner), line)

    def wire_path(self, runner: str) -> Path:
        return self._path / "wire" / f"{_slug(runner)}.jsonl"

    def write_json(self, name: str, obj: Any) -> Path:
        target = self._resolve(name)
        atomic_write(target, json.dumps(self._redactor.redact_obj(obj), indent=2, ensure_ascii=False) + "\n")
        return target

    def write_text(self, name: str, text: str) -> Path:
        target = self._resolve(name)
        atomic_write(target, self._redactor.redact_text(text))
        return target

    def _load(self) -> dict[str, Any]:
        return dict(json.loads((self._path / self.RUN_JSON).read_text("utf-8")))

    def _store(self, document: dict[str, Any]) -> None:
        document = self._redactor.redact_obj(document)
        validate("run", document, where=str(self._path / self.RUN_JSON))
        atomic_write(self._path / self.RUN_JSON, json.dumps(document, indent=2) + "\n")

    def finish(
        self, status: Status, exit_code: int, coverage: Mapping[str, Any] | None = None, **extra: Any
    ) -> dict[str, Any]:
        """Add the footer (counts from cases.jsonl; `coverage`: the percentages of coverage.json; `extra`: more
        footer members, e.g. `cost`). A second call keeps the first footer."""
        if status not in STATUSES:
            raise ValueError(f"status must be one of {', '.join(STATUSES)}, not {status!r}")
        document = self._load()
        if "footer" in document:
            return dict(document["footer"])
        cases = _read_cases(self._path / self.CASES, tolerate_torn_tail=True)
        counts = Counter(case.outcome for case in cases)
        conformant = sum(case.conformant for case in cases)
        document["footer"] = {
            "status": status,
            "exit_code": exit_code,
            "finished_at": utc_now(),
            "counts": {outcome: counts[outcome] for outcome in OUTCOMES},
            "conformant": conformant,
            "nonconformant": len(cases) - conformant,
        }
        if coverage is not None:
            document["footer"]["coverage"] = {
                "spec_percent": (coverage.get("spec") or {}).get("percent"),
                "sdk_percent": {runner: entry["percent"] for runner, entry in (coverage.get("sdk") or {}).items()},
            }
        document["footer"].update(extra)
        self._store(document)
        return dict(document["footer"])


def _read_cases(path: Path, tolerate_torn_tail: bool) -> list[CaseRecord]:
    if not path.exists():
        return []
    lines = path.read_text("utf-8").split("\n")
    # A run killed mid-append leaves at most one unterminated last line.
    torn = lines.pop()
    cases = []
    for number, line in enumerate(lines, start=1):
        where = f"{path}:{number}"
        try:
            data = json.loads(line)
        except json.JSONDecodeError as error:
            raise InvalidRun(f"{where}: not JSON ({error})") from None
        validate("case", data, where=where)
        cases.append(CaseRecord.from_dict(data))
    if torn and not tolerate_torn_tail:
        raise InvalidRun(f"{path}:{len(lines) + 1}: unterminated last line")
    return cases


def read_run(path: Path, allow_truncated: bool = False) -> Run:
    """Read and validate a run directory; a run without footer raises `MissingFooter` unless allowed."""
    run_json = path / RunDir.RUN_JSON
    try:
        document = json.loads(run_json.read_text("utf-8"))
    except FileNotFoundError:
        raise NotARun(f"{path}: no {RunDir.RUN_JSON}") from None
    except json.JSONDecodeError as error:
        raise InvalidRun(f"{run_json}: not JSON ({error})") from None
    validate("run", document, where=str(run_json))
    footer = document.get("footer")
    if footer is None and not allow_truncated:
        raise MissingFooter(f"{run_json}: no footer; the run was interrupted before it finished")
    cases = _read_cases(path / RunDir.CASES, tolerate_torn_tail=footer is None)
    return Run(path=path, header=document["header"], footer=footer, cases=cases)


def _command_output(argv: Sequence[str], cwd: Path | None = None) -> str | None:
    if shutil.which(argv[0]) is None:
        return None
    try:
        result = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    if result.returncode != 0:
        return None
    return result.stdout.strip() or None


def harness_version() -> str:
    try:
        return version("e2b-bench")
    except PackageNotFoundError:
        return "0+unknown"


def host_info() -> dict[str, str | None]:
    return {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "node": _command_output(["node", "--version"]),
    }


def make_header(
    endpoint: Mapping[str, Any], pins: Mapping[str, Mapping[str, str]], argv: Sequence[str]
) -> dict[str, Any]:
    """The header fields `RunDir.create` does not fill itself (it adds run_id, suite and started_at)."""
    return {
        "endpoint": dict(endpoint),
        "pins": {runner: dict(packages) for runner, packages in pins.items()},
        "harness_version": harness_version(),
        "git_sha": _command_output(["git", "rev-parse", "HEAD"], cwd=Path(__file__).resolve().parent),
        "host": host_info(),
        "argv": list(argv),
    }
