"""No raw network from a sandbox, and no path from its uplink to the host: two locks, each tested alone.

The first lock is in the sandbox: no CAP_NET_RAW/CAP_NET_ADMIN (whatever `sudo` gives) and a seccomp filter
that refuses packet and raw inet sockets. The second is on the host: slirp4netns's own sockets are filtered
in the host's network namespace, so a hand-made frame (sent here by the test, as host root, in the sandbox's
network namespace: what a sandbox could do were the first lock to slip) reaches neither the host's loopback,
nor the host's own addresses, nor anything the sandbox's `denyOut` names.

Frames and connections go only to listeners this test makes: on 127.0.0.1, on the host's end of a veth pair
(198.51.100.1, a host address) and in a network namespace of the test's own (198.51.100.2, tests/netns.py).
"""

from __future__ import annotations

import json
import logging
import socket
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2b import Sandbox
from netns import TEST_NET, listener_in_own_netns

from bench.localbox import box as box_module
from bench.localbox.box import (
    ID_BASE,
    ID_COUNT,
    Box,
    IdRange,
    SubordinateIds,
    default_state_root,
    guard_uplinks,
    release_uplink,
)
from bench.localbox.network import UPLINKS, EgressRules
from bench.localbox.server import LocalServer, in_thread

RAWFRAME = Path(__file__).resolve().parents[1] / "sandboxes" / "e2b" / "python" / "rawframe.py"
NET_ADMIN, NET_RAW = 12, 13
CONNECT = textwrap.dedent("""
    import socket, sys
    for address in sys.argv[1:]:
        host, _, port = address.rpartition(":")
        try:
            socket.create_connection((host, int(port)), 3).close()
            print("reached")
        except OSError as exc:
            print(type(exc).__name__)
""")


@pytest.fixture(scope="module")
def server() -> Iterator[LocalServer]:
    local = LocalServer(pool_size=0)
    with in_thread(local):
        yield local


@pytest.fixture(scope="module")
def test_host() -> Iterator[str]:
    with listener_in_own_netns() as address:
        yield address


@pytest.fixture
def sbx(server: LocalServer) -> Iterator[Sandbox]:
    ep = server.endpoint
    sandbox = Sandbox.create(timeout=120, api_key=ep.api_key, api_url=ep.api_url, sandbox_url=ep.sandbox_url)
    try:
        yield sandbox
    finally:
        sandbox.kill()


@pytest.fixture
def host_listeners(test_host: str) -> Iterator[dict[str, socket.socket]]:
    """Listeners on the host's loopback and on one of its own non-loopback addresses (the veth's host end)."""
    listeners = {}
    for address in ("127.0.0.1", TEST_NET[0]):
        listener = socket.create_server((address, 0))
        listener.setblocking(False)
        listeners["{}:{}".format(*listener.getsockname())] = listener
    try:
        yield listeners
    finally:
        for listener in listeners.values():
            listener.close()


def box_of(server: LocalServer, sandbox: Sandbox) -> Box:
    record = server.registry.get(sandbox.sandbox_id)
    assert record is not None
    return record.box


