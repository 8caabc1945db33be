"""Sandboxes a run leaves behind: every sandbox the harness creates carries `{"e2b-bench-run": <run id>}`.

The sweep at the end of a run lists the endpoint's sandboxes under that tag and deletes only those it
has verified to be this run's: one of the ids the run knows it created, or one whose `GET
/sandboxes/{id}` shows the run's tag. A listing that returns another run's sandbox is the endpoint's
list filter deviating: it is recorded, and that sandbox is left alone.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from urllib.parse import quote, urlencode

import httpx

from .remote.retry import RetryingTransport
from .remote.slowness import scaled
from .remote.tls import verifying
from .results import CaseRecord, case_id

RUN_METADATA_KEY = "e2b-bench-run"
REQUEST_S = 15.0  # one list or DELETE answered, on a quiet host (scaled by the host's slowness)
MAX_PAGES = 100


def run_metadata(run_id: str) -> dict[str, str]:
    return {RUN_METADATA_KEY: run_id}


def tagged_sandboxes(client: httpx.Client, run_id: str) -> list[str]:
    """Ids the endpoint lists under the tag `run_id` (every page of `GET /v2/sandboxes?metadata=...`)."""
    metadata = quote(urlencode({quote(RUN_METADATA_KEY): quote(run_id)}), safe="")
    found: list[str] = []
    token: str | None = None
    for _ in range(MAX_PAGES):
        page = f"&nextToken={quote(token, safe='')}" if token else ""
        listed = client.get(f"/v2/sandboxes?metadata={metadata}{page}")
        listed.raise_for_status()
        found.extend(str(item["sandboxID"]) for item in listed.json())
        token = listed.headers.get("X-Next-Token")
        if not token:
            break
    return found


def is_this_runs(client: httpx.Client, sandbox_id: str, run_id: str) -> bool:
    """Does `GET /sandboxes/{id}` show the run's tag? (A sandbox gone meanwhile is not deleted.)"""
    info = client.get(f"/sandboxes/{quote(sandbox_id, safe='')}")
    if info.status_code == 404:
        return False
    info.raise_for_status()
    return bool((info.json().get("metadata") or {}).get(RUN_METADATA_KEY) == run_id)


@dataclass(frozen=True)
class Sweep:
    """What the sweep found and did."""

    survivors: list[str] = field(default_factory=list)  # this run's sandboxes still alive: deleted
    deletes: dict[str, int] = field(default_factory=dict)  # sandbox id -> status of its DELETE
    foreign: list[str] = field(default_factory=list)  # listed under the tag, not this run's: left alone


def sweep(
    api_url: str, key: str | None, run_id: str, own: Collection[str] = (), timeout_s: float | None = None
) -> Sweep:
    """Delete every verified sandbox of `run_id` still alive.

    Raises `httpx.HTTPError`, or ValueError/KeyError/TypeError for a listing that is not the API's.
    """
    result = Sweep()
    timeout = scaled(REQUEST_S) if timeout_s is None else timeout_s
    with _api_client(api_url, key, timeout) as client:
        for sandbox_id in dict.fromkeys(tagged_sandboxes(client, run_id)):
            if sandbox_id not in own and not is_this_runs(client, sandbox_id, run_id):
                result.foreign.append(sandbox_id)
                continue
            result.survivors.append(sandbox_id)
            result.deletes[sandbox_id] = client.delete(f"/sandboxes/{quote(sandbox_id, safe='')}").status_code
    return result


ALREADY_GONE = "already gone"
KILLED = {200: "killed", 204: "killed", 404: ALREADY_GONE}


def _api_client(api_url: str, key: str | None, timeout: float) -> httpx.Client:
    """The harness's own API client: the key, and a 429/502/503 sent again."""
    transport = RetryingTransport(verify=verifying())
    return httpx.Client(base_url=api_url, headers={"X-API-KEY": key or ""}, timeout=timeout, transport=transport)


def kill_left(api_url: str, key: str | None, sandbox_ids: Collection[str]) -> dict[str, str]:
    """Kill the sandboxes a run left itself (created, never killed: an interrupted or stopped runner's), best
    effort; what each kill did: `killed`, `already gone` or why it failed. Never the endpoint's fault."""
    done: dict[str, str] = {}
    if not sandbox_ids:
        return done
    timeout = scaled(REQUEST_S)
    with _api_client(api_url, key, timeout) as client:
        for sandbox_id in sandbox_ids:
            try:
                status = client.delete(f"/sandboxes/{quote(sandbox_id, safe='')}").status_code
            except httpx.HTTPError as exc:
                done[sandbox_id] = f"kill failed: {exc}"
                continue
            done[sandbox_id] = KILLED.get(status, f"kill answered {status}")
    return done


def leak_record(found: Sweep, error: str | None, duration_ms: float | None = None) -> CaseRecord:
    """The `housekeeping/harness/leak_check` case: `error` when a sandbox survived or the check failed,
    `deviation` when the list filter returned sandboxes of other runs."""
    problems = [error] if error else []
    if found.survivors:
        problems.append(
            f"{len(found.survivors)} sandbox(es) of this run were still alive at the end: {', '.join(found.survivors)}"
        )
    failed = {sid: status for sid, status in found.deletes.items() if status >= 300 and status != 404}
    if failed:
        statuses = ", ".join(f"{sandbox_id} (HTTP {status})" for sandbox_id, status in failed.items())
        problems.append(f"deleting them failed: {statuses}")
    outcome = "error" if problems else "pass"
    if found.foreign:
        problems.append(
            f"the list filter metadata={RUN_METADATA_KEY}=<run id> returned {len(found.foreign)} sandbox(es) of "
            f"other runs, left alone: {', '.join(found.foreign)}"
        )
        outcome = "error" if outcome == "error" else "deviation"
    details: dict[str, object] = {"survivors": found.survivors}
    if found.deletes:
        details["deletes"] = found.deletes
    if found.foreign:
        details["foreign"] = found.foreign
    return CaseRecord(
        id=case_id("housekeeping", "harness", "leak_check"),
        suite="housekeeping",
        runner="harness",
        case="leak_check",
        outcome=outcome,  # type: ignore[arg-type]
        expected="pass",
        conformant=not problems,
        duration_ms=duration_ms,
        error="; ".join(problems) or None,
        details=details,
    )
