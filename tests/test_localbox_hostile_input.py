"""The low findings of #25 about what a client or a sandbox may send: odd file names, malformed bodies, errors
that would name host paths, a fork bomb. Each answer is a clear one and the server goes on."""

from __future__ import annotations

import httpx
import pytest
from e2b import Sandbox

from bench.localbox.app import HostPaths
from bench.localbox.server import LocalEndpoint


def test_a_directory_holding_a_name_that_is_not_utf8_still_lists(sandbox: Sandbox) -> None:
    sandbox.commands.run("mkdir -p ~/odd && cd ~/odd && touch \"$(printf 'bad-\\377-name')\" good")

    names = sorted(entry.name for entry in sandbox.files.list("/home/user/odd"))
    paths = sorted(entry.path for entry in sandbox.files.list("/home/user/odd"))
    in_sandbox = sandbox.commands.run("ls ~/odd | wc -l").stdout

    assert names == ["bad-\ufffd-name", "good"]  # bytes that are not UTF-8 shown as U+FFFD, as a watch shows them
    assert paths == ["/home/user/odd/bad-\ufffd-name", "/home/user/odd/good"]
    assert in_sandbox == "2\n"


@pytest.mark.parametrize(
    "body",
    [b"{bad", b"[" * 200_000, b'{"templateID": "base"', b"\xff\xfe"],
    ids=["unquoted", "nested-too-deep", "truncated", "not-utf8"],
)
def test_a_malformed_json_body_is_a_400_in_e2bs_shape(endpoint: LocalEndpoint, body: bytes) -> None:
    answer = httpx.post(
        f"{endpoint.api_url}/v2/sandboxes",
        content=body,
        headers={"X-API-Key": endpoint.api_key, "Content-Type": "application/json"},
    )

    assert answer.status_code == 400
    assert answer.json()["code"] == 400 and answer.json()["message"].startswith("request body is not valid JSON")


def test_error_messages_name_sandbox_paths_never_host_paths() -> None:
    paths = HostPaths(["/tmp/e2b-bench-localbox-0", "/tmp/e2b-bench-localbox-0/server-7-1", "/root/.cache/e2b-bench"])

    scrubbed = paths.scrub(
        "cp: cannot open '/tmp/e2b-bench-localbox-0/server-7-1/boxes/abc123/upper/home/user/f': denied; "
        "mount of copy:/tmp/e2b-bench-localbox-0/server-7-1/snapshots/xyz:/root/.cache/e2b-bench/templates/base "
        "failed; the root /tmp/e2b-bench-localbox-0/server-7-1/boxes/abc123/upper is full"
    )

    assert scrubbed == (
        "cp: cannot open '/home/user/f': denied; mount of copy:[host path]:[host path] failed; the root / is full"
    )


def test_a_fork_bomb_is_bounded_to_its_own_sandbox(endpoint: LocalEndpoint) -> None:
    bomb, bystander = Sandbox.create(timeout=120), Sandbox.create(timeout=120)
    try:
        bomb.commands.run("nohup bash -c ':(){ :|:& };:' >/dev/null 2>&1 &")
        other = bystander.commands.run("echo still here").stdout
        listed = httpx.get(f"{endpoint.api_url}/v2/sandboxes", headers={"X-API-Key": endpoint.api_key})
    finally:
        bomb.kill()
        bystander.kill()

    assert other == "still here\n"
    assert listed.status_code == 200 and bystander.sandbox_id in {s["sandboxID"] for s in listed.json()}
