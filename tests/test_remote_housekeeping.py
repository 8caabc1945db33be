"""The harness's own clean-up (killing what a run left, the leak sweep) sends a 429/502/503 again: a kill a
gateway dropped would leave a sandbox running, and billed, after the run (#27)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from bench.housekeeping import kill_left, run_metadata, sweep
from bench.localbox.quirks import build
from bench.localbox.server import LocalEndpoint, LocalServer, in_thread

RUN_ID = "20261201T000000Z-housekeeping-local"


@pytest.fixture
def flaky() -> Iterator[LocalEndpoint]:
    # Half of the control-plane requests answer 502 or 503 (a seeded sequence).
    with in_thread(LocalServer(quirks=build("e2b", ["transient_5xx=0.5"]), pool_size=0)) as local:
        yield local


def created(client: httpx.Client, count: int) -> list[str]:
    """`count` sandboxes of the run, each create sent until the endpoint lets it through."""
    ids: list[str] = []
    while len(ids) < count:
        answer = client.post(
            "/sandboxes", json={"templateID": "base", "timeout": 120, "metadata": run_metadata(RUN_ID)}
        )
        if answer.status_code == 201:
            ids.append(answer.json()["sandboxID"])
    return ids


def alive(client: httpx.Client, sandbox_id: str) -> bool:
    while (status := client.get(f"/sandboxes/{sandbox_id}").status_code) in (502, 503):
        pass
    return status == 200


def test_killing_what_the_run_left_and_the_sweep_go_through_transient_answers(flaky: LocalEndpoint) -> None:
    with httpx.Client(base_url=flaky.api_url, headers={"X-API-KEY": flaky.api_key}, timeout=60) as client:
        left, swept = created(client, 3), created(client, 2)

        killed = kill_left(flaky.api_url, flaky.api_key, left)
        found = sweep(flaky.api_url, flaky.api_key, RUN_ID, own=swept)

        assert killed == dict.fromkeys(left, "killed")
        assert sorted(found.survivors) == sorted(swept) and set(found.deletes.values()) <= {200, 204}
        assert not any(alive(client, sandbox_id) for sandbox_id in left + swept)  # the endpoint's own view
