"""coverage.json: which specified operations and statuses a run's traffic reached, and which public SDK
methods its cases called, computed from a run directory's wire logs and cases."""

from __future__ import annotations

import json
from pathlib import Path

from bench.coverage import (
    _surface_file,
    load_operations,
    sdk_coverage,
    sdk_surface,
    spec_coverage,
    write_coverage,
)
from bench.results import schema_errors

API = "http://127.0.0.1:9"


def request(method: str, path: str, status: int, envd: bool = False) -> dict:
    headers = {"e2b-sandbox-id": "sbx1"} if envd else {"x-api-key": "[REDACTED]"}
    return {"method": method, "url": f"{API}{path}?x=1", "status": status, "request_headers": headers}


OPERATIONS = [
    {"api": "api", "method": "GET", "route": "/sandboxes/{sandboxID}", "documented": [200, 401, 404, 500]},
    {"api": "api", "method": "GET", "route": "/health", "documented": [204, 401], "scope": "no SDK calls it"},
    {"api": "envd", "method": "GET", "route": "/health", "documented": [204]},
    {"api": "envd", "method": "POST", "route": "/files", "documented": [200, 400, 507], "unreachable": {"507": "disk"}},
    {"api": "rpc", "method": "POST", "route": "/process.Process/Start", "documented": [200]},
]


def test_statuses_are_matched_to_their_operation_and_the_percentage_counts_reachable_pairs() -> None:
    seen = [
        request("GET", "/sandboxes/abc", 200),
        request("GET", "/sandboxes/def", 404),
        request("GET", "/sandboxes/def", 409),  # undocumented: shown, never counted
        request("GET", "/health", 204, envd=True),
        request("POST", "/files", 200, envd=True),
        request("POST", "/process.Process/Start", 200, envd=True),
        request("POST", "/v2/sandboxes", 201),
        request("POST", "/v2/sandboxes/abc/connect", 201),
    ]

    coverage = spec_coverage(seen, OPERATIONS)

    rows = {(row["api"], row["method"], row["route"]): row for row in coverage["operations"]}
    assert rows[("api", "GET", "/sandboxes/{sandboxID}")]["seen"] == [200, 404, 409]
    assert rows[("api", "GET", "/health")]["seen"] == []
    assert rows[("envd", "GET", "/health")]["seen"] == [204]
    # Reachable pairs: GET detail 200/401/404, envd health 204, files 200/400, Start 200 = 7; seen 5.
    assert (coverage["counted"], coverage["reached"], coverage["percent"]) == (7, 5, 71.4)
    assert rows[("api", "GET", "/sandboxes/{sandboxID}")]["why_missing"].startswith("no case provoked 401; 500: ")
    assert rows[("api", "GET", "/health")]["why_missing"] == "not counted: no SDK calls it"
    assert rows[("envd", "POST", "/files")]["why_missing"] == "no case provoked 400; 507: disk"
    assert rows[("rpc", "POST", "/process.Process/Start")]["why_missing"] is None
    assert coverage["unspecified"] == [
        {"method": "POST", "route": "/v2/sandboxes", "seen": [201]},
        {"method": "POST", "route": "/v2/sandboxes/{sandboxID}/connect", "seen": [201]},
    ]


def test_sdk_methods_list_the_cases_that_called_them_and_the_gaps() -> None:
    cases = [
        {"id": "behaviours/py/sync_a", "runner": "py", "details": {"sdk_calls": ["Sandbox.create", "Sandbox.kill"]}},
        {"id": "behaviours/py/sync_b", "runner": "py", "details": {"sdk_calls": ["Sandbox.create", "Other.x"]}},
        {"id": "probes/py/pr01", "runner": "py", "details": {}},
    ]
    surfaces = {"py": ["Sandbox.create", "Sandbox.files.read", "Sandbox.kill", "Sandbox.list"]}

    coverage = sdk_coverage(cases, surface=surfaces.__getitem__)

    assert coverage == {
        "py": {
            "percent": 50.0,
            "methods": [
                {"name": "Sandbox.create", "cases": ["behaviours/py/sync_a", "behaviours/py/sync_b"]},
                {"name": "Sandbox.files.read", "cases": []},
                {"name": "Sandbox.kill", "cases": ["behaviours/py/sync_a"]},
                {"name": "Sandbox.list", "cases": []},
            ],
        }
    }


