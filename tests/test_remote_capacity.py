"""Capacity is not conformance (#42): a create the endpoint refuses for a concurrency limit (the embedded endpoint's
`max_running` quirk: 429 "at most N sandboxes at once", no Retry-After) teaches the run's ledger the limit; the
refused create waits in the wire proxy for one of the run's sandboxes to end and is sent again, so its client never
sees the 429; later runners wait for room under the limit; a run says so once and suggests --max-sandboxes."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from run_cli import e2b_bench, only_run_dir

from bench.localbox.quirks import build
from bench.localbox.server import LocalEndpoint, LocalServer, in_thread
from bench.redaction import Redactor
from bench.remote.capacity import RunnerGate, is_capacity, sentence
from bench.remote.ledger import SandboxLedger
from bench.remote.transient import transient_only, with_conditions
from bench.results import read_run
from bench.runners.protocol import StepResult
from bench.wire import WireProxy

HELD_S = 2.0  # how long the first sandbox is kept while the second create waits


@pytest.fixture
def capped() -> Iterator[LocalEndpoint]:
    with in_thread(LocalServer(quirks=build("e2b", ["max_running=1"]), pool_size=0)) as local:
        yield local


def create(url: str, key: str) -> httpx.Response:
    return httpx.post(f"{url}/sandboxes", json={"templateID": "base", "timeout": 120}, headers={"X-API-KEY": key},
                      timeout=300)  # fmt: skip


def test_the_max_running_quirk_refuses_a_create_past_n_running_sandboxes_without_retry_after(
    capped: LocalEndpoint,
) -> None:
    first = create(capped.api_url, capped.api_key)
    refused = create(capped.api_url, capped.api_key)
    httpx.delete(f"{capped.api_url}/sandboxes/{first.json()['sandboxID']}", headers={"X-API-KEY": capped.api_key})
    after = create(capped.api_url, capped.api_key)
    httpx.delete(f"{capped.api_url}/sandboxes/{after.json()['sandboxID']}", headers={"X-API-KEY": capped.api_key})

    assert (first.status_code, refused.status_code, after.status_code) == (201, 429, 201)
    assert refused.json() == {"code": 429, "message": "at most 1 sandboxes at once"}
    assert "retry-after" not in refused.headers


def test_a_create_refused_for_capacity_waits_for_a_sandbox_of_the_run_to_end_and_the_limit_is_learned(
    capped: LocalEndpoint, tmp_path: Path
) -> None:
    told: list[tuple[int, str]] = []
    ledger = SandboxLedger(on_capacity=lambda limit, message: told.append((limit, message)))
    key = capped.api_key
    proxies = [
        WireProxy(capped.api_url, capped.sandbox_url, tmp_path / f"{n}.jsonl", n, Redactor(), ledger=ledger, suite=n)
        for n in ("a", "b")
    ]
    with proxies[0] as a, proxies[1] as b:
        first = create(a.url, key).json()["sandboxID"]
        second: dict[str, Any] = {}
        waiting = threading.Thread(target=lambda: second.update(answer=create(b.url, key), at=time.monotonic()))
        waiting.start()
        while ledger.capacity is None:  # the endpoint refused it: the limit is learned
            time.sleep(0.01)
        time.sleep(HELD_S)

        assert waiting.is_alive()  # its client has no answer yet: the 429 was not handed on
        killed_at = time.monotonic()
        assert httpx.delete(f"{a.url}/sandboxes/{first}", headers={"X-API-KEY": key}, timeout=60).status_code == 204
        waiting.join(timeout=300)
        made = second["answer"].json()["sandboxID"]
        assert httpx.delete(f"{b.url}/sandboxes/{made}", headers={"X-API-KEY": key}, timeout=60).is_success

    assert second["answer"].status_code == 201 and second["at"] > killed_at
    assert (ledger.capacity, ledger.limit(), ledger.capacity_message) == (1, 1, "at most 1 sandboxes at once")
    assert told == [(1, "at most 1 sandboxes at once")]  # said once
    # The wire log, a second path: the refusals were retried (after a wait for room), the create answered 201.
    lines = [json.loads(line) for line in (tmp_path / "b.jsonl").read_text().splitlines()]
    (created,) = [line for line in lines if line["method"] == "POST"]
    assert created["status"] == 201 and created["retries"]
    assert {(retry["status"], retry.get("capacity")) for retry in created["retries"]} == {(429, True)}
    assert ledger.capacity_answers == len(created["retries"])


def test_a_client_that_gives_up_while_its_create_waits_for_room_is_told_the_endpoints_capacity(
    capped: LocalEndpoint, tmp_path: Path
) -> None:
    ledger = SandboxLedger()
    key = capped.api_key
    with WireProxy(capped.api_url, capped.sandbox_url, tmp_path / "a.jsonl", "a", Redactor(), ledger=ledger) as a:
        first = create(a.url, key).json()["sandboxID"]
        a.take_conditions()
        with pytest.raises(httpx.ReadTimeout):  # an SDK whose request timeout ends before room comes
            httpx.post(f"{a.url}/sandboxes", json={"templateID": "base", "timeout": 120}, headers={"X-API-KEY": key},
                       timeout=httpx.Timeout(60, read=3))  # fmt: skip
        seen: list[dict[str, Any]] = []
        while not any(not c["retried"] for c in seen):  # the proxy sees the client go
            seen += a.take_conditions()
            time.sleep(0.05)
        httpx.delete(f"{a.url}/sandboxes/{first}", headers={"X-API-KEY": key}, timeout=60)
        listed = httpx.get(f"{capped.api_url}/v2/sandboxes", headers={"X-API-KEY": key}, timeout=60).json()

    assert listed == []  # the given-up create made nothing: it was never sent again
    assert ledger.pending == 0 and ledger.capacity == 1
    assert [c for c in seen if not c["retried"]] == [
        {"method": "POST", "path": "/sandboxes", "status": 429, "retried": False, "capacity": True,
         "message": "at most 1 sandboxes at once"}
    ]  # fmt: skip
    assert {(c["status"], c.get("capacity")) for c in seen if c["retried"]} <= {(429, True)}


def test_capacity_is_told_apart_from_a_rate_limit_and_a_capacity_failure_is_never_the_endpoints_conformance() -> None:
    assert is_capacity(429, {}, "at most 40 sandboxes at once", 0)
    assert is_capacity(429, {"retry-after": "5"}, "Too many concurrent sandboxes", 0)
    assert not is_capacity(429, {"retry-after": "1"}, "rate limit exceeded: at most 2 sandbox creates per second", 0)
    assert not is_capacity(429, {}, "Too Many Requests", 0)  # wordless: a short retry first
    assert is_capacity(429, {}, "Too Many Requests", 2)  # ... which did not clear it
    assert not is_capacity(429, {"retry-after": "1"}, "Too Many Requests", 5)  # a rate limit: its Retry-After
    assert not is_capacity(503, {}, "at most 40 sandboxes at once", 0)
    assert sentence(40, "at most 40 sandboxes at once") == (
        "the endpoint refuses more than 40 sandboxes at once (429 at most 40 sandboxes at once); holding the run to "
        "40; pass --max-sandboxes 40 next time"
    )

    failed = StepResult("s", "refused", 10, "SandboxException: 429: at most 40 sandboxes at once", {}, True)
    handed = {"method": "POST", "path": "/sandboxes", "status": 429, "retried": False, "capacity": True,
              "message": "at most 40 sandboxes at once"}  # fmt: skip
    judged = with_conditions(failed, [handed])
    assert (judged.outcome, judged.details["cause"], judged.details["observed_outcome"]) == (
        "error", "endpoint capacity", "refused"
    )  # fmt: skip
    assert judged.error == (
        "endpoint at capacity (429 at most 40 sandboxes at once): SandboxException: 429: at most 40 sandboxes at once"
    )
    assert transient_only([judged.details]) is not None  # no conformance verdict: exit 2, not 1


def test_runners_wait_for_room_under_the_limit_before_they_start() -> None:
    limit: list[int | None] = [None]
    gate, stop = RunnerGate(lambda: limit[0]), threading.Event()
    started: list[int] = []

    def runner(n: int, hold: threading.Event) -> None:
        with gate.slot(stop):
            started.append(n)
            hold.wait(60)

    holds = [threading.Event() for _ in range(3)]
    with gate.slot(stop):  # unlimited: a runner starts at once
        pass
    limit[0] = 5  # two runners of two sandboxes each fit
    threads = [threading.Thread(target=runner, args=(n, holds[n])) for n in range(3)]
    for thread in threads:
        thread.start()
    while gate.running < 2:
        time.sleep(0.01)
    time.sleep(0.3)
    assert len(started) == 2 and gate.running == 2  # the third waits
    waiting = next(n for n in range(3) if n not in started)
    holds[started[0]].set()  # a runner ends: the third starts
    while waiting not in started:
        time.sleep(0.01)
    for hold in holds:
        hold.set()
    for thread in threads:
        thread.join(timeout=60)
    assert sorted(started) == [0, 1, 2] and gate.running == 0


RUNNERS = ("py-e2b-2.63.0", "py-code-interpreter-2.11.5", "js-code-interpreter-2.8.0")


def test_a_run_past_the_endpoints_concurrency_cap_learns_it_says_so_and_no_case_fails_for_it(tmp_path: Path) -> None:
    # Three runners each start with a sandbox of their own against an endpoint that allows two at once.
    selection = [arg for runner in RUNNERS for arg in ("--runner", runner)]
    done = e2b_bench("run", "quickstart", "code-interpreter", *selection, "--quirk", "max_running=2", "--no-report",
                     "--results-dir", str(tmp_path), timeout=1800)  # fmt: skip

    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-3000:]
    run = read_run(only_run_dir(tmp_path))
    assert run.cases and all(case.conformant and case.outcome == "pass" for case in run.cases)
    told = (
        "the endpoint refuses more than 2 sandboxes at once (429 at most 2 sandboxes at once); holding the run to 2; "
        "pass --max-sandboxes 2 next time"
    )
    assert output.count(told) == 1
    assert run.footer is not None
    # The wire logs, a second path: every create the endpoint refused for capacity was retried, none handed on to a
    # client still waiting for it (a runner stopped to yield its seat went away from its create).
    lines = [json.loads(line) for log in (run.path / "wire").glob("*.jsonl") for line in log.read_text().splitlines()]
    creates = [line for line in lines if line["method"] == "POST" and line["url"].endswith("/sandboxes")]
    retried = [retry for line in creates for retry in line.get("retries", []) if retry.get("capacity")]
    assert all(line["status"] != 429 or "client disconnected" in line.get("error", "") for line in creates)
    capacity = run.footer["capacity"]
    assert (capacity["limit"], capacity["message"]) == (2, "at most 2 sandboxes at once")
    assert capacity["answers"] >= max(len(retried), 1)
    assert f"capacity: the endpoint refused {capacity['answers']} create(s) past 2 sandboxes at once" in output
