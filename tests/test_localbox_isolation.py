"""Sandboxes are isolated from the host and from each other; bad envd input never crashes the server."""

from __future__ import annotations

import os
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from e2b import Sandbox
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from run_cli import e2b_bench, only_run_dir

from bench.localbox.server import LocalEndpoint
from bench.remote.slowness import scaled
from bench.results import read_run


def host_pids_of(sandbox: Sandbox) -> set[int]:
    """Host pids of every process in the sandbox's pid namespace (found through its marker env var)."""
    marker = f"E2B_BENCH_PROBE={sandbox.sandbox_id}".encode()
    found = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if marker in Path(f"/proc/{entry}/environ").read_bytes():
                    found.add(int(entry))
            except OSError:
                continue
    return found


def test_root_in_a_sandbox_cannot_reach_or_change_the_host(sandbox: Sandbox) -> None:
    marker = f"/tmp/e2b-bench-escape-{uuid.uuid4().hex}"
    script = (
        f"echo x > {marker}; "
        "ls /work /root/.cache 2>&1 | head -2; "
        "mount -t tmpfs none /mnt 2>&1 | head -1; "
        "mknod /tmp/disk b 8 0 2>&1 | head -1; "
        "ls -la /proc/1/root/ | grep -c work; "
        "cat /proc/1/mounts | grep -c ' /work' || true"
    )

    result = sandbox.commands.run(script, user="root")

    assert not Path(marker).exists()
    lines = result.stdout.splitlines()
    assert "No such file or directory" in lines[0]
    assert any("permission denied" in line.lower() for line in lines[2:4])
    assert any("Operation not permitted" in line for line in lines[2:4])
    assert lines[-2:] == ["0", "0"]


def test_the_servers_state_directory_is_not_visible(sandbox: Sandbox, endpoint: LocalEndpoint) -> None:
    result = sandbox.commands.run("find / -xdev -name 'server-*' -path '*e2b-bench*' 2>/dev/null | wc -l", user="root")

    assert result.stdout == "0\n"


def test_a_sandbox_reads_its_own_cgroup_limits_read_only_and_no_others_cgroups(sandbox: Sandbox) -> None:
    # fidelity: field table and second-path checks (what get_info reports is what the sandbox can read)
    script = (
        "cat /proc/self/cgroup | cut -d: -f3 | sort -u; "
        "cat /sys/fs/cgroup/memory.max /sys/fs/cgroup/memory/memory.limit_in_bytes 2>/dev/null; "
        "ls /sys/fs/cgroup /sys/fs/cgroup/memory 2>/dev/null | grep -c -- '-' || true; "
        "f=/sys/fs/cgroup/cpu/cpu.cfs_quota_us; [ -e $f ] || f=/sys/fs/cgroup/cpu.max; "
        "(echo 1 > $f) 2>&1 | grep -c 'Read-only'"
    )

    lines = sandbox.commands.run(script, user="root").stdout.split()

    # Its cgroups are the root of its view; the limit is the 512 MiB get_info reports; no other sandbox's cgroup
    # (named like the server's, with dashes) is listed; writing a limit is refused by the read-only mount.
    assert lines == ["/", str(512 << 20), "0", "1"]


def test_two_sandboxes_see_neither_files_nor_processes_of_each_other(endpoint: LocalEndpoint) -> None:
    first, second = Sandbox.create(timeout=60), Sandbox.create(timeout=60)
    try:
        first.files.write("/tmp/only-in-first", "1")
        first.commands.run("sleep 300 >/dev/null 2>&1 &")

        files = second.commands.run("ls /tmp")
        processes = second.commands.run("ps -eo comm --no-headers")
        hostnames = (first.commands.run("hostname").stdout, second.commands.run("hostname").stdout)
    finally:
        first.kill()
        second.kill()

    assert "only-in-first" not in files.stdout
    assert "sleep" not in processes.stdout
    assert hostnames == (f"{first.sandbox_id}\n", f"{second.sandbox_id}\n")


