"""The differential judgement (bench/differential/): what a trace holds, and which differences from the reference
it names, field by field, and which legitimate variations it keeps quiet.

Pure judgement over traces made here from JSON answers and Connect streams as the wire proxy captures them (the
capture itself runs the real bytes through `Capture`); the end-to-end proofs against the embedded endpoint are in
tests/test_differential_endpoint.py.
"""

from __future__ import annotations

import json
import struct
from typing import Any

import pytest

from bench.differential.capture import Capture
from bench.differential.judge import Judge
from bench.differential.policy import load_rules
from bench.differential.trace import route
from bench.paths import FIELD_POLICY_PATH

ENVELOPE = struct.Struct(">BI")


class NoSecrets:
    def redact_obj(self, o: Any) -> Any:
        return o


def answer(document: Any) -> dict[str, Any]:
    capture = Capture()
    capture.response.feed(json.dumps(document).encode())
    return capture.summary({}, {"content-type": "application/json"}, NoSecrets())["answer"]


def stream(*messages: dict[str, Any]) -> dict[str, Any]:
    capture = Capture()
    for message in [*messages, {}]:
        payload = json.dumps(message).encode()
        flags = 2 if not message else 0
        capture.response.feed(ENVELOPE.pack(flags, len(payload)) + payload)
    return capture.summary({}, {"content-type": "application/connect+json"}, NoSecrets())["answer"]


def exchange(key: str, at: str, body: dict[str, Any], status: int = 200, **more: Any) -> dict[str, Any]:
    return {"key": key, "at": at, "status": status, "answer": body, **more}


def out(kind: str, text: str) -> dict[str, Any]:
    import base64

    return {"event": {"data": {kind: base64.b64encode(text.encode()).decode()}}}


def judge() -> Judge:
    return Judge(load_rules(FIELD_POLICY_PATH), 15.0)


INFO = "GET /sandboxes/{id}"


def info(at: str, sandbox: str, started: str, end: str, memory: int = 512, cpus: int = 2) -> dict[str, Any]:
    document = {"sandboxID": sandbox, "startedAt": started, "endAt": end, "memoryMB": memory, "cpuCount": cpus}
    return exchange(INFO, at, answer(document))


REFS = [
    [info("2026-01-01T10:00:05.000Z", "a1b2c3d4e5f6g7h8i9j0", "2026-01-01T10:00:00.120Z", "2026-01-01T10:05:00.120Z")],
    [info("2026-01-02T08:00:04.000Z", "zz99yy88xx77ww66vv55", "2026-01-02T08:00:00.331Z", "2026-01-02T08:05:00.331Z")],
]


def test_route_names_ids_and_keeps_rpc_paths() -> None:
    assert route("/sandboxes/yvy1a85x49ruxm4oirnw/timeout") == "/sandboxes/{id}/timeout"
    assert route("/v2/sandboxes") == "/v2/sandboxes"
    assert route("/process.Process/Start") == "/process.Process/Start"


def test_capture_joins_output_of_one_stream_and_keeps_the_order_across_streams() -> None:
    shown = stream({"event": {"start": {"pid": 7}}}, out("stdout", "a"), out("stdout", "b"), out("stderr", "e"),
                   out("stdout", "c"), {"event": {"end": {"exitCode": 1}}})  # fmt: skip
    assert shown["messages"] == [
        {"event.start.pid": 7},
        {"event.data.stdout": "ab"},
        {"event.data.stderr": "e"},
        {"event.data.stdout": "c"},
        {"event.end.exitCode": 1},
        {"end": True, "": {}},
    ]


def test_a_faithful_trace_with_other_ids_and_times_is_quiet() -> None:
    got = [
        info("2026-03-03T01:00:09.000Z", "k0k0k0k0k0k0k0k0k0k0", "2026-03-03T01:00:01.512Z", "2026-03-03T01:05:01.512Z")
    ]
    assert judge().differences(REFS, got) == []


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("startedAt", "2026-03-03T01:00:01Z", "precision of 0 fractional digit(s) where E2B gives 3"),
        ("startedAt", "2026-03-03T01:15:01.512Z", "s from its request where E2B's is"),
        ("memoryMB", 536870912, "a different value"),
        ("cpuCount", "2", "a string where E2B gives a integer"),
        ("sandboxID", "sbx-k0k0k0k0k0k0k0k0k0", "an id"),
    ],
)
def test_each_kind_of_difference_is_named_with_both_values(field: str, value: Any, words: str) -> None:
    document = {"sandboxID": "k0k0k0k0k0k0k0k0k0k0", "startedAt": "2026-03-03T01:00:01.512Z",
                "endAt": "2026-03-03T01:05:01.512Z", "memoryMB": 512, "cpuCount": 2, field: value}  # fmt: skip
    got = [exchange(INFO, "2026-03-03T01:00:09.000Z", answer(document))]
    found = judge().differences(REFS, got)
    assert [difference.field for difference in found] == [f"{INFO} {field}"]
    assert words in found[0].why
    assert found[0].got == value
    assert f"{INFO} {field} expected" in found[0].text()