def frames_from_namespace_of(box: Box, *targets: str) -> dict[str, Any]:
    """rawframe.py's report, run as host root in the sandbox's network namespace (CAP_NET_RAW there)."""
    assert box.holder is not None
    out = subprocess.run(
        ["nsenter", f"--net=/proc/{box.holder.pid}/ns/net", "--", sys.executable, "-I", str(RAWFRAME), *targets],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def accepted(listener: socket.socket) -> bool:
    """Whether a connection waits in the listener's queue (a completed handshake is queued at once)."""
    try:
        listener.accept()[0].close()
    except BlockingIOError:
        return False
    return True


def capability_sets(sandbox: Sandbox) -> dict[str, int]:
    out = sandbox.commands.run("sudo grep -E '^Cap(Eff|Prm|Bnd|Amb):' /proc/self/status", user="user").stdout
    return {line.split(":")[0]: int(line.split()[1], 16) for line in out.splitlines()}


def test_root_in_a_sandbox_through_sudo_holds_no_raw_or_admin_network_capability(sbx: Sandbox) -> None:
    sets = capability_sets(sbx)

    assert set(sets) == {"CapEff", "CapPrm", "CapBnd", "CapAmb"}
    assert sets["CapEff"] & 1 << 0  # sudo did make root (chown): the sets were read as root
    assert {name: value >> NET_RAW & 1 or value >> NET_ADMIN & 1 for name, value in sets.items()} == dict.fromkeys(
        sets, 0
    )


def test_root_in_a_sandbox_can_open_neither_a_packet_nor_a_raw_inet_socket(sbx: Sandbox) -> None:
    sbx.files.write("/tmp/rawframe.py", RAWFRAME.read_text())

    report = json.loads(sbx.commands.run("python3 /tmp/rawframe.py 10.0.2.2:9", user="root").stdout)

    refused = "refused: Operation not permitted"
    assert report == {"packet_socket": refused, "raw_inet_socket": refused, "seen": {}}


def test_the_seccomp_filter_alone_refuses_packet_and_raw_inet_sockets_to_host_root() -> None:
    # Host root holds CAP_NET_RAW: what is refused here is refused by the filter, not by a missing capability.
    script = textwrap.dedent("""
        import socket, sys
        sys.path.insert(0, sys.argv[1])
        import agent
        agent.install_seccomp()
        for family, kind, proto in [(17, 3, 768), (2, 3, 6), (10, 3 | 0o4000, 58), (2, 10, 0), (2, 1, 0), (2, 2, 1)]:
            try:
                socket.socket(family, kind, proto).close()
                print("opened")
            except OSError as exc:
                print(exc.strerror)
    """)
    agent_dir = str(Path(__file__).resolve().parents[1] / "bench" / "localbox")

    out = subprocess.run([sys.executable, "-I", "-c", script, agent_dir], capture_output=True, text=True, check=True)

    # packet; raw tcp; raw icmpv6 (non-blocking); inet SOCK_PACKET; then tcp, and an unprivileged ICMP socket
    # (refused by the host's ping_group_range or opened; never by the filter, which would say so the same way).
    lines = out.stdout.splitlines()
    assert lines[:5] == ["Operation not permitted"] * 4 + ["opened"]
    assert len(lines) == 6


def test_a_frame_made_in_a_sandboxs_namespace_reaches_neither_the_hosts_loopback_nor_its_own_addresses(
    server: LocalServer, sbx: Sandbox, test_host: str, host_listeners: dict[str, socket.socket]
) -> None:
    report = frames_from_namespace_of(box_of(server, sbx), "--until", test_host, *host_listeners)

    assert report["packet_socket"] == "opened"
    assert report["seen"] == {**dict.fromkeys(host_listeners, "silent"), test_host: "answered"}
    assert {address: accepted(listener) for address, listener in host_listeners.items()} == dict.fromkeys(
        host_listeners, False
    )


def test_a_connection_from_a_sandbox_reaches_no_address_of_the_host(
    sbx: Sandbox, test_host: str, host_listeners: dict[str, socket.socket]
) -> None:
    own_address = next(address for address in host_listeners if address.startswith(TEST_NET[0]))
    sbx.files.write("/tmp/connect.py", CONNECT)

    seen = sbx.commands.run(f"python3 /tmp/connect.py {own_address} {test_host}", user="user").stdout.split()

    assert seen == ["TimeoutError", "reached"]
    assert not accepted(host_listeners[own_address])


@pytest.mark.parametrize(
    "rules",
    [{"deny_out": [f"{TEST_NET[1]}/32"]}, {"deny_out": ["0.0.0.0/0"], "allow_out": ["127.0.0.0/8", f"{TEST_NET[0]}"]}],
    ids=["denied host", "allow-list naming only the host"],
)
def test_deny_out_holds_against_a_hand_made_frame_and_allow_out_never_opens_the_host(
    server: LocalServer, sbx: Sandbox, test_host: str, host_listeners: dict[str, socket.socket], rules: dict
) -> None:
    sbx.update_network(rules)  # type: ignore[arg-type]

    report = frames_from_namespace_of(box_of(server, sbx), test_host, *host_listeners)

    # No control answers here: each frame had rawframe.py's ANSWER_WITHIN_S (the old path answered in ms).
    assert report["seen"] == dict.fromkeys([test_host, *host_listeners], "silent")
    assert {address: accepted(listener) for address, listener in host_listeners.items()} == dict.fromkeys(
        host_listeners, False
    )


def cpu_quota(cgroup: Path) -> str | None:
    """The CPU quota (µs per 100 ms period) of a v2 cgroup or of a v1 cpu hierarchy's, None in another."""
    if (cgroup / "cpu.max").exists():
        return (cgroup / "cpu.max").read_text().split()[0]
    if (cgroup / "cpu.cfs_quota_us").exists():
        return (cgroup / "cpu.cfs_quota_us").read_text().strip()
    return None


def egress_chain_of(gid: int) -> bool:
    """Whether the host's table holds an egress chain for the uplink of `gid`."""
    listed = subprocess.run(["nft", "list", "chain", "inet", UPLINKS, f"egress_{gid}"], capture_output=True)
    return listed.returncode == 0


def test_an_uplink_runs_in_a_cpu_bounded_cgroup_and_leaves_no_filter_behind(server: LocalServer) -> None:
    ep = server.endpoint
    sandbox = Sandbox.create(timeout=120, api_key=ep.api_key, api_url=ep.api_url, sandbox_url=ep.sandbox_url)
    try:
        box = box_of(server, sandbox)
        assert box.uplink is not None and box.ids is not None
        gid = box.ids.base
        cgroups = Path(f"/proc/{box.uplink.process.pid}/cgroup").read_text().splitlines()
        quotas = {cpu_quota(path) for path in box.uplink.cgroup.paths} - {None}
        slirp_gid = Path(f"/proc/{box.uplink.process.pid}/status").read_text().split("Gid:")[1].split()[:4]
        chain_without_rules = egress_chain_of(gid)
        sandbox.update_network({"deny_out": ["192.0.2.0/24"]})  # type: ignore[typeddict-item]
        chain_with_rules = egress_chain_of(gid)
    finally:
        sandbox.kill()

    assert any(line.endswith(f"/{box.name}.uplink") for line in cgroups)
    assert quotas == {str(box.settings.limits.cpu_count * 100_000)}
    assert slirp_gid == [str(gid)] * 4
    assert (chain_without_rules, chain_with_rules, egress_chain_of(gid)) == (False, True, False)
    assert not any(path.exists() for path in box.uplink.cgroup.paths)


def test_a_host_without_nftables_is_told_in_one_line_and_its_uplinks_run_unguarded(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(box_module, "NFT", None)
    monkeypatch.setattr(box_module, "_uplinks_guarded", False)

    with caplog.at_level(logging.WARNING, logger="e2b-bench.localbox"):
        guarded = guard_uplinks()

    assert (guarded, box_module._uplinks_guarded) == (False, False)
    assert [record.getMessage() for record in caplog.records] == [
        "nftables ('nft') is not installed: sandboxes' uplinks are not filtered on the host, so a sandbox "
        "reaches the host's own non-loopback addresses (and egress rules cannot be set)"
    ]


GUARD_PROBE = textwrap.dedent("""
    import os, socket, subprocess, sys
    from bench.localbox.network import EgressRules, uplinks_table
    gid = 100000
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    for script in (uplinks_table([gid], ["127.0.0.53"]), EgressRules(deny_out=tuple(sys.argv[1:])).uplink_script(gid)):
        subprocess.run(["nft", "-f", "-"], input=script.encode(), check=True)
    os.setregid(gid, gid)  # an uplink's sockets: host root's uid, the sandbox's gid
    for address in (("127.0.0.53", 53), ("127.0.0.53", 54), ("127.0.0.1", 53)):
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            try:
                sock.sendto(b"query", address)
                print("sent")
            except OSError as exc:
                print(exc.strerror)
""")


@pytest.mark.parametrize(("deny", "seen"), [([], ["sent"]), (["0.0.0.0/0"], ["Operation not permitted"])])
def test_an_uplink_reaches_the_hosts_resolver_on_port_53_only_and_only_as_its_egress_rules_allow(
    deny: list[str], seen: list[str]
) -> None:
    # In a network namespace of the test's own, its resolver on its loopback: the host's filter is not touched.
    out = subprocess.run(
        ["unshare", "--net", "--", sys.executable, "-c", GUARD_PROBE, *deny],
        capture_output=True, text=True, check=True, cwd=Path(__file__).resolve().parents[1],
    )  # fmt: skip

    assert out.stdout.splitlines() == [*seen, "Operation not permitted", "Operation not permitted"]


def test_clean_up_removes_a_dead_servers_egress_chain_but_never_one_a_running_sandbox_holds_again() -> None:
    slot = 4001  # far from the slots running sandboxes take first
    gid = ID_BASE + slot * ID_COUNT
    assert guard_uplinks()
    subprocess.run(
        ["nft", "-f", "-"], input=EgressRules(deny_out=("192.0.2.0/24",)).uplink_script(gid).encode(), check=True
    )
    ids = IdRange.take(
        default_state_root() / "uid-ranges",
        SubordinateIds(own_uids=(range(gid, gid + ID_COUNT),), own_gids=(range(gid, gid + ID_COUNT),)),
    )
    try:
        release_uplink(gid)
        while_held = egress_chain_of(gid)
    finally:
        ids.release()
    release_uplink(gid)

    assert (ids.base, while_held, egress_chain_of(gid)) == (gid, True, False)


def test_the_hosts_own_loopback_answers_as_before_while_uplinks_are_filtered(server: LocalServer, sbx: Sandbox) -> None:
    """The host's filter touches only an uplink's sockets: a packet with no socket (the kernel's RST to a
    connect at a closed port) is the host's own, and a connect to a closed port on 127.0.0.1 is refused at
    once, not left to time out."""
    assert sbx.commands.run("true").exit_code == 0  # a sandbox with an uplink: the host's table is in place
    assert subprocess.run(["nft", "list", "table", "inet", UPLINKS], capture_output=True).returncode == 0
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    closed_port = probe.getsockname()[1]
    probe.close()  # bound and closed: nothing listens there

    with socket.socket() as client:
        client.settimeout(60)  # far past an answer; a drop would end here as TimeoutError
        with pytest.raises(ConnectionRefusedError):
            client.connect(("127.0.0.1", closed_port))
