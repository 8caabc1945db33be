import json
import os
import re
import stat
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from bench.redaction import REDACTED, Redactor
from bench.results import (
    CaseRecord,
    InvalidRun,
    MissingFooter,
    NotARun,
    RunDir,
    RunError,
    make_header,
    read_run,
    schema_errors,
    validate,
)

KEY = "e2b_test_key_value_1234"
ENDPOINT = {
    "name": "local",
    "api_url": "http://127.0.0.1:49999",
    "sandbox_url": "http://127.0.0.1:49999",
    "kind": "embedded",
    "key_env": "E2B_API_KEY",
}
PINS = {"py-e2b-2.63.0": {"e2b": "2.63.0"}}


def header() -> dict[str, Any]:
    return make_header(ENDPOINT, PINS, ["e2b-bench", "run", "--endpoint", "local"])


def new_run(root: Path, redactor: Redactor | None = None) -> RunDir:
    return RunDir.create(root, "quickstart", "local", header(), redactor or Redactor([KEY]))


def case(step: str = "py01_create", **fields: Any) -> CaseRecord:
    values: dict[str, Any] = {
        "id": f"quickstart/py-e2b-2.63.0/{step}",
        "suite": "quickstart",
        "runner": "py-e2b-2.63.0",
        "case": step,
        "outcome": "pass",
        "expected": "pass",
        "conformant": True,
        "duration_ms": 12.5,
        "started_at": "2026-11-30T01:02:03.456Z",
    }
    return CaseRecord(**{**values, **fields})


def test_create_names_the_directory_after_stamp_suite_and_endpoint(tmp_path: Path) -> None:
    run = new_run(tmp_path)

    assert re.fullmatch(r"\d{8}T\d{6}Z-quickstart-local", run.path.name)


def test_create_in_the_same_second_adds_a_suffix(tmp_path: Path) -> None:
    now = datetime(2026, 11, 30, 1, 2, 3, tzinfo=UTC)
    names = [
        RunDir.create(tmp_path, "quickstart", "b3os beta", header(), Redactor(), now=now).path.name for _ in range(3)
    ]

    assert names == [
        "20261130T010203Z-quickstart-b3os-beta",
        "20261130T010203Z-quickstart-b3os-beta-2",
        "20261130T010203Z-quickstart-b3os-beta-3",
    ]


def test_header_is_valid_and_carries_run_id_and_start(tmp_path: Path) -> None:
    run = new_run(tmp_path)

    document = json.loads((run.path / "run.json").read_text())

    assert schema_errors("run", document) == []
    assert document["schema"] == "e2b-bench/run/1"
    assert document["header"]["run_id"] == run.path.name
    assert document["header"]["suite"] == "quickstart"
    assert document["header"]["pins"] == PINS
    assert "footer" not in document


def test_create_rejects_a_header_missing_fields_and_leaves_no_directory(tmp_path: Path) -> None:
    incomplete = {key: value for key, value in header().items() if key != "host"}

    with pytest.raises(InvalidRun, match="'host' is a required property"):
        RunDir.create(tmp_path, "quickstart", "local", incomplete, Redactor())

    assert list(tmp_path.iterdir()) == []


def test_header_never_holds_the_key(tmp_path: Path) -> None:
    leaky = {**header(), "argv": ["e2b-bench", "run", f"--api-key={KEY}"]}

    run = RunDir.create(tmp_path, "quickstart", "local", leaky, Redactor([KEY]))

    assert KEY not in (run.path / "run.json").read_text()


def test_record_appends_one_redacted_line_per_case(tmp_path: Path) -> None:
    run = new_run(tmp_path)

    run.record(case("py01_create", details={"envdAccessToken": "tok-abcdefgh"}))
    run.record(case("py02_run", outcome="fail", conformant=False, error=f"auth with {KEY} failed"))

    lines = [json.loads(line) for line in (run.path / "cases.jsonl").read_text().splitlines()]
    assert [line["case"] for line in lines] == ["py01_create", "py02_run"]
    assert lines[0]["details"] == {"envdAccessToken": REDACTED}
    assert lines[1]["error"] == f"auth with {REDACTED} failed"