def test_kill_leaves_no_process_behind(endpoint: LocalEndpoint) -> None:
    sbx = Sandbox.create(timeout=60, envs={"E2B_BENCH_PROBE": "placeholder"})
    sbx_env = {"E2B_BENCH_PROBE": sbx.sandbox_id}
    sbx.commands.run("nohup sleep 300 >/dev/null 2>&1 &", envs=sbx_env)
    sbx.commands.run("setsid bash -c 'sleep 300 & sleep 300' >/dev/null 2>&1 &", envs=sbx_env)
    sbx.commands.run("sleep 300 >/dev/null 2>&1 &", envs=sbx_env, user="root")
    before = host_pids_of(sbx)
    deadline = time.monotonic() + scaled(5)
    while len(before) < 4 and time.monotonic() < deadline:  # the backgrounded ones start on their own time
        time.sleep(0.05)
        before = host_pids_of(sbx)

    sbx.kill()

    assert len(before) >= 4
    assert host_pids_of(sbx) == set()


def test_internet_off_leaves_only_loopback(endpoint: LocalEndpoint) -> None:
    sbx = Sandbox.create(timeout=60, allow_internet_access=False)
    try:
        links = sbx.commands.run("ip -o link show | awk -F': ' '{print $2}'")
        up = sbx.commands.run("python3 -c \"import socket; s=socket.socket(); s.bind(('127.0.0.1', 0)); print('ok')\"")
    finally:
        sbx.kill()

    assert links.stdout == "lo\n"
    assert up.stdout == "ok\n"


def test_root_can_add_a_user_and_run_as_it_and_user_has_passwordless_sudo(sandbox: Sandbox) -> None:
    sandbox.commands.run("useradd -m -s /bin/bash worker", user="root")

    as_worker = sandbox.commands.run("whoami; echo $HOME", user="worker")
    sudo = sandbox.commands.run("sudo -n whoami")

    assert as_worker.stdout == "worker\n/home/worker\n"
    assert sudo.stdout == "root\n"


def test_twenty_sandboxes_times_twenty_commands_lose_and_mix_nothing(endpoint: LocalEndpoint) -> None:
    def one(n: int) -> list[str]:
        sbx = Sandbox.create(timeout=120)
        try:
            return [sbx.commands.run(f"echo sandbox-{n}-command-{i}").stdout for i in range(20)]
        finally:
            sbx.kill()

    with ThreadPoolExecutor(max_workers=20) as pool:
        outputs = list(pool.map(one, range(20)))

    assert outputs == [[f"sandbox-{n}-command-{i}\n" for i in range(20)] for n in range(20)]


ENVD_BAD_INPUTS = [
    ("/process.Process/List", b"{not json", "application/json", 400, "invalid_argument"),
    ("/process.Process/Nope", b"{}", "application/json", 404, "unimplemented"),
    ("/process.Process/List", b"{}", "text/plain", 415, "invalid_argument"),
    ("/filesystem.Filesystem/Stat", b'{"path": 5}', "application/json", 400, "invalid_argument"),
]


@pytest.mark.parametrize(("path", "body", "content_type", "status", "code"), ENVD_BAD_INPUTS)
def test_malformed_envd_requests_get_connect_json_errors(
    sandbox: Sandbox, endpoint: LocalEndpoint, path: str, body: bytes, content_type: str, status: int, code: str
) -> None:
    headers = {
        "E2b-Sandbox-Id": sandbox.sandbox_id,
        "X-Access-Token": sandbox._envd_access_token,
        "Content-Type": content_type,
    }

    response = httpx.post(f"{endpoint.sandbox_url}{path}", content=body, headers=headers, timeout=10)

    assert response.status_code == status
    assert response.json()["code"] == code


