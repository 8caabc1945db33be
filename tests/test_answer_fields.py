"""The answer fields of E2B's pinned definitions (sandboxes/e2b/answer-fields.toml) are the definitions' own.

Every field a client can be shown, read from the definitions themselves (`../shared/reference/spec`: the REST API's
OpenAPI files and envd.yaml for each response's JSON members, process.proto and filesystem.proto for each RPC's
response and stream event messages), for every operation of bench/spec_operations.toml that a sandbox endpoint
serves, named as the differential judgement names a field (`GET /sandboxes/{id} endAt`, `POST
/process.Process/Start event.end.exitCode`). The file is what `coverage.json`'s `fields.spec` lists with each one's
policy or gap (bench/differential/coverage.py); run this module (`python -m tests.test_answer_fields`) to write it
again after the definitions change.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

try:
    from test_field_table import SPEC, _deref, _spec
except ModuleNotFoundError:  # run as `python -m tests.test_answer_fields`
    from tests.test_field_table import SPEC, _deref, _spec

from bench.coverage import load_operations, write_coverage
from bench.differential.coverage import ANSWER_FIELDS_PATH, NEVER_SEEN, NO_POLICY, field_coverage, read_answer_fields
from bench.report import render as render_report

_PLACEHOLDER = re.compile(r"\{[^/}]+\}")


def _camel(name: str) -> str:
    """A proto field's JSON name (protobuf's canonical mapping: `exit_code` -> `exitCode`)."""
    head, *rest = name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def _messages(text: str) -> tuple[dict[str, list[tuple[str, str, bool]]], dict[str, str]]:
    """Every message of a proto file by its dotted name: its (type, JSON field name, repeated) members, a oneof's
    members among them; and each RPC's response message."""
    text = re.sub(r"//[^\n]*", "", text)
    messages: dict[str, list[tuple[str, str, bool]]] = {}
    stack: list[str] = []
    for token in re.finditer(r"(message|enum|oneof|service)\s+(\w+)\s*\{|\}|([\w.<>, ]+?)\s+(\w+)\s*=\s*\d+\s*;", text):
        kind, name, declared, field = token.groups()
        if kind:
            stack.append(f"{kind} {name}")
            if kind == "message":
                messages[".".join(s.split()[1] for s in stack if s.startswith("message "))] = []
        elif token.group(0) == "}":
            stack.pop()
        elif stack and stack[-1].split()[0] in ("message", "oneof"):
            owner = ".".join(s.split()[1] for s in stack if s.startswith("message "))
            words = declared.split()
            messages[owner].append((words[-1], _camel(field), words[0] == "repeated"))
    rpcs = dict(
        re.findall(r"rpc\s+(\w+)\s*\(\s*(?:stream\s+)?\w+\s*\)\s*returns\s*\(\s*(?:stream\s+)?(\w+)\s*\)", text)
    )
    return messages, rpcs


def _leaves(messages: dict[str, list[tuple[str, str, bool]]], name: str, prefix: str) -> Iterator[str]:
    scope = name.split(".")
    for declared, field, repeated in messages[name]:
        candidates = (".".join([*scope[:depth], declared]) for depth in range(len(scope), -1, -1))
        nested = next((candidate for candidate in candidates if candidate in messages), None)
        path = f"{prefix}{field}{'[]' if repeated else ''}"
        inner = list(_leaves(messages, nested, f"{path}.")) if nested else []
        yield from inner or [path]


def _route(route: str) -> str:
    return _PLACEHOLDER.sub("{id}", route)


def _members(document: dict[str, Any], schema: Any, prefix: str, refs: frozenset[str] = frozenset()) -> Iterator[str]:
    """The leaf members of a JSON schema as the judgement names a leaf: dotted, an array's items under `[]`
    (`volumeMounts[].path`, `names[]`)."""
    ref = schema.get("$ref") if isinstance(schema, dict) else None
    if ref in refs:
        return
    schema = _deref(document, schema)
    if not isinstance(schema, dict):
        return
    refs = refs | ({ref} if ref else set())
    for combined in ("allOf", "oneOf", "anyOf"):
        for part in schema.get(combined, ()):
            yield from _members(document, part, prefix, refs)
    if schema.get("type") == "array" and "items" in schema:
        inner = list(_members(document, schema["items"], prefix.removesuffix(".") + "[].", refs))
        yield from inner or [prefix.removesuffix(".") + "[]"]
        return
    for name, member in (schema.get("properties") or {}).items():
        inner = list(_members(document, member, f"{prefix}{name}.", refs))
        yield from inner or [f"{prefix}{name}"]


def _openapi(document: dict[str, Any], method: str, route: str) -> Iterator[str]:
    operation = document["paths"][route][method.lower()]
    for response in (operation.get("responses") or {}).values():
        response = _deref(document, response)
        for media, content in (response.get("content") or {}).items():
            if "json" in media:
                yield from _members(document, content.get("schema", {}), "")
            else:  # a file's bytes: judged by their size and digest
                yield from ("body.bytes", "body.sha256")