def test_real_output_validates_against_the_schemas(tmp_path: Path) -> None:
    run = new_run(tmp_path)
    run.record(case())
    run.record(case("py02_run", outcome="skip", duration_ms=None, error="not in this SDK"))
    run.finish("completed", 0)

    document = json.loads((run.path / "run.json").read_text())
    lines = [json.loads(line) for line in (run.path / "cases.jsonl").read_text().splitlines()]

    assert [schema_errors("run", document), *(schema_errors("case", line) for line in lines)] == [[], [], []]


def test_finish_writes_counts_and_conformance(tmp_path: Path) -> None:
    run = new_run(tmp_path)
    run.record(case("a"))
    run.record(case("b", outcome="refused", expected="refused"))
    run.record(case("c", outcome="fail", conformant=False))

    footer = run.finish("completed", 1)

    assert {key: value for key, value in footer.items() if key != "finished_at"} == {
        "status": "completed",
        "exit_code": 1,
        "counts": {"pass": 1, "fail": 1, "refused": 1, "deviation": 0, "error": 0, "skip": 0},
        "conformant": 2,
        "nonconformant": 1,
    }


def test_finish_twice_keeps_the_first_footer(tmp_path: Path) -> None:
    run = new_run(tmp_path)
    first = run.finish("interrupted", 130)

    run.finish("completed", 0)

    assert read_run(run.path).footer == first


def test_read_run_round_trips_cases(tmp_path: Path) -> None:
    run = new_run(tmp_path)
    recorded = [case("a", details={"stdout": "hi"}), case("b", outcome="error", error="boom", note="n")]
    for record in recorded:
        run.record(record)
    run.finish("completed", 1)

    read = read_run(run.path)

    assert (read.cases, read.status, read.truncated) == (recorded, "completed", False)


def test_run_without_footer_raises_missing_footer(tmp_path: Path) -> None:
    run = new_run(tmp_path)
    run.record(case())

    with pytest.raises(MissingFooter, match="no footer"):
        read_run(run.path)


def test_allow_truncated_reads_a_run_cut_mid_line(tmp_path: Path) -> None:
    run = new_run(tmp_path)
    run.record(case("a"))
    with (run.path / "cases.jsonl").open("a") as cases:
        cases.write('{"id": "quickstart/py-e2b-2.63.0/b", "sui')  # killed during the append

    read = read_run(run.path, allow_truncated=True)

    assert ([c.case for c in read.cases], read.footer, read.status) == (["a"], None, "truncated")


def test_missing_footer_is_a_run_error() -> None:
    assert issubclass(MissingFooter, RunError)


def test_invalid_case_line_names_file_and_line(tmp_path: Path) -> None:
    run = new_run(tmp_path)
    run.record(case("a"))
    run.record(case("b"))
    run.finish("completed", 0)
    cases = run.path / "cases.jsonl"
    lines = cases.read_text().splitlines()
    lines[1] = lines[1].replace('"outcome":"pass"', '"outcome":"great"')
    cases.write_text("\n".join(lines) + "\n")

    with pytest.raises(InvalidRun, match=rf"{re.escape(str(cases))}:2: .*'great' is not one of"):
        read_run(run.path)


def test_invalid_run_json_names_the_file(tmp_path: Path) -> None:
    run = new_run(tmp_path)
    run_json = run.path / "run.json"
    document = json.loads(run_json.read_text())
    del document["header"]["git_sha"]
    run_json.write_text(json.dumps(document))

    with pytest.raises(InvalidRun, match=rf"{re.escape(str(run_json))}: .*'git_sha' is a required property"):
        read_run(run.path)


def test_directory_without_run_json_is_not_a_run(tmp_path: Path) -> None:
    with pytest.raises(NotARun):
        read_run(tmp_path)


def test_write_json_and_text_are_redacted(tmp_path: Path) -> None:
    run = new_run(tmp_path)

    run.write_json("transcripts/ag2.json", {"messages": [f"key is {KEY}"], "apiKey": "sk-abc"})
    run.write_text("notes.txt", f"E2B_API_KEY={KEY}\n")

    assert json.loads((run.path / "transcripts/ag2.json").read_text()) == {
        "messages": [f"key is {REDACTED}"],
        "apiKey": REDACTED,
    }
    assert (run.path / "notes.txt").read_text() == f"E2B_API_KEY={REDACTED}\n"


