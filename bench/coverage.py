"""Coverage of a run: which operations of the specification its traffic reached, with which statuses, and
which public SDK methods its cases called.

(a) Spec: every operation of E2B's REST API, envd's HTTP routes and envd's RPCs (bench/spec_operations.toml)
with the statuses its specification documents, next to the statuses the run's wire logs (`wire/*.jsonl`)
saw for it. The percentage counts (operation, documented status) pairs a client can reach: operations with
a `scope` note (account, template, cluster management; orchestrator-internal envd routes) and server-fault
statuses (5xx) are listed with why, not counted. Requests that match no operation are listed too.

(b) SDK: every public method of the runner's SDK (`Sandbox`/`AsyncSandbox` and their `commands`, `files`,
`pty` members for Python; `Sandbox` and the same members for npm), as the runner's own environment reports
it (sandboxes/e2b/*/surface.*), with the cases that called it (`details.sdk_calls`, observed by the runner).

(c) Fields: every field of an answer or probe the run's traces show, judged by a rule of the field-policy table or
by the reference traces, and the gaps: those neither judges (bench/differential/coverage.py).

`write_coverage(run_dir)` writes `coverage.json` (bench/schemas/coverage.schema.json) into the run directory.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import subprocess
import tomllib
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from .differential.coverage import field_coverage
from .paths import SANDBOXES_DIR
from .results import atomic_write

SPEC_OPERATIONS = Path(__file__).with_name("spec_operations.toml")
SURFACE = {
    "python": SANDBOXES_DIR / "e2b" / "python" / "surface.py",
    "js": SANDBOXES_DIR / "e2b" / "ts" / "surface.mjs",
}
SERVER_FAULT = "a server fault (5xx): a conforming client cannot provoke it"
ENVD_ONLY = ("/files", "/envs", "/init", "/freeze", "/unfreeze", "/collapse", "/fsfreeze", "/fsthaw")


def load_operations(path: Path = SPEC_OPERATIONS) -> list[dict[str, Any]]:
    with path.open("rb") as handle:
        return list(tomllib.load(handle)["operation"])


def _pattern(route: str) -> re.Pattern[str]:
    return re.compile("^" + re.sub(r"\\\{[^}]+\\\}", "[^/]+", re.escape(route)) + "$")


def _kind(path: str, headers: dict[str, Any]) -> str:
    """Which specification a request belongs to: envd's RPCs, envd's HTTP routes, or the REST API."""
    if path.startswith(("/process.Process/", "/filesystem.Filesystem/")):
        return "rpc"
    if path.startswith(ENVD_ONLY) or (path in ("/health", "/metrics") and "e2b-sandbox-id" in headers):
        return "envd"
    return "api"


def _unspecified_route(path: str) -> str:
    """A route outside the spec with its ids as placeholders (sandboxes; the code interpreter's contexts)."""
    return re.sub(r"(/contexts/)[^/]+", r"\1{contextID}", re.sub(r"(/sandboxes/)[^/]+", r"\1{sandboxID}", path))


def wire_requests(run_dir: Path) -> list[dict[str, Any]]:
    found = []
    for log in sorted((run_dir / "wire").glob("*.jsonl")):
        for line in log.read_text(encoding="utf-8").split("\n"):
            if line.strip():
                found.append(json.loads(line))
    return found


def spec_coverage(requests: Iterable[dict[str, Any]], operations: list[dict[str, Any]]) -> dict[str, Any]:
    patterns = [(op, _pattern(op["route"])) for op in operations]
    seen: dict[int, set[int]] = defaultdict(set)
    unspecified: dict[tuple[str, str], set[int]] = defaultdict(set)
    for request in requests:
        path = urlsplit(str(request.get("url", ""))).path
        method = str(request.get("method", "")).upper()
        status = request.get("status")
        if not isinstance(status, int):
            continue
        kind = _kind(path, {str(k).lower(): v for k, v in (request.get("request_headers") or {}).items()})
        match = next(
            (
                i
                for i, (op, rx) in enumerate(patterns)
                if op["api"] == kind and op["method"] == method and rx.match(path)
            ),
            None,
        )
        if match is None:
            unspecified[(method, _unspecified_route(path))].add(status)
        else:
            seen[match].add(status)
    rows = []
    counted = reached = 0
    for index, op in enumerate(operations):
        statuses = sorted(seen[index])
        documented = [int(s) for s in op["documented"]]
        reachable = [s for s in documented if s < 500 and str(s) not in op.get("unreachable", {})]
        if not op.get("scope"):
            counted += len(reachable)
            reached += len(set(reachable) & set(statuses))
        rows.append(
            {
                "api": op["api"],
                "method": op["method"],
                "route": op["route"],
                "documented": documented,
                "seen": statuses,
                "why_missing": _why_missing(op, documented, reachable, statuses),
            }
        )
    return {
        "percent": round(100.0 * reached / counted, 1) if counted else 0.0,
        "counted": counted,
        "reached": reached,
        "operations": rows,
        "unspecified": [
            {"method": method, "route": route, "seen": sorted(statuses)}
            for (method, route), statuses in sorted(unspecified.items())
        ],
    }


def _why_missing(op: dict[str, Any], documented: list[int], reachable: list[int], seen: list[int]) -> str | None:
    missing = [s for s in documented if s not in seen]
    if not missing:
        return None
    if op.get("scope"):
        return f"not counted: {op['scope']}"
    reasons = []
    not_reached = [s for s in reachable if s not in seen]
    if not_reached:
        reasons.append(f"no case provoked {', '.join(map(str, not_reached))}")
    for status in missing:
        if str(status) in op.get("unreachable", {}):
            reasons.append(f"{status}: {op['unreachable'][str(status)]}")
        elif status >= 500:
            reasons.append(f"{status}: {SERVER_FAULT}")
    return "; ".join(reasons)


# --- SDK methods ----------------------------------------------------------------------------------


def sdk_surface(runner_name: str, cache_dir: Path | None = None) -> list[str]:
    """The public SDK methods of a registered runner, as its own environment reports them. Every run's write-up
    asks, so the list is made once per state of that environment and of the listing script, and kept in the
    cache (`<cache>/surfaces/`): a runner process importing the SDK costs more than the rest of the table."""
    from .runners.catalog import available_runners

    runner = available_runners()[runner_name]
    executable = runner.prepare()
    script = SURFACE[runner.language]
    kept = _surface_file(runner_name, runner.resolved_versions(executable), executable, script, cache_dir)
    try:
        known = json.loads(kept.read_text(encoding="utf-8"))
        if isinstance(known, list) and all(isinstance(name, str) for name in known):
            return known
    except (OSError, ValueError):
        pass  # not listed yet for this state (or a file cut short): listed again
    done = subprocess.run(
        [str(executable), str(script)],
        env=runner.environment({}),
        cwd=script.parent,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    names = [str(name) for name in json.loads(done.stdout)]
    with contextlib.suppress(OSError):  # a read-only cache lists again next time
        kept.parent.mkdir(parents=True, exist_ok=True)
        partial = kept.with_name(f"{kept.name}.{os.getpid()}")
        partial.write_text(json.dumps(names) + "\n", encoding="utf-8")
        partial.replace(kept)
    return names


def _surface_file(
    runner_name: str, versions: dict[str, str], executable: Path, script: Path, cache_dir: Path | None
) -> Path:
    """Where the surface of this runner is kept: its name and a digest of what decides the list (every package
    its environment holds, its interpreter, and the listing script with the modules beside it it may import)."""
    from .runners.envs import default_cache_dir

    digest = hashlib.sha256()
    digest.update(json.dumps({"versions": versions, "executable": str(executable)}, sort_keys=True).encode())
    for source in sorted(script.parent.glob(f"*{script.suffix}")):
        digest.update(source.name.encode() + b"\0" + source.read_bytes())
    root = cache_dir if cache_dir is not None else default_cache_dir()
    return root / "surfaces" / f"{runner_name}-{digest.hexdigest()[:16]}.json"


def sdk_coverage(cases: list[dict[str, Any]], surface: Any = sdk_surface) -> dict[str, Any]:
    """Per runner whose cases report `sdk_calls`: every public method and the cases that called it."""
    calls: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for case in cases:
        for name in (case.get("details") or {}).get("sdk_calls") or ():
            calls[case["runner"]][name].append(case["id"])
    result: dict[str, Any] = {}
    for runner, called in sorted(calls.items()):
        try:
            names = surface(runner)
        except Exception as exc:  # the table says why it is empty; the run itself is unaffected
            result[runner] = {"percent": 0.0, "methods": [], "error": f"{type(exc).__name__}: {exc}"[:500]}
            continue
        methods = [{"name": name, "cases": sorted(called.get(name, []))} for name in names]
        covered = sum(1 for method in methods if method["cases"])
        result[runner] = {"percent": round(100.0 * covered / len(methods), 1) if methods else 0.0, "methods": methods}
    return result


def read_cases(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "cases.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").split("\n") if line.strip()]


def write_coverage(run_dir: Path) -> dict | None:
    """Write `coverage.json` into `run_dir` from its wire logs and cases; None when it has neither."""
    requests = wire_requests(run_dir)
    cases = read_cases(run_dir)
    if not requests and not cases:
        return None
    coverage = {"spec": spec_coverage(requests, load_operations()), "sdk": sdk_coverage(cases)}
    fields = field_coverage(run_dir)  # the field-policy table's coverage (bench/differential/coverage.py)
    if fields is not None:
        coverage["fields"] = fields
    atomic_write(run_dir / "coverage.json", json.dumps(coverage, indent=2) + "\n")  # as every artifact
    return coverage