def spec_answer_fields() -> list[str]:
    """Each answer field of the definitions, as `METHOD ROUTE PATH`."""
    documents = {
        "api": [yaml.safe_load(path.read_text()) for path in sorted(SPEC.glob("openapi*.yml"))],
        "envd": [yaml.safe_load(_spec("envd.yaml").read_text())],
    }
    rpcs: dict[str, list[str]] = {}
    for proto, service in (("process.proto", "process.Process"), ("filesystem.proto", "filesystem.Filesystem")):
        messages, responses = _messages(_spec(proto).read_text())
        for rpc, response in responses.items():
            rpcs[f"/{service}/{rpc}"] = list(_leaves(messages, response, ""))
    found: set[str] = set()
    for operation in load_operations():
        if operation.get("scope"):
            continue
        key = f"{operation['method']} {_route(operation['route'])}"
        if operation["api"] == "rpc":
            members = rpcs[operation["route"]]
        else:
            members = [
                member
                for document in documents[operation["api"]]
                if operation["route"] in document["paths"]
                for member in _openapi(document, operation["method"], operation["route"])
            ]
        found |= {f"{key} {member.removeprefix('.')}" for member in members}
    return sorted(found)


def render() -> str:
    head = (
        "# The answer fields of E2B's pinned definitions: written by `python -m tests.test_answer_fields`\nfields = [\n"
    )
    return head + "".join(f'  "{field}",\n' for field in spec_answer_fields()) + "]\n"


def test_the_answer_fields_file_is_the_definitions_own() -> None:
    assert ANSWER_FIELDS_PATH.read_text("utf-8") == render(), "run `python -m tests.test_answer_fields` to write it"


def test_the_answer_fields_hold_each_kind_of_answer_the_sdks_read() -> None:
    fields = set(read_answer_fields())
    assert {
        "GET /sandboxes/{id} endAt",
        "GET /sandboxes/{id}/metrics [].memUsed",
        "GET /v2/sandboxes [].sandboxID",
        "POST /process.Process/Start event.end.exitCode",
        "POST /process.Process/List processes[].config.args[]",
        "POST /filesystem.Filesystem/ListDir entries[].modifiedTime",
        "POST /filesystem.Filesystem/Stat entry.owner",
    } <= fields


def _traces(path: Path, *exchanges: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    line = {"case": "py01_create", "outcome": "pass", "runs": [list(exchanges)], "trace": list(exchanges)}
    path.write_text(json.dumps(line) + "\n")


def test_each_spec_field_has_its_policy_or_is_a_gap(tmp_path: Path) -> None:
    answers = tmp_path / "answer-fields.toml"
    names = ["endAt", "cpuCount", "memoryMB", "alias", "metadata"]
    answers.write_text("fields = [" + ", ".join(f'"GET /sandboxes/{{id}} {name}"' for name in names) + "]")
    table = tmp_path / "differential.toml"
    table.write_text('[[policy]]\nfield = "* *endAt"\npolicy = "timeform"\n')
    info = {"key": "GET /sandboxes/{id}", "status": 200}
    run, root = tmp_path / "run", tmp_path / "reference"
    _traces(run / "traces" / "quickstart.py-e2b-2.63.0.jsonl",
            {**info, "answer": {"leaves": {"endAt": "x", "memoryMB": 512, "metadata.purpose": "a"}}})  # fmt: skip
    _traces(root / "quickstart" / "py-e2b-2.63.0.jsonl", {**info, "answer": {"leaves": {"cpuCount": 2}}})

    fields = field_coverage(run, root, table, answers)

    assert fields is not None
    assert fields["spec"] == {
        "GET /sandboxes/{id} endAt": "timeform",  # a rule names it
        "GET /sandboxes/{id} cpuCount": "reference",  # the references hold it: judged as they show it
        "GET /sandboxes/{id} memoryMB": NO_POLICY,  # seen, judged by nothing
        "GET /sandboxes/{id} alias": NEVER_SEEN,
        "GET /sandboxes/{id} metadata": NO_POLICY,  # an object of free keys, seen by a member
    }
    assert fields["spec_gaps"] == 3


def test_the_report_shows_the_answer_fields_gap_count(tmp_path: Path) -> None:
    from test_report import make_run

    run = make_run(tmp_path / "results", "local", [("py01_create", "pass", "pass", True)], finished=True)
    (run.path / "wire").mkdir(exist_ok=True)
    _traces(run.path / "traces" / "quickstart.py-e2b-2.63.0.jsonl",
            {"key": "GET /sandboxes/{id}", "status": 200, "answer": {"leaves": {"endAt": "x"}}})  # fmt: skip
    coverage = write_coverage(run.path)
    assert coverage is not None
    spec = coverage["fields"]["spec"]
    gaps = sum(policy in (NO_POLICY, NEVER_SEEN) for policy in spec.values())
    assert spec["GET /sandboxes/{id} endAt"] != NEVER_SEEN and gaps == coverage["fields"]["spec_gaps"] > 0

    paths = render_report([run.path], tmp_path / "out")

    summary = paths.markdown.read_text()
    assert f"answer fields of E2B's definitions: {gaps} gap(s) of {len(spec)}" in summary
    assert f"Answer fields of E2B's definitions: {len(spec)}, {gaps} gap(s)" in paths.html.read_text()


if __name__ == "__main__":
    ANSWER_FIELDS_PATH.write_text(render(), "utf-8")
    print(f"wrote {ANSWER_FIELDS_PATH}", file=sys.stderr)
