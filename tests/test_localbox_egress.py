"""Egress rules (`update_network`, create's `network`) enforced in each sandbox's own network namespace.

The only host a sandbox is sent to is a listener of the test's own, in a network namespace the test creates
(198.51.100.2, documentation addresses); a dropped connection shows as a connect timeout inside the sandbox.
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from e2b import Sandbox, SandboxException
from netns import TEST_NET, listener_in_own_netns

from bench.localbox.server import LocalServer, in_thread

REACH = textwrap.dedent("""
    import socket, sys
    for address in sys.argv[1:]:
        host, _, port = address.rpartition(":")
        try:
            socket.create_connection((host, int(port)), 2).close()
            print("reached")
        except OSError as exc:
            print(type(exc).__name__)
""")
LISTEN = "import socket; s = socket.create_server(('127.0.0.1', 7003)); print('up', flush=True)\nwhile True: s.accept()"
LOOPBACK = "127.0.0.1:7003"  # a listener of the sandbox's own


@pytest.fixture(scope="module")
def server() -> Iterator[LocalServer]:
    local = LocalServer(pool_size=0)
    with in_thread(local):
        yield local


@pytest.fixture(scope="module")
def test_host() -> Iterator[str]:
    with listener_in_own_netns() as address:
        yield address


def endpoint_of(server: LocalServer) -> dict[str, str]:
    ep = server.endpoint
    return {"api_key": ep.api_key, "api_url": ep.api_url, "sandbox_url": ep.sandbox_url}


def create(server: LocalServer, **opts: Any) -> Sandbox:
    sandbox = Sandbox.create(timeout=120, **endpoint_of(server), **opts)
    sandbox.files.write("/tmp/reach.py", REACH)
    sandbox.files.write("/tmp/listen.py", LISTEN)
    next(iter(sandbox.commands.run("python3 /tmp/listen.py", background=True)))  # "up": listening
    return sandbox


def reach(sandbox: Sandbox, *addresses: str) -> list[str]:
    """What became of a connection from the sandbox (as its unprivileged user) to each address."""
    return sandbox.commands.run(f"python3 /tmp/reach.py {' '.join(addresses)}", user="user").stdout.split()


def test_deny_drops_allow_wins_an_update_replaces_and_loopback_is_never_filtered(
    server: LocalServer, test_host: str
) -> None:
    updates: list[tuple[str, dict[str, list[str]] | None]] = [
        ("no rules", None),
        ("denied block", {"deny_out": ["198.51.100.0/24"]}),
        ("allowed inside a denied block", {"deny_out": ["198.51.100.0/24"], "allow_out": [f"{TEST_NET[1]}/32"]}),
        ("allow-list of another host", {"deny_out": ["0.0.0.0/0"], "allow_out": ["198.51.100.3"]}),
        ("allow-list of this host", {"deny_out": ["0.0.0.0/0"], "allow_out": [TEST_NET[1]]}),
        ("internet access off", {"allow_internet_access": False}),  # type: ignore[dict-item]
        ("rules cleared", {}),
    ]
    sandbox = create(server)
    seen = {}
    try:
        for label, update in updates:
            if update is not None:
                sandbox.update_network(update)  # type: ignore[arg-type]
            seen[label] = (reach(sandbox, test_host, LOOPBACK), sandbox.get_info().network)
    finally:
        sandbox.kill()

    assert seen == {
        "no rules": (["reached", "reached"], None),
        "denied block": (["TimeoutError", "reached"], {"allow_out": [], "deny_out": ["198.51.100.0/24"]}),
        "allowed inside a denied block": (
            ["reached", "reached"],
            {"allow_out": ["198.51.100.2/32"], "deny_out": ["198.51.100.0/24"]},
        ),
        "allow-list of another host": (
            ["TimeoutError", "reached"],
            {"allow_out": ["198.51.100.3"], "deny_out": ["0.0.0.0/0"]},
        ),
        "allow-list of this host": (["reached", "reached"], {"allow_out": ["198.51.100.2"], "deny_out": ["0.0.0.0/0"]}),
        "internet access off": (["TimeoutError", "reached"], {"allow_out": [], "deny_out": ["0.0.0.0/0"]}),
        "rules cleared": (["reached", "reached"], None),
    }


def test_create_time_rules_are_enforced_and_kept_through_a_cold_boot_and_a_fork(
    server: LocalServer, test_host: str
) -> None:
    sandbox = create(server, network={"deny_out": [TEST_NET[1]]})
    forks: list[Sandbox] = []
    try:
        created = reach(sandbox, test_host)
        info = sandbox.get_info().network
        sandbox.pause(mode="filesystem")
        resumed = Sandbox.connect(sandbox.sandbox_id, **endpoint_of(server))  # type: ignore[arg-type]
        cold_booted = reach(resumed, test_host)
        forks = [f for f in resumed.fork(count=1, timeout=60) if isinstance(f, Sandbox)]
        forked = reach(forks[0], test_host)
        fork_info = forks[0].get_info().network
    finally:
        for sbx in (sandbox, *forks):
            sbx.kill()

    assert (created, cold_booted, forked) == (["TimeoutError"], ["TimeoutError"], ["TimeoutError"])
    assert info == fork_info == {"allow_out": [], "deny_out": ["198.51.100.2"]}


@pytest.mark.parametrize(
    ("update", "message"),
    [
        (
            {"deny_out": ["0.0.0.0/0"], "allow_out": ["example.com"]},
            "501: this endpoint cannot enforce domains allowed through denied addresses ('allowOut': 'example.com')",
        ),
        (
            {"rules": {"example.com": [{"transform": {"headers": {"X-Bench": "1"}}}]}},
            "501: this endpoint cannot enforce per-domain transform rules ('rules')",
        ),
    ],
)
def test_rules_that_cannot_be_enforced_are_refused_and_the_current_ones_stay(
    server: LocalServer, test_host: str, update: dict[str, Any], message: str
) -> None:
    sandbox = create(server, network={"deny_out": [TEST_NET[1]]})
    try:
        with pytest.raises(SandboxException) as refused:
            sandbox.update_network(update)  # type: ignore[arg-type]
        still = reach(sandbox, test_host)
        info = sandbox.get_info().network
    finally:
        sandbox.kill()

    assert str(refused.value) == message
    assert still == ["TimeoutError"] and info == {"allow_out": [], "deny_out": ["198.51.100.2"]}


def test_a_create_with_rules_that_cannot_be_enforced_is_refused_and_starts_nothing(server: LocalServer) -> None:
    ep = server.endpoint
    headers = {"X-API-KEY": ep.api_key}
    body = {"templateID": "base", "network": {"allowOut": ["example.com"], "denyOut": ["0.0.0.0/0"]}}

    answer = httpx.post(f"{ep.api_url}/v2/sandboxes", json=body, headers=headers)
    listed = httpx.get(f"{ep.api_url}/v2/sandboxes", headers=headers)

    assert (answer.status_code, answer.json()["code"]) == (501, 501)
    assert answer.json()["message"] == (
        "this endpoint cannot enforce domains allowed through denied addresses ('allowOut': 'example.com')"
    )
    assert listed.json() == []
