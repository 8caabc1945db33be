"""The embedded endpoint's REST API, spoken to directly: status codes, bodies and error shapes."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator
from datetime import datetime
from urllib.parse import quote, urlencode

import httpx
import pytest

from bench.localbox.server import LocalEndpoint


@pytest.fixture
def api(endpoint: LocalEndpoint) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=endpoint.api_url, headers={"X-API-KEY": endpoint.api_key}, timeout=30) as client:
        created: list[str] = []
        client.created = created  # type: ignore[attr-defined]
        yield client
        for sandbox_id in created:
            client.delete(f"/sandboxes/{sandbox_id}")


def create(api: httpx.Client, path: str = "/v2/sandboxes", **body) -> dict:
    response = api.post(path, json={"templateID": "base", **body})
    assert response.status_code == 201, response.text
    data = response.json()
    api.created.append(data["sandboxID"])  # type: ignore[attr-defined]
    return data


def error_of(response: httpx.Response) -> tuple[int, dict]:
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert set(body) >= {"code", "message"} and body["code"] == response.status_code
    return response.status_code, body


@pytest.mark.parametrize("path", ["/v2/sandboxes", "/sandboxes"])
def test_create_answers_201_with_the_members_the_sdks_require(api: httpx.Client, path: str) -> None:
    data = create(api, path, timeout=60, metadata={"k": "v"}, envVars={"A": "1"}, secure=True)

    assert set(data) >= {"templateID", "sandboxID", "clientID", "envdVersion", "envdAccessToken"}
    assert data["templateID"] == "base"
    assert data["envdVersion"] == "0.6.4"
    assert data["domain"] is None
    assert len(data["envdAccessToken"]) >= 43  # 32 random bytes, base64url


def test_unknown_body_members_are_ignored(api: httpx.Client) -> None:
    data = create(api, someFutureOption={"x": 1}, anotherOne=[1, 2])

    assert api.get(f"/sandboxes/{data['sandboxID']}").status_code == 200


def test_get_info_never_returns_the_access_token(api: httpx.Client) -> None:
    sandbox_id = create(api, metadata={"owner": "me"})["sandboxID"]

    detail = api.get(f"/sandboxes/{sandbox_id}").json()

    assert "envdAccessToken" not in detail
    assert detail["state"] == "running"
    assert detail["metadata"] == {"owner": "me"}
    for member in ("startedAt", "endAt", "cpuCount", "memoryMB", "diskSizeMB", "clientID", "envdVersion"):
        assert member in detail
    datetime.fromisoformat(detail["endAt"].replace("Z", "+00:00"))


def test_list_filters_by_encoded_metadata_and_state_and_paginates(api: httpx.Client) -> None:
    tag = f"run-{time.time_ns()}"
    ids = [create(api, metadata={"e2b bench": tag, "n": str(i)})["sandboxID"] for i in range(3)]
    api.post(f"/sandboxes/{ids[0]}/pause", json={})
    # The SDKs encode each key and value once, then the whole query string once more.
    metadata = quote(urlencode({quote("e2b bench"): quote(tag)}), safe="")

    running = api.get(f"/v2/sandboxes?metadata={metadata}&state=running").json()
    first = api.get(f"/v2/sandboxes?metadata={metadata}&limit=2")
    second = api.get(f"/v2/sandboxes?metadata={metadata}&limit=2&nextToken={first.headers['x-next-token']}")

    assert sorted(s["sandboxID"] for s in running) == sorted(ids[1:])
    assert all("envdAccessToken" not in s for s in running)
    assert len(first.json()) == 2
    assert "x-next-token" not in second.headers
    assert sorted(s["sandboxID"] for s in first.json() + second.json()) == sorted(ids)


def test_v1_list_answers_running_sandboxes(api: httpx.Client) -> None:
    sandbox_id = create(api)["sandboxID"]

    listed = api.get("/sandboxes").json()

    assert sandbox_id in [s["sandboxID"] for s in listed]


def test_timeout_moves_end_at(api: httpx.Client) -> None:
    sandbox_id = create(api, timeout=30)["sandboxID"]

    asked = time.time()
    response = api.post(f"/sandboxes/{sandbox_id}/timeout", json={"timeout": 600})
    detail = api.get(f"/sandboxes/{sandbox_id}").json()
    answered = time.time()

    assert response.status_code == 204
    end = datetime.fromisoformat(detail["endAt"].replace("Z", "+00:00")).timestamp()
    assert asked + 600 - 0.001 <= end <= answered + 600  # 600 s from the request (endAt in milliseconds)


def test_pause_twice_answers_409_and_connect_resumes_with_201_and_a_new_token(api: httpx.Client) -> None:
    created = create(api)
    sandbox_id = created["sandboxID"]

    first = api.post(f"/sandboxes/{sandbox_id}/pause", json={})
    second = api.post(f"/sandboxes/{sandbox_id}/pause", json={})
    state = api.get(f"/sandboxes/{sandbox_id}").json()["state"]
    resumed = api.post(f"/v2/sandboxes/{sandbox_id}/connect", json={"timeout": 60})
    running = api.post(f"/sandboxes/{sandbox_id}/connect", json={"timeout": 60})

    assert first.status_code == 204
    assert error_of(second)[0] == 409
    assert state == "paused"
    assert resumed.status_code == 201
    assert running.status_code == 200
    tokens = {created["envdAccessToken"], resumed.json()["envdAccessToken"], running.json()["envdAccessToken"]}
    assert len(tokens) == 3


def test_kill_answers_204_then_404(api: httpx.Client) -> None:
    sandbox_id = create(api)["sandboxID"]

    first = api.delete(f"/sandboxes/{sandbox_id}")
    second = api.delete(f"/sandboxes/{sandbox_id}")

    assert first.status_code == 204
    assert error_of(second)[0] == 404


def test_metrics_report_real_memory_and_cpu_figures(api: httpx.Client, endpoint: LocalEndpoint) -> None:
    created = create(api)
    headers = {"E2b-Sandbox-Id": created["sandboxID"], "X-Access-Token": created["envdAccessToken"]}
    # A python holds 64 MiB and says so; the samples are taken while it still holds them, then it is killed.
    hold = "import time; x = bytearray(64 << 20); print('held', flush=True); time.sleep(600)"
    start = json.dumps({"process": {"cmd": "python3", "args": ["-c", hold]}}).encode()
    with (
        httpx.Client(base_url=endpoint.sandbox_url, headers=headers, timeout=60) as envd,
        envd.stream(
            "POST",
            "/process.Process/Start",
            content=b"\0" + len(start).to_bytes(4, "big") + start,
            headers={"Content-Type": "application/connect+json"},
        ) as started,
    ):
        events = process_events(started.iter_bytes())
        pid = next(event for event in events if "start" in event)["start"]["pid"]
        stdout = b""
        for event in events:
            stdout += base64.b64decode(event.get("data", {}).get("stdout", ""))
            if b"held\n" in stdout:
                break
        api.get(f"/sandboxes/{created['sandboxID']}/metrics")  # the CPU figure is over the time since this one

        sample = api.get(f"/sandboxes/{created['sandboxID']}/metrics").json()[0]
        envd.post("/process.Process/SendSignal", json={"process": {"pid": pid}, "signal": "SIGNAL_SIGKILL"})
        ends = [event["end"] for event in events if "end" in event]

    assert stdout == b"held\n"
    assert sample["memUsed"] > 64 << 20
    assert sample["memTotal"] == 512 << 20
    assert sample["cpuCount"] == 2
    assert 0 <= sample["cpuUsedPct"] <= 100
    assert isinstance(sample["timestampUnix"], int)
    assert [end.get("status") for end in ends] == ["signal: killed"]  # killed while holding, not ended on its own


def process_events(chunks: Iterator[bytes]) -> Iterator[dict]:
    """The events of a Connect stream of process events (`{"start": ...}`, `{"data": ...}`, `{"end": ...}`)."""
    buffer = b""
    for chunk in chunks:
        buffer += chunk
        while len(buffer) >= 5 and len(buffer) >= 5 + int.from_bytes(buffer[1:5], "big"):
            size = int.from_bytes(buffer[1:5], "big")
            message, buffer = json.loads(buffer[5 : 5 + size] or b"{}"), buffer[5 + size :]
            if "event" in message:
                yield message["event"]


@pytest.mark.parametrize(
    ("method", "path", "kwargs", "status"),
    [
        ("post", "/v2/sandboxes", {"json": {"templateID": "does-not-exist"}}, 404),
        ("get", "/sandboxes/nope", {}, 404),
        ("delete", "/sandboxes/nope", {}, 404),
        ("post", "/sandboxes/nope/timeout", {"json": {"timeout": 5}}, 404),
        ("post", "/v2/sandboxes/nope/connect", {"json": {}}, 404),
        ("post", "/v2/sandboxes", {"content": b"{not json", "headers": {"Content-Type": "application/json"}}, 400),
        ("post", "/v2/sandboxes", {"content": b"[1,2]", "headers": {"Content-Type": "application/json"}}, 400),
        ("post", "/v2/sandboxes", {"json": {"templateID": "base", "timeout": "soon"}}, 400),
        ("post", "/v2/sandboxes", {"content": b"templateID=base", "headers": {"Content-Type": "text/plain"}}, 415),
        ("post", "/v2/sandboxes", {"content": b"x" * (2 << 20), "headers": {"Content-Type": "application/json"}}, 413),
        ("get", "/no/such/route", {}, 501),
        ("put", "/v2/sandboxes", {"json": {}}, 405),
        ("get", "/v2/sandboxes?limit=0", {}, 400),
        ("get", "/v2/sandboxes?state=sleeping", {}, 400),
    ],
)
def test_bad_requests_get_json_errors(api: httpx.Client, method: str, path: str, kwargs: dict, status: int) -> None:
    response = getattr(api, method)(path, **kwargs)

    assert error_of(response)[0] == status


def test_a_wrong_api_key_gets_401_everywhere(endpoint: LocalEndpoint) -> None:
    with httpx.Client(base_url=endpoint.api_url, headers={"X-API-KEY": "e2b_wrong"}) as client:
        responses = [client.post("/v2/sandboxes", json={}), client.get("/v2/sandboxes"), client.get("/x")]

    assert [error_of(r)[0] for r in responses] == [401, 401, 401]


def test_chunked_request_bodies_are_accepted(api: httpx.Client) -> None:
    def body() -> Iterator[bytes]:
        yield b'{"templateID":'
        yield b'"base","timeout":30}'

    response = api.post("/v2/sandboxes", content=body(), headers={"Content-Type": "application/json"})

    assert response.status_code == 201
    api.created.append(response.json()["sandboxID"])  # type: ignore[attr-defined]