def test_every_refused_envd_call_gets_the_same_401(endpoint: LocalEndpoint) -> None:
    sbx = Sandbox.create(timeout=60)
    token = sbx._envd_access_token
    sandbox_id = sbx.sandbox_id
    url = endpoint.sandbox_url
    stat = ("/filesystem.Filesystem/Stat", b'{"path": "/tmp"}')

    def attempt(headers: dict[str, str]) -> tuple[int, str]:
        response = httpx.post(
            url + stat[0], content=stat[1], headers={"Content-Type": "application/json", **headers}, timeout=10
        )
        return response.status_code, response.text

    missing = attempt({"E2b-Sandbox-Id": sandbox_id})
    wrong = attempt({"E2b-Sandbox-Id": sandbox_id, "X-Access-Token": "x" * 43})
    other = attempt({"E2b-Sandbox-Id": "unknown", "X-Access-Token": token})
    good = attempt({"E2b-Sandbox-Id": sandbox_id, "X-Access-Token": token})
    sbx.kill()
    killed = attempt({"E2b-Sandbox-Id": sandbox_id, "X-Access-Token": token})
    files = httpx.get(f"{url}/files", params={"path": "/tmp"}, headers={"E2b-Sandbox-Id": sandbox_id})

    assert good[0] == 200
    assert missing == wrong == other == killed
    assert missing[0] == 401
    assert files.status_code == 401 and files.json()["code"] == 401


def test_health_answers_204_then_502_after_kill(endpoint: LocalEndpoint) -> None:
    sbx = Sandbox.create(timeout=60)

    alive = sbx.is_running()
    sbx.kill()

    assert (alive, sbx.is_running()) == (True, False)


NAME = st.text(
    alphabet=st.characters(blacklist_categories=("Cs", "Cc"), blacklist_characters="/\0"), min_size=1, max_size=40
).filter(lambda n: n not in (".", "..") and len(n.encode()) <= 200)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(parts=st.lists(NAME, min_size=1, max_size=4), content=st.binary(max_size=4096))
def test_any_file_name_and_content_round_trips(sandbox: Sandbox, parts: list[str], content: bytes) -> None:
    path = "/home/user/h/" + "/".join(parts)

    sandbox.files.write(path, content)
    read = sandbox.files.read(path, format="bytes")
    info = sandbox.files.get_info(path)
    listed = [e.name for e in sandbox.files.list(path.rsplit("/", 1)[0])]

    assert read == content
    assert (info.name, info.path, info.size) == (parts[-1], path, len(content))
    assert parts[-1] in listed
    sandbox.files.remove("/home/user/h")


def test_an_envd_request_without_a_sandbox_id_reaches_only_the_sandbox_its_token_names(endpoint: LocalEndpoint) -> None:
    # An old SDK's `Sandbox.connect` (e2b 2.20, crewai-tools' pin) sends no E2b-Sandbox-Id behind one sandbox URL.
    first, second = Sandbox.create(timeout=60), Sandbox.create(timeout=60)
    try:
        for sbx in (first, second):
            sbx.files.write("/tmp/who", sbx.sandbox_id)
        url = endpoint.sandbox_url

        def read(token: str) -> httpx.Response:
            return httpx.get(f"{url}/files", params={"path": "/tmp/who"}, headers={"X-Access-Token": token}, timeout=10)

        def stat(token: str) -> httpx.Response:
            headers = {"X-Access-Token": token, "Content-Type": "application/json"}
            body = b'{"path": "/tmp/who"}'
            return httpx.post(f"{url}/filesystem.Filesystem/Stat", content=body, headers=headers, timeout=10)

        reads = [read(sbx._envd_access_token).text for sbx in (first, second)]
        stats = [stat(sbx._envd_access_token) for sbx in (first, second)]
        unknown = [read("x" * 43), stat("x" * 43)]
    finally:
        first.kill()
        second.kill()

    assert reads == [first.sandbox_id, second.sandbox_id]
    sizes = [str(len(sbx.sandbox_id)) for sbx in (first, second)]  # int64 is a string in Connect's JSON
    assert [(r.status_code, r.json()["entry"]["size"]) for r in stats] == [(200, size) for size in sizes]
    assert [r.status_code for r in unknown] == [401, 401]