def test_write_outside_the_run_is_refused(tmp_path: Path) -> None:
    run = new_run(tmp_path)

    with pytest.raises(RunError, match="not a file inside"):
        run.write_text("../escape.txt", "x")


def test_atomic_write_leaves_no_temporary_files(tmp_path: Path) -> None:
    run = new_run(tmp_path)
    run.write_json("envd-probe.json", {"ok": True})
    run.finish("completed", 0)

    assert sorted(os.listdir(run.path)) == ["envd-probe.json", "run.json"]


def test_wire_path_and_append_wire(tmp_path: Path) -> None:
    run = new_run(tmp_path)
    entry = {
        "ts": "2026-11-30T01:02:03.456789Z",
        "runner": "py-e2b-2.63.0",
        "method": "GET",
        "url": "/files?path=/a&signature=v1_xyz&signature_expiration=9",
        "status": 200,
        "duration_ms": 1.5,
        "request_headers": {"x-api-key": KEY, "user-agent": "e2b-python-sdk/2.63.0"},
        "response_headers": {},
        "request_bytes": 0,
        "response_bytes": 3,
    }

    run.append_wire("py-e2b-2.63.0", entry)

    line = json.loads(run.wire_path("py-e2b-2.63.0").read_text())
    assert run.wire_path("py-e2b-2.63.0") == run.path / "wire" / "py-e2b-2.63.0.jsonl"
    assert (line["url"], line["request_headers"]["x-api-key"]) == (
        f"/files?path=/a&signature={REDACTED}&signature_expiration=9",
        REDACTED,
    )


def test_wire_schema_rejects_an_unredacted_signature() -> None:
    line: dict[str, Any] = {
        "ts": "2026-11-30T01:02:03Z",
        "runner": "r",
        "method": "GET",
        "url": "/files?signature=v1_xyz",
        "status": None,
        "duration_ms": 0,
        "request_headers": {},
        "response_headers": {},
        "request_bytes": 0,
        "response_bytes": 0,
        "error": "connection refused",
    }

    with pytest.raises(InvalidRun, match=r"\$\.url"):
        validate("wire", line)


def test_case_record_rejects_unknown_outcomes() -> None:
    with pytest.raises(ValueError, match="outcome must be one of"):
        case(outcome="passed")


def test_case_record_dict_round_trip() -> None:
    record = case(details={"status_code": 400}, error="refused", note="declared")

    assert CaseRecord.from_dict(record.to_dict()) == record


def test_every_file_of_a_run_directory_is_readable_by_all_whatever_the_umask(tmp_path: Path) -> None:
    previous = os.umask(0o077)
    try:
        run = new_run(tmp_path)
        run.record(case("a"))
        run.write_json("py-e2b-2.63.0.json", {"transcript": []})
        run.write_text("junit.xml", "<testsuites/>")
        run.finish("completed", 0)
    finally:
        os.umask(previous)

    modes = {path.name: stat.S_IMODE(path.stat().st_mode) for path in run.path.iterdir()}

    assert modes == {name: 0o644 for name in ("run.json", "cases.jsonl", "py-e2b-2.63.0.json", "junit.xml")}


@pytest.mark.parametrize("breaker", ["\x85", "\u2028", "\u2029"])
def test_a_record_holding_a_unicode_line_break_stays_one_line_for_every_reader(tmp_path: Path, breaker: str) -> None:
    """A property test's generated env value once held U+2028: written raw, `splitlines` readers (coverage)
    tore the line and the run's write-up ended in a traceback with no latest.json."""
    from bench.coverage import read_cases
    from bench.results import append_line

    path = tmp_path / "cases.jsonl"
    records = [{"id": "a", "details": {"value": f"x{breaker}y"}}, {"id": "b", "details": {}}]
    for record in records:
        append_line(path, record)

    assert path.read_text(encoding="utf-8").splitlines() == path.read_text(encoding="utf-8").split("\n")[:-1]
    assert read_cases(tmp_path) == records