def test_a_runner_whose_surface_cannot_be_listed_says_why() -> None:
    cases = [{"id": "behaviours/gone/x", "runner": "gone", "details": {"sdk_calls": ["Sandbox.create"]}}]

    coverage = sdk_coverage(cases, surface=lambda name: {}[name])

    assert coverage == {"gone": {"percent": 0.0, "methods": [], "error": "KeyError: 'gone'"}}


def test_the_python_runner_reports_its_sdk_surface_from_its_own_environment() -> None:
    names = sdk_surface("py-e2b-2.63.0")

    for name in ("Sandbox.create", "AsyncSandbox.commands.run", "Sandbox.files.write_files", "AsyncSandbox.pty.resize"):
        assert name in names
    assert "Sandbox.sandbox_id" not in names  # a property, not a method
    assert not [name for name in names if name.rsplit(".", 1)[1].startswith("_")]


def test_a_runners_surface_is_listed_once_per_state_and_read_back_after(tmp_path: Path) -> None:
    listed = sdk_surface("py-e2b-2.63.0", cache_dir=tmp_path)
    (kept,) = (tmp_path / "surfaces").iterdir()
    assert json.loads(kept.read_text()) == listed

    kept.write_text('["Sandbox.kept_only"]\n')  # what the next run reads, instead of asking the environment again

    assert sdk_surface("py-e2b-2.63.0", cache_dir=tmp_path) == ["Sandbox.kept_only"]


def test_a_surface_is_kept_per_environment_and_listing_script(tmp_path: Path) -> None:
    script = tmp_path / "scripts" / "surface.mjs"
    script.parent.mkdir()
    script.write_text("// lists")
    driver = script.with_name("driver.mjs")
    driver.write_text("// loads the SDK")
    node = Path("/usr/bin/node")

    def kept(versions: dict[str, str]) -> Path:
        return _surface_file("js-e2b-2.51.0", versions, node, script, tmp_path)

    first = kept({"e2b": "2.51.0"})
    assert first.parent == tmp_path / "surfaces" and first.name.startswith("js-e2b-2.51.0-")
    assert kept({"e2b": "2.51.0"}) == first
    assert kept({"e2b": "2.52.0"}) != first  # another SDK in the environment
    driver.write_text("// loads the SDK another way")  # a module the script imports
    assert kept({"e2b": "2.51.0"}) != first


def test_write_coverage_writes_a_valid_coverage_json(tmp_path: Path) -> None:
    (tmp_path / "wire").mkdir()
    lines = [request("GET", "/sandboxes/abc", 200), request("POST", "/filesystem.Filesystem/Stat", 200, envd=True)]
    (tmp_path / "wire" / "py.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))

    written = write_coverage(tmp_path)

    on_disk = json.loads((tmp_path / "coverage.json").read_text())
    assert written == on_disk
    assert schema_errors("coverage", on_disk) == []
    assert on_disk["sdk"] == {}
    stat = [op for op in on_disk["spec"]["operations"] if op["route"] == "/filesystem.Filesystem/Stat"]
    assert stat == [
        {"api": "rpc", "method": "POST", "route": "/filesystem.Filesystem/Stat", "documented": [200], "seen": [200],
         "why_missing": None}
    ]  # fmt: skip


def test_an_empty_run_directory_has_no_coverage(tmp_path: Path) -> None:
    assert write_coverage(tmp_path) is None
    assert not (tmp_path / "coverage.json").exists()


def test_the_operation_table_holds_every_rpc_and_each_operation_once() -> None:
    operations = load_operations()
    keys = [(op["api"], op["method"], op["route"]) for op in operations]
    rpcs = {route for api, _, route in keys if api == "rpc"}

    assert len(keys) == len(set(keys))
    assert len(rpcs) == 17
    assert {"/process.Process/Start", "/filesystem.Filesystem/WatchDir", "/process.Process/CloseStdin"} <= rpcs
    assert all(op["documented"] for op in operations)
