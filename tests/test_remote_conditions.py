"""Remote conditions offline (#27): the embedded endpoint's `rate_limit`, `transient_5xx`, `latency` and
`slow_create` quirks answer as a distant endpoint does, the wire proxy retries what the SDKs' users retry
(recording each retry), and a step failed only by a transient answer is the endpoint's moment, not a verdict.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from unittest import mock

import httpx
import pytest
from e2b import Sandbox
from run_cli import e2b_bench, only_run_dir

from bench.localbox.quirks import PROFILES, QuirkError, build
from bench.localbox.server import LocalEndpoint, LocalServer, in_thread
from bench.redaction import Redactor
from bench.remote.retry import retry_after, wait_before_retry
from bench.remote.transient import transient_only, with_conditions
from bench.results import Run, read_run
from bench.runners.protocol import StepResult
from bench.wire import WireProxy

MISSING_TEMPLATE = {"templateID": "no-such-template", "timeout": 30}
ROUNDS = 20  # of three creates at once, until one round is served within the rate limit's second


@pytest.fixture
def conditioned(request: pytest.FixtureRequest) -> Iterator[LocalEndpoint]:
    server = LocalServer(quirks=build("e2b", request.param), pool_size=0)
    with in_thread(server) as local:
        yield local


def api(local: LocalEndpoint) -> httpx.Client:
    return httpx.Client(base_url=local.api_url, headers={"X-API-KEY": local.api_key}, timeout=30)


def test_condition_quirks_read_counts_fractions_and_spans_and_refuse_other_values_in_one_sentence() -> None:
    quirks = build("e2b", ["rate_limit=3", "transient_5xx=0.25", "latency=40", "slow_create=100-300"])
    assert (quirks.rate_limit, quirks.transient_5xx, quirks.latency, quirks.slow_create) == (3, 0.25, 40, (100, 300))
    assert build("e2b", ["slow_create=500"]).slow_create == (500, 500)
    assert PROFILES["remote-e2b"].active() == {
        "rate_limit": 4, "transient_5xx": 0.01, "latency": 50, "slow_create": (1000, 2000),
    }  # fmt: skip
    for bad, says in [
        ("transient_5xx=2", "quirk transient_5xx takes a fraction from 0 to 1, not '2'"),
        ("latency=fast", "quirk latency takes a count >= 0, not 'fast'"),
        ("slow_create=2000-1000", "quirk slow_create takes milliseconds MS or MIN-MAX, not '2000-1000'"),
    ]:
        with pytest.raises(QuirkError) as refused:
            build("e2b", [bad])
        assert str(refused.value) == says


@pytest.mark.parametrize("conditioned", [["transient_5xx=0.5"]], indirect=True)
def test_transient_5xx_answers_a_seeded_share_of_control_plane_requests_in_e2bs_error_shape(
    conditioned: LocalEndpoint,
) -> None:
    with api(conditioned) as client:
        answers = [client.get("/v2/sandboxes") for _ in range(40)]
    statuses = [answer.status_code for answer in answers]
    # A second endpoint with the same quirk draws the same sequence: a failure can be replayed.
    with in_thread(LocalServer(quirks=build("e2b", ["transient_5xx=0.5"]), pool_size=0)) as again, api(again) as client:
        replayed = [client.get("/v2/sandboxes").status_code for _ in range(40)]

    assert statuses == replayed
    assert {502, 503, 200} == set(statuses)
    assert 10 <= statuses.count(200) <= 30
    failed = next(answer for answer in answers if answer.status_code == 502)
    assert failed.json() == {"code": 502, "message": "the endpoint is temporarily unavailable, try again"}


@pytest.mark.parametrize("conditioned", [["rate_limit=2", "latency=30"]], indirect=True)
def test_rate_limit_answers_429_with_retry_after_past_n_creates_a_second_and_latency_delays_every_request(
    conditioned: LocalEndpoint,
) -> None:
    with api(conditioned) as client, ThreadPoolExecutor(3) as clients:
        # Three sent at once. The endpoint counts creates over the last second, so the third is refused only when
        # all three reached it within one second: sure when every answer came back within a second of sending
        # (each was admitted between the send and its answer), not otherwise: a host too busy to serve three
        # requests in a second (CI once) admits the third. Such a round says nothing: it is sent again.
        for _ in range(ROUNDS):
            time.sleep(1.1)  # past the second: the earlier rounds' creates no longer count
            started = time.monotonic()
            answers = list(clients.map(lambda _: client.post("/sandboxes", json=MISSING_TEMPLATE), range(3)))
            elapsed = time.monotonic() - started
            if elapsed < 1:
                break
        else:
            pytest.fail(f"no round of three creates was served within a second in {ROUNDS} rounds: the host is stalled")
        time.sleep(1.1)  # past the second: creates are admitted again
        started = time.monotonic()
        later = client.post("/sandboxes", json=MISSING_TEMPLATE)
        later_elapsed = time.monotonic() - started

    # Two reach the endpoint (which refuses the template); the third is refused before it.
    refused = [answer for answer in answers if answer.status_code == 429]
    assert sorted(a.status_code for a in answers if a not in refused) == [later.status_code] * 2 != [429] * 2
    assert len(refused) == 1 and refused[0].headers["retry-after"] == "1"
    assert refused[0].json() == {"code": 429, "message": "rate limit exceeded: at most 2 sandbox creates per second"}
    assert elapsed >= 0.030 and later_elapsed >= 0.030  # every request waited its latency (a floor, not a timing)


@pytest.fixture
def proxied(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[tuple[WireProxy, LocalEndpoint]]:
    server = LocalServer(quirks=build("e2b", request.param), pool_size=0)
    with (
        in_thread(server) as local,
        WireProxy(local.api_url, local.sandbox_url, tmp_path / "wire.jsonl", "test", Redactor()) as proxy,
    ):
        env = {**local.env(), "E2B_API_URL": proxy.url, "E2B_SANDBOX_URL": proxy.url}
        with mock.patch.dict(os.environ, env):
            yield proxy, local


def wire_lines(proxy: WireProxy) -> list[dict]:
    return [json.loads(line) for line in proxy.log_path.read_text().splitlines()]


@pytest.mark.parametrize("proxied", [["rate_limit=1"]], indirect=True)
def test_the_wire_proxy_retries_a_rate_limited_create_after_retry_after_and_logs_the_retry(
    proxied: tuple[WireProxy, LocalEndpoint],
) -> None:
    proxy, local = proxied
    # Both at once: one after the other, a create slower than a second (a busy host) lets the next one through.
    with ThreadPoolExecutor(max_workers=2) as pool:
        made = list(pool.map(lambda _: Sandbox.create(timeout=60, metadata={"test": "rate-limit"}), range(2)))
    try:
        with api(local) as client:  # the second path: the endpoint itself, not through the proxy
            found = client.get("/v2/sandboxes", params={"metadata": "test=rate-limit"}).json()
        listed = {sandbox["sandboxID"] for sandbox in found}
    finally:
        for sandbox in made:
            sandbox.kill()

    assert listed == {sandbox.sandbox_id for sandbox in made}
    creates = [line for line in wire_lines(proxy) if line["method"] == "POST" and line["url"].endswith("/sandboxes")]
    assert [line["status"] for line in creates] == [201, 201]
    assert creates[0].get("retries") is None
    assert creates[1]["retries"] and {r["status"] for r in creates[1]["retries"]} == {429}
    assert all(r["wait_ms"] == 1000 for r in creates[1]["retries"])
    taken = proxy.take_conditions()
    assert taken and {(c["status"], c["retried"]) for c in taken} == {(429, True)} and proxy.take_conditions() == []


@pytest.mark.parametrize("proxied", [["transient_5xx=0.6"]], indirect=True)
def test_the_wire_proxy_retries_502_and_503_on_reads_and_hands_on_those_of_other_calls(
    proxied: tuple[WireProxy, LocalEndpoint],
) -> None:
    proxy, _ = proxied
    with httpx.Client(base_url=proxy.url, headers={"X-API-KEY": proxied[1].api_key}, timeout=60) as client:
        reads = [client.get("/v2/sandboxes").status_code for _ in range(6)]
        writes = [client.post("/sandboxes/nonexistent/timeout", json={"timeout": 5}).status_code for _ in range(6)]

    lines = wire_lines(proxy)
    assert reads == [200] * 6
    assert sum(len(line.get("retries", ())) for line in lines if line["method"] == "GET") >= 1
    assert set(writes) <= {404, 502, 503} and {502, 503} & set(writes)
    assert all("retries" not in line for line in lines if line["method"] == "POST")
    handed_on = [c for c in proxy.take_conditions() if not c["retried"]]
    assert [c["status"] for c in handed_on] == [status for status in writes if status != 404]


def test_retry_waits_follow_retry_after_and_doubling_within_the_budget_and_never_for_other_calls() -> None:
    assert wait_before_retry("POST", "/sandboxes", 429, {"retry-after": "3"}, 1, 0) == 3
    assert wait_before_retry("POST", "/v2/sandboxes", 502, {}, 3, 0) == 1.0
    assert wait_before_retry("GET", "/sandboxes/x", 503, {}, 1, 0) == 0.25
    assert wait_before_retry("GET", "/sandboxes/x", 429, {"retry-after": "1"}, 1, 0) is None  # only creates
    assert wait_before_retry("DELETE", "/sandboxes/x", 502, {}, 1, 0) is None  # not idempotent
    assert wait_before_retry("POST", "/sandboxes", 500, {}, 1, 0) is None
    assert wait_before_retry("POST", "/sandboxes", 429, {"retry-after": "5"}, 1, 58) is None  # past the budget
    assert wait_before_retry("POST", "/sandboxes", 502, {}, 6, 0) is None  # out of attempts
    assert retry_after("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0 and retry_after("soon") is None


def test_a_step_failed_after_a_transient_answer_is_an_endpoint_transient_error_with_its_retries_recorded() -> None:
    failed = StepResult("py05", "fail", 12.0, "SandboxException: 502: unavailable", {"k": 1}, True)
    passed = StepResult("py06", "pass", 12.0, None, {}, True)
    retry = {"method": "POST", "path": "/sandboxes", "status": 429, "retried": True, "wait_ms": 1000}
    handed = {"method": "DELETE", "path": "/sandboxes/x", "status": 502, "retried": False}

    transient = with_conditions(failed, [retry, handed])
    assert transient.outcome == "error"
    assert transient.error == "endpoint transient (502): SandboxException: 502: unavailable"
    assert transient.details == {
        "k": 1,
        "cause": "endpoint transient (502)",
        "observed_outcome": "fail",
        "retries": [{"method": "POST", "path": "/sandboxes", "status": 429, "wait_ms": 1000}],
        "transient_answers": [{"method": "DELETE", "path": "/sandboxes/x", "status": 502}],
    }
    kept = with_conditions(passed, [retry, handed])
    assert kept.outcome == "pass" and "cause" not in kept.details and kept.details["retries"]
    assert with_conditions(failed, [retry]).outcome == "fail"  # retried through: the failure is the endpoint's own


def test_a_run_failed_only_by_transient_answers_is_kept_apart_from_a_conformance_failure() -> None:
    transient = {"cause": "endpoint transient (503)", "observed_outcome": "fail"}
    conformance = {"observed_outcome": "fail"}

    assert transient_only([transient, transient]) == (
        "2 case(s) failed only because the endpoint answered 429/502/503 where no retry was due and could not be "
        "run again (see details.cause): no conformance verdict on them; re-run when the endpoint is steady"
    )
    assert transient_only([transient, conformance]) is None  # one real failure: a conformance verdict (exit 1)
    assert transient_only([]) is None


SHARED_SUITES = (
    "sandboxes/e2b/test_quickstart.py",
    "sandboxes/e2b/test_probes.py::test_probes",
    "sandboxes/e2b/test_behaviours.py",
)
LONGEST_CASE_TIMEOUT_S = 180  # the shortest lifetime a case sets on a sandbox it asked for (set_timeout's second)


@pytest.mark.slow
def test_a_run_slower_than_every_timeout_a_case_sets_gives_the_same_verdicts(tmp_path: Path) -> None:
    # Every request 500 ms late and every create 3 s slow: each client's behaviours after `set_timeout` take
    # longer than the 180 s it sets, so a shared sandbox it had cut short would be gone under the cases after
    # it (at 300 ms they took 177 s: the old harness, which cut the shared one, still passed).
    slow = ("--quirk", "latency=500", "--quirk", "slow_create=3000")
    runs = {}
    for name, quirks in (("plain", ()), ("slow", slow)):
        done = e2b_bench(
            "run", "--runner", "py-e2b-2.63.0", "--results-dir", str(tmp_path / name), *quirks, *SHARED_SUITES,
            timeout=3600,
        )  # fmt: skip
        runs[name] = read_run(only_run_dir(tmp_path / name))
        assert runs[name].footer is not None, done.stdout[-3000:] + done.stderr[-3000:]

    def verdicts(run: Run) -> dict[str, tuple[str, bool]]:
        return {case.id: (case.outcome, case.conformant) for case in run.cases}

    started, ended = (parse(runs["slow"].header["started_at"]), parse(runs["slow"].footer["finished_at"]))
    assert (ended - started).total_seconds() > LONGEST_CASE_TIMEOUT_S  # the condition the test needs
    assert verdicts(runs["slow"]) == verdicts(runs["plain"])
    assert not any("not found" in (case.error or "") for case in runs["slow"].cases)


def parse(stamp: str) -> datetime:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00"))
