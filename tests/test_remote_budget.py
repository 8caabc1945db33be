"""Budgets: the run's sandbox quota is enforced where every create passes (the recording proxies share one
ledger, and a create beyond the quota waits for a sandbox of the run to end), the ledger counts the
sandbox-seconds each suite used, and the endpoint's table gives the quota and the prices of the cost figure."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from bench.endpoints import EndpointError, resolve
from bench.localbox.server import LocalEndpoint
from bench.redaction import Redactor
from bench.remote.budget import E2B_FREE_TIER_SANDBOXES, Budget
from bench.remote.ledger import SandboxLedger
from bench.wire import WireProxy

HELD_S = 2.0  # how long the first sandbox is kept while the second create waits


def create(url: str, key: str) -> str:
    answer = httpx.post(f"{url}/sandboxes", json={"templateID": "base", "timeout": 120}, headers={"X-API-KEY": key},
                        timeout=300)  # fmt: skip
    answer.raise_for_status()
    return str(answer.json()["sandboxID"])


def listed(endpoint: LocalEndpoint) -> list[str]:
    answer = httpx.get(f"{endpoint.api_url}/v2/sandboxes", headers={"X-API-KEY": endpoint.api_key}, timeout=60)
    return [item["sandboxID"] for item in answer.json()]


def test_a_create_beyond_the_quota_waits_for_a_sandbox_of_the_run_to_end(
    endpoint: LocalEndpoint, tmp_path: Path
) -> None:
    ledger = SandboxLedger(max_sandboxes=1)
    key = endpoint.api_key
    proxies = [
        WireProxy(endpoint.api_url, endpoint.sandbox_url, tmp_path / f"{n}.log", n, Redactor(), ledger=ledger, suite=s)
        for n, s in (("a", "quickstart"), ("b", "probes"))
    ]
    with proxies[0] as a, proxies[1] as b:
        first = create(a.url, key)
        second: dict[str, Any] = {}
        waiting = threading.Thread(target=lambda: second.update(id=create(b.url, key), at=time.monotonic()))
        waiting.start()
        while not b.in_flight():  # the second create has reached the proxy
            time.sleep(0.01)
        time.sleep(HELD_S)

        assert listed(endpoint) == [first]  # it was not sent on: the endpoint has one sandbox
        assert waiting.is_alive()
        killed_at = time.monotonic()
        assert httpx.delete(f"{a.url}/sandboxes/{first}", headers={"X-API-KEY": key}, timeout=60).status_code == 204
        waiting.join(timeout=300)

        assert second["at"] > killed_at and listed(endpoint) == [second["id"]]
        assert httpx.delete(f"{b.url}/sandboxes/{second['id']}", headers={"X-API-KEY": key}, timeout=60).is_success
    seconds = ledger.sandbox_seconds()
    assert sorted(seconds) == ["probes", "quickstart"]
    assert seconds["quickstart"] >= HELD_S  # the first sandbox ran at least while the second waited
    assert ledger.left() == []  # both were killed on the wire: nothing left by the run


def test_the_cost_figure_prices_sandbox_seconds_by_the_endpoints_table() -> None:
    budget = Budget.from_table(
        {"price_per_vcpu_second": 0.001, "price_per_gib_second": 0.002, "sandbox_vcpus": 4, "sandbox_memory_gib": 2,
         "currency": "EUR"}, "[endpoints.x]",
    )  # fmt: skip

    cost = budget.cost({"quickstart": 10.0, "probes": 5.0})

    assert cost == {
        "sandbox_seconds": {"probes": 5.0, "quickstart": 10.0},
        "total_sandbox_seconds": 15.0,
        "estimate": {"amount": pytest.approx(15 * (4 * 0.001 + 2 * 0.002)), "currency": "EUR", "vcpus": 4.0,
                     "memory_gib": 2.0},
    }  # fmt: skip
    assert Budget().cost({"quickstart": 3.0})["estimate"] is None  # no price, no money figure


def test_the_quota_comes_from_the_endpoints_table_and_is_the_free_tier_for_e2b_cloud(tmp_path: Path) -> None:
    config = tmp_path / "endpoints.toml"
    config.write_text(
        '[endpoints.cloud]\ndomain = "e2b.app"\n'
        '[endpoints.paid]\ndomain = "e2b.app"\nmax_sandboxes = 100\n'
        '[endpoints.other]\napi_url = "http://127.0.0.1:9"\nsandbox_url = "http://127.0.0.1:9"\n'
        '[endpoints.bad]\ndomain = "e2b.app"\nmax_sandboxes = 0\n'
    )

    quotas = {name: resolve(name, config_path=config).budget.max_sandboxes for name in ("cloud", "paid", "other")}

    assert quotas == {"cloud": E2B_FREE_TIER_SANDBOXES, "paid": 100, "other": None}
    assert resolve("env", environ={}).budget.max_sandboxes == E2B_FREE_TIER_SANDBOXES
    assert resolve("local", environ={}).budget.max_sandboxes is None
    with pytest.raises(EndpointError, match=r"max_sandboxes must be a whole number of at least 1, not 0"):
        resolve("bad", config_path=config)


def test_the_ledger_counts_running_time_only_and_knows_which_sandboxes_the_run_left() -> None:
    now = [0.0]
    ledger = SandboxLedger(clock=lambda: now[0])
    ledger.created("a", "quickstart", "r", timeout_s=100)
    ledger.created("b", "probes", "r", timeout_s=30)
    ledger.created("c", "probes", "r", timeout_s=None)
    now[0] = 10
    ledger.observe("POST", "/sandboxes/a/pause", 204, None)  # a ran 10 s, then paused
    ledger.observe("POST", "/sandboxes/c/fork", 201, {"timeout": 5}, [{"sandbox": {"sandboxID": "d"}}, {"error": {}}])
    now[0] = 20
    ledger.observe("POST", "/sandboxes/a/connect", 201, {"timeout": 100})  # resumed for 100 s more
    ledger.observe("DELETE", "/sandboxes/c", 204, None)  # c ran 20 s
    now[0] = 40

    # a: 10 + 20; b: expired at 30; c: 20; d (c's fork): 5 s, its timeout
    assert ledger.sandbox_seconds() == {"quickstart": 30.0, "probes": 30.0 + 20.0 + 5.0}
    # Never killed and possibly alive: a (running), b and d (just past their expiry); c was killed.
    assert sorted(s.id for s in ledger.left()) == ["a", "b", "d"]
    now[0] = 100
    assert [s.id for s in ledger.left()] == ["a"]  # b and d ended long ago by their timeouts; a runs until 120