# --- the isolation suite's probes of #25 (is13..is16), run as a user runs them -----------------------------

SERVER_PROBES = (
    "is13_device_download_does_not_stall_others",
    "is14_port_proxy_hides_credentials",
    "is15_traffic_token_enforced",
    "is16_hard_linked_tree_snapshots",
)


def passing(cases: tuple[str, ...], results: Path) -> dict[str, dict[str, Any]]:
    """The details of these isolation cases, run (the Python runner) and all passing."""
    done = e2b_bench("run", "isolation", "--runner", "py-e2b-2.63.0", "-k", " or ".join(cases),
                     "--results-dir", str(results), "--no-report")  # fmt: skip

    assert done.returncode == 0, done.stdout + done.stderr
    ran = {c.case: c for c in read_run(only_run_dir(results)).cases if c.suite == "isolation"}
    assert sorted(ran) == sorted(cases)
    assert {c.outcome for c in ran.values()} == {"pass"}
    return {name: case.details for name, case in ran.items()}


def test_the_isolation_suites_server_probes_pass_on_the_embedded_endpoint_and_say_what_they_saw(
    tmp_path: Path,
) -> None:
    details = passing(SERVER_PROBES, tmp_path)

    assert details["is13_device_download_does_not_stall_others"]["ping_status"] == 200
    assert "is not a regular file" in details["is13_device_download_does_not_stall_others"]["download"]["error"]
    seen = details["is14_port_proxy_hides_credentials"]["headers_seen"]
    assert "x-e2b-bench-probe" in seen and not {"x-api-key", "authorization", "x-access-token"} & set(seen)
    assert details["is15_traffic_token_enforced"]["statuses"] == {"none": 403, "wrong": 403, "valid": 200}
    linked = details["is16_hard_linked_tree_snapshots"]["seen"]
    assert linked[0] == linked[1] and linked[0].startswith("2 ") and linked[2] == "linked"


# --- the isolation suite's probes of #44 (is17..is23) -----------------------------------------------------

BOUND_PROBES = (
    "is17_unread_output_waits_in_its_pipe",
    "is18_pid1_command_line_names_no_host_path",
    "is19_fifo_at_etc_passwd_hangs_no_call",
    "is20_deep_tree_snapshots_or_is_refused",
    "is21_unpolled_watchers_stall_no_other_client",
    "is22_per_user_kernel_limits_are_per_sandbox",
    "is23_fork_bomb_keeps_another_sandbox_answering",
)


def test_the_isolation_suites_bound_probes_pass_on_the_embedded_endpoint_and_say_what_they_saw(
    tmp_path: Path,
) -> None:
    details = passing(BOUND_PROBES, tmp_path)

    assert details["is17_unread_output_waits_in_its_pipe"]["writer"].startswith("stalled wchar: ")
    assert details["is18_pid1_command_line_names_no_host_path"]["cmdline"] == ["e2b-bench-agent"]
    fifo = details["is19_fifo_at_etc_passwd_hangs_no_call"]
    assert "not a regular file" in fifo["answer"] and (fifo["other"], fifo["killed"]) == ("ran", True)
    assert details["is20_deep_tree_snapshots_or_is_refused"]["refusal"].startswith("400: ")
    polls = details["is21_unpolled_watchers_stall_no_other_client"]["polls"]
    assert len(polls) == 5 and all(p.isdigit() or "overflow" in p for p in polls), polls
    queues, signals, _ = map(int, details["is22_per_user_kernel_limits_are_per_sandbox"]["held"].split())
    assert queues >= 1 and signals >= 1000
    bomb = details["is23_fork_bomb_keeps_another_sandbox_answering"]
    assert bomb["killed"] is True and bomb["answers"] >= 8, bomb  # the bombed sandbox outlived its bomb