def test_a_missing_and_an_extra_field_are_differences() -> None:
    document = {"sandboxID": "k0k0k0k0k0k0k0k0k0k0", "startedAt": "2026-03-03T01:00:01.512Z",
                "endAt": "2026-03-03T01:05:01.512Z", "cpuCount": 2, "memoryMiB": 512}  # fmt: skip
    found = judge().differences(REFS, [exchange(INFO, "2026-03-03T01:00:09.000Z", answer(document))])
    assert {(d.field, d.why) for d in found} == {
        (f"{INFO} memoryMB", "a field E2B gives is missing"),
        (f"{INFO} memoryMiB", "a field E2B never gives"),
    }


def test_units_of_a_varying_number_are_judged_by_magnitude() -> None:
    key = "GET /sandboxes/{id}/metrics"
    refs = [[exchange(key, "2026-01-01T10:00:00Z", answer([{"memUsed": used}]))] for used in (31_000_000, 45_500_000)]
    quiet = [exchange(key, "2026-01-01T10:00:00Z", answer([{"memUsed": 38_000_123}]))]
    mib = [exchange(key, "2026-01-01T10:00:00Z", answer([{"memUsed": 36}]))]
    assert judge().differences(refs, quiet) == []
    (found,) = judge().differences(refs, mib)
    assert found.field == f"{key} [].memUsed" and "other units" in found.why


def test_stream_order_is_judged_when_the_reference_runs_agree_on_it() -> None:
    key = "POST /process.Process/Start"
    start, end = {"event": {"start": {"pid": 9}}}, {"event": {"end": {"exitCode": 0}}}
    order = [out(kind, f"{n}\n") for n in range(3) for kind in ("stdout", "stderr")]
    refs = [[exchange(key, "2026-01-01T10:00:00Z", stream({"event": {"start": {"pid": pid}}}, *order, end))]
            for pid in (3, 4)]  # fmt: skip
    same = [exchange(key, "2026-01-01T10:00:00Z", stream(start, *order, end))]
    # a busy host may join two turns into one message each: not another order
    late = [out("stdout", "1\n2\n"), out("stderr", "1\n2\n")]
    joined = [exchange(key, "2026-01-01T10:00:00Z", stream(start, *order[:2], *late, end))]
    held = [exchange(key, "2026-01-01T10:00:00Z", stream(start, *order[0::2], *order[1::2], end))]
    assert judge().differences(refs, same) == []
    assert judge().differences(refs, joined) == []
    found = judge().differences(refs, held)
    assert [d.field for d in found] == [f"{key} messages"]
    assert (found[0].expected, found[0].got) == (
        "[pid, stdout, stderr, stdout, stderr, stdout, stderr, exitCode, end]",
        "[pid, stdout, stderr, exitCode, end]",
    )


def test_an_order_the_reference_runs_disagree_on_is_compared_as_a_multiset() -> None:
    key = "POST /process.Process/Start"
    a, b = out("stdout", "x\n"), out("stderr", "y\n")
    refs = [
        [exchange(key, "2026-01-01T10:00:00Z", stream(a, b))],
        [exchange(key, "2026-01-01T10:00:00Z", stream(b, a))],
    ]
    assert judge().differences(refs, [exchange(key, "2026-01-01T10:00:00Z", stream(b, a))]) == []
    found = judge().differences(refs, [exchange(key, "2026-01-01T10:00:00Z", stream(a, out("stderr", "z\n")))])
    assert [d.field for d in found] == [f"{key} event.data.stderr"]


def test_keepalives_and_an_exchange_the_reference_never_made_are_quiet() -> None:
    key = "POST /process.Process/Start"
    refs = [[exchange(key, "2026-01-01T10:00:00Z", stream(out("stdout", "x")))]]
    got = [
        exchange(key, "2026-01-01T10:00:00Z", stream({"event": {"keepalive": {}}}, out("stdout", "x"))),
        exchange("POST /process.Process/List", "2026-01-01T10:00:00Z", answer({"processes": []})),
    ]
    assert judge().differences(refs, got) == []


def test_a_probe_is_judged_like_an_answer() -> None:
    key = "POST /files"
    stat = {"stat.exists": True, "stat.mode": "755", "stat.links": 2, "stat.same_inode": True,
            "stat.mtime": "2026-01-01T10:00:00.123456789+0000"}  # fmt: skip
    ref = [[exchange(key, "2026-01-01T10:00:00Z", answer([{"name": "f"}]), probe={"leaves": stat})]]
    replaced = {**stat, "stat.mode": "644", "stat.links": 1, "stat.same_inode": False,
                "stat.mtime": "2026-01-02T10:00:00.123+0000"}  # fmt: skip
    got = [exchange(key, "2026-01-02T10:00:00Z", answer([{"name": "f"}]), probe={"leaves": replaced})]
    found = {d.field: d for d in judge().differences(ref, got)}
    assert set(found) == {f"{key} probe stat.{name}" for name in ("mode", "links", "same_inode", "mtime")}
    assert "precision" in found[f"{key} probe stat.mtime"].why
