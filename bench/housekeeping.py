"""Sandboxes a run leaves behind: every sandbox the harness creates carries `{"e2b-bench-run": <run id>}`."""

from __future__ import annotations

from urllib.parse import quote, urlencode

import httpx

from .results import CaseRecord, case_id

RUN_METADATA_KEY = "e2b-bench-run"
MAX_PAGES = 100


def run_metadata(run_id: str) -> dict[str, str]:
    return {RUN_METADATA_KEY: run_id}


def tagged_sandboxes(client: httpx.Client, run_id: str) -> list[str]:
    """Ids of the endpoint's sandboxes tagged with `run_id` (every page of `GET /v2/sandboxes`)."""
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


def kill_survivors(api_url: str, key: str | None, run_id: str, timeout_s: float = 15) -> list[str]:
    """Kill every sandbox still tagged with `run_id`; returns their ids (empty: nothing was left).

    Raises `httpx.HTTPError`, or ValueError/KeyError/TypeError for a listing that is not the API's.
    """
    with httpx.Client(base_url=api_url, headers={"X-API-KEY": key or ""}, timeout=timeout_s) as client:
        survivors = tagged_sandboxes(client, run_id)
        for sandbox_id in survivors:
            client.delete(f"/sandboxes/{sandbox_id}")
    return survivors


def leak_record(survivors: list[str], error: str | None, duration_ms: float | None = None) -> CaseRecord:
    """The `housekeeping/harness/leak_check` case: `error` when a sandbox survived or the check failed."""
    if survivors and error is None:
        error = f"{len(survivors)} sandbox(es) of this run were still alive at the end: {', '.join(survivors)}"
    return CaseRecord(
        id=case_id("housekeeping", "harness", "leak_check"),
        suite="housekeeping",
        runner="harness",
        case="leak_check",
        outcome="error" if error else "pass",
        expected="pass",
        conformant=error is None,
        duration_ms=duration_ms,
        error=error,
        details={"survivors": survivors},
    )
