"""Every sandbox of the embedded endpoint has a disk of its advertised size (#12, item 3): writing past it
fails with ENOSPC as on E2B, in that sandbox only, and the disk goes (mount and loop device) with it."""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import httpx
import pytest
from e2b import NotEnoughSpaceException, Sandbox
from test_localbox_serve import REPO, crash_then_serve_again, sandbox_pids, sandbox_via, serve_until_done

from bench.localbox.disk import Disks, drop_unwritten, loop_backings
from bench.localbox.server import LocalEndpoint, serving
from bench.remote.slowness import scaled

DISK_MB = 64  # small, so a test fills it in a fraction of a second
FILL = (  # dd's first line and its exit status; nothing else is written to the (maybe full) disk
    "out=$(dd if=/dev/zero of={path} bs=1M count={count} 2>&1); status=$?; "
    "printf '%s\\nstatus=%s\\n' \"${{out%%$'\\n'*}}\" $status"
)
ENOSPC_LINE = "dd: error writing '{path}': No space left on device\nstatus=1\n"


@pytest.fixture(scope="module")
def small_disks() -> Iterator[LocalEndpoint]:
    with serving(disk_size_mb=DISK_MB) as local, mock.patch.dict(os.environ, local.env()):  # restored as it was after
        yield local


@pytest.fixture
def sbx(small_disks: LocalEndpoint) -> Iterator[Sandbox]:
    sandbox = Sandbox.create(timeout=120)
    try:
        yield sandbox
    finally:
        sandbox.kill()


def fill(sandbox: Sandbox, path: str, mb: int = 2 * DISK_MB) -> str:
    return sandbox.commands.run(FILL.format(path=path, count=mb)).stdout


def disk_size(sandbox: Sandbox) -> int:
    """The size of `/` as the sandbox's own statfs reports it (what `df /` shows)."""
    blocks, block_size = sandbox.commands.run("stat -f -c '%b %S' /").stdout.split()
    return int(blocks) * int(block_size)


def loop_backing_files() -> list[str]:
    return list(loop_backings().values())


def test_a_command_writing_past_the_disk_size_gets_enospc_and_can_write_again_after_deleting(sbx: Sandbox) -> None:
    size = disk_size(sbx)

    image = Path(next(p for p in loop_backing_files() if p.endswith(f"/{sbx.sandbox_id}.disk")))

    failed = fill(sbx, "/home/user/fill")
    written = int(sbx.commands.run("sync -f /home/user/fill; stat -c %s /home/user/fill").stdout)
    on_host_full = image.stat().st_blocks * 512
    sbx.commands.run("rm /home/user/fill")
    on_host_after = image.stat().st_blocks * 512
    again = fill(sbx, "/home/user/again", 8)

    assert DISK_MB * 0.85 * 2**20 < size <= DISK_MB * 2**20  # the file system's own metadata takes the rest
    assert failed == ENOSPC_LINE.format(path="/home/user/fill")
    assert size * 0.9 < written <= size
    assert on_host_full >= written and on_host_after < 4 * 2**20  # deleted blocks go back to the host
    assert again == "8+0 records in\nstatus=0\n"


def test_an_upload_into_a_full_disk_is_refused_with_envds_507(sbx: Sandbox, small_disks: LocalEndpoint) -> None:
    fill(sbx, "/home/user/fill")
    with pytest.raises(NotEnoughSpaceException):
        sbx.files.write("/home/user/by-sdk", b"x" * 2**20)
    raw = httpx.post(
        f"{small_disks.sandbox_url}/files",
        params={"path": "/home/user/by-rest", "username": "user"},
        files={"file": ("by-rest", b"y" * 2**20)},
        headers={"E2b-Sandbox-Id": sbx.sandbox_id, "X-Access-Token": sbx._envd_access_token or ""},
    )
    sizes = sbx.commands.run("stat -c %s /home/user/by-sdk /home/user/by-rest").stdout.split()

    assert raw.status_code == 507
    assert raw.json() == {"code": 507, "message": "not enough disk space available"}  # envd.yaml's example of a 507
    assert all(int(size) < 2**20 for size in sizes)


def loop_stat(sandbox: Sandbox) -> Path:
    """The kernel's counters of the sandbox's loop device (they outlive the device's release)."""
    device = next(name for name, file in loop_backings().items() if file.endswith(f"/{sandbox.sandbox_id}.disk"))
    return Path("/sys/block") / device / "stat"


def written_bytes(sandbox: Sandbox, stat: Path | None = None) -> int:
    """What the sandbox's loop device has written to its image so far (the kernel's count, in sectors)."""
    return int((stat or loop_stat(sandbox)).read_text().split()[6]) * 512


def test_uploads_over_one_file_leave_its_old_contents_in_memory_not_written_to_the_disk(sbx: Sandbox) -> None:
    # ext4's default (auto_da_alloc) starts writing a file truncated and written again to the disk as it is
    # closed, and the next truncation waits for that write: an upload over a file paid for the last one's I/O
    data = os.urandom(8 << 20)
    sbx.files.write("/home/user/again.bin", data)
    before = written_bytes(sbx)

    for _ in range(3):
        sbx.files.write("/home/user/again.bin", data)
    after = written_bytes(sbx)
    found = sbx.commands.run("sha256sum /home/user/again.bin").stdout.split()[0]

    assert found == hashlib.sha256(data).hexdigest()
    assert after - before < 2 << 20  # none of the 8 MiB versions: each was dropped by the next truncation


def test_a_full_sandbox_leaves_another_sandbox_and_the_host_unaffected(sbx: Sandbox) -> None:
    other = Sandbox.create(timeout=60)
    try:
        host_free_before = os.statvfs("/tmp").f_bavail * os.statvfs("/tmp").f_frsize
        full = fill(sbx, "/home/user/fill")
        host_free_after = os.statvfs("/tmp").f_bavail * os.statvfs("/tmp").f_frsize
        in_other = fill(other, "/home/user/other", 16)
        other_size = disk_size(other)
    finally:
        other.kill()

    assert full == ENOSPC_LINE.format(path="/home/user/fill")
    assert in_other == "16+0 records in\nstatus=0\n"
    assert other_size == disk_size(sbx)
    assert host_free_before - host_free_after < 2 * DISK_MB * 2**20  # at most this sandbox's disk


def test_metrics_report_the_disk_as_df_in_the_sandbox_sees_it(sbx: Sandbox, small_disks: LocalEndpoint) -> None:
    sbx.commands.run("dd if=/dev/zero of=/home/user/data bs=1M count=20 && sync")
    df = sbx.commands.run("stat -f -c '%b %f %S' /").stdout.split()

    metric = sbx.get_metrics()[-1]

    detail = httpx.get(f"{small_disks.api_url}/sandboxes/{sbx.sandbox_id}", headers={"X-API-KEY": small_disks.api_key})
    blocks, free, block_size = map(int, df)
    assert metric.disk_total == blocks * block_size
    assert metric.disk_used == (blocks - free) * block_size
    assert metric.disk_used >= 20 * 2**20
    assert detail.json()["diskSizeMB"] == DISK_MB


def test_the_limit_and_the_files_survive_a_filesystem_only_pause_and_a_cold_boot(
    sbx: Sandbox, small_disks: LocalEndpoint
) -> None:
    sbx.commands.run("dd if=/dev/zero of=/home/user/kept bs=1M count=16")
    size = disk_size(sbx)
    paused = httpx.post(
        f"{small_disks.api_url}/sandboxes/{sbx.sandbox_id}/pause",
        json={"memory": False},
        headers={"X-API-KEY": small_disks.api_key},
    )
    snapshot = sbx.create_snapshot()  # from the kept (unmounted) disk
    mounted_while_paused = sbx.sandbox_id in Path("/proc/self/mountinfo").read_text()

    booted = Sandbox.connect(sbx.sandbox_id, timeout=120)
    kept = booted.commands.run("stat -c %s /home/user/kept").stdout
    full = fill(booted, "/home/user/fill")
    child = Sandbox.create(template=snapshot.snapshot_id, timeout=60)
    try:
        in_child = (child.commands.run("stat -c %s /home/user/kept").stdout, disk_size(child))
        child_full = fill(child, "/home/user/fill")
    finally:
        child.kill()

    assert paused.status_code == 204
    assert not mounted_while_paused
    assert kept == f"{16 * 2**20}\n"
    assert disk_size(booted) == size
    assert full == ENOSPC_LINE.format(path="/home/user/fill")
    assert in_child == (f"{16 * 2**20}\n", size)
    assert child_full == ENOSPC_LINE.format(path="/home/user/fill")


def test_a_fork_gets_a_disk_of_the_same_size(sbx: Sandbox) -> None:
    sbx.commands.run("echo from-source > ~/state.txt")
    forks = [f for f in sbx.fork(count=1, timeout=60) if isinstance(f, Sandbox)]
    try:
        seen = forks[0].commands.run("cat ~/state.txt").stdout
        full = fill(forks[0], "/home/user/fill")
        size = disk_size(forks[0])
    finally:
        for fork in forks:
            fork.kill()

    assert seen == "from-source\n"
    assert full == ENOSPC_LINE.format(path="/home/user/fill")
    assert size == disk_size(sbx)


def test_a_killed_sandbox_leaves_no_mount_no_loop_device_and_no_image(small_disks: LocalEndpoint) -> None:
    sandbox = Sandbox.create(timeout=60)
    sandbox.commands.run("mkdir -p ~/deep && cd ~/deep && for i in $(seq 300); do mkdir d && cd d; done")
    name = sandbox.sandbox_id
    image = next(p for p in loop_backing_files() if p.endswith(f"/{name}.disk"))

    def left() -> list[str]:
        return [
            *([f"mount of {name}"] if f"/{name} " in Path("/proc/self/mountinfo").read_text() else []),
            *[f"loop device on {b}" for b in loop_backing_files() if b in (image, f"{image} (deleted)")],
            *[str(p) for p in (Path(image), Path(image).with_suffix("")) if p.exists()],
        ]

    sandbox.kill()  # its files are removed in the background, one after another: wait (bounded) for all of them
    deadline = time.monotonic() + scaled(30)
    while left() and time.monotonic() < deadline:
        time.sleep(0.05)

    assert left() == []


def test_a_killed_sandbox_writes_none_of_its_unwritten_files_to_its_disk(small_disks: LocalEndpoint) -> None:
    # What is deleted next is not written first: neither the sandbox's exit nor its unmount writes back the
    # pages it dirtied (nor flushes the host's disk), so a create's own flush never waits behind them
    sandbox = Sandbox.create(timeout=60)
    sandbox.commands.run("head -c 24M /dev/urandom > ~/unwritten.bin")  # in memory: nothing forces it out
    stat = loop_stat(sandbox)
    before = written_bytes(sandbox, stat)

    sandbox.kill()
    deadline = time.monotonic() + scaled(30)
    while f"/{sandbox.sandbox_id}.disk" in "".join(loop_backing_files()) and time.monotonic() < deadline:
        time.sleep(0.05)
    written = written_bytes(sandbox, stat) - before

    assert f"/{sandbox.sandbox_id}.disk" not in "".join(loop_backing_files())
    assert written < 4 << 20  # not the 24 MiB file (a new sandbox on the same device writes its few blocks)


def test_a_sandboxs_syncs_never_flush_the_hosts_disk(sbx: Sandbox) -> None:
    # Its disk does not outlive a host crash: a flush of it would flush the host's whole disk, which waits
    # for all the host wrote, and every other sandbox's fsync and every create's mount would wait behind it
    stat = loop_stat(sbx)
    before = int(stat.read_text().split()[15])  # flush requests the loop device was sent

    done = sbx.commands.run("for i in 1 2 3; do echo $i > ~/synced.$i; sync; done; cat ~/synced.*")
    flushed = int(stat.read_text().split()[15]) - before

    assert done.stdout == "1\n2\n3\n"
    assert flushed == 0


def test_only_a_loop_devices_file_system_mounted_where_said_is_ever_shut_down(tmp_path: Path) -> None:
    probe = tmp_path / "still-writable"

    assert drop_unwritten(tmp_path, "/dev/loop0") is False  # the host's file system is no loop device's
    assert drop_unwritten(tmp_path, "/dev/null") is False
    assert drop_unwritten(tmp_path / "missing", "/dev/loop0") is False
    probe.write_text("ok")
    assert probe.read_text() == "ok"


def attached_under(root: Path) -> dict[str, str]:
    """Loop device name -> its backing file, for the devices backed by files under `root`."""
    return {name: file for name, file in loop_backings().items() if file.startswith(f"{root}/")}


def mount_line(target: Path) -> str:
    return next(line for line in Path("/proc/self/mountinfo").read_text().splitlines() if f" {target} " in line)


def test_a_disk_taken_from_the_spares_is_mounted_where_asked_with_no_device_attached_for_it(tmp_path: Path) -> None:
    disks = Disks.prepare(DISK_MB)
    assert disks is not None
    spares = disks.keep_spares(tmp_path, 2)
    spares.fill()
    ready = attached_under(tmp_path)
    assert sorted(Path(p).name for p in ready.values()) == [".spare-1.disk", ".spare-2.disk"]
    image, target = tmp_path / "sbx.disk", tmp_path / "sbx"
    target.mkdir()
    try:
        device = disks.new(image, target)

        now = attached_under(tmp_path)
        assert set(now) == set(ready)  # no loop device attached for this disk: a spare's, renamed
        assert now[device.removeprefix("/dev/")] == str(image)
        line = mount_line(target)
        assert f" {device} " in line and {"nosuid", "nodev", "noatime"} <= set(line.split()[5].split(","))
        # mounted at the target alone: this test's spare's mount point is gone (another worker's spares may be mounted)
        assert f" {tmp_path}/.spare-1 " not in Path("/proc/self/mountinfo").read_text()
        assert os.statvfs(target).f_blocks * os.statvfs(target).f_frsize > (DISK_MB - 8) << 20
        (target / "written").write_text("on the sandbox's disk")
        assert os.stat(target / "written").st_dev == os.stat(device).st_rdev
        assert (spares.ready, spares.wanted) == (1, 1)
    finally:
        spares.close()
        subprocess.run(["umount", str(target)], check=False)
    deadline = time.monotonic() + scaled(10)  # the kernel frees an unmounted disk's device in the background
    while attached_under(tmp_path) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert attached_under(tmp_path) == {}  # the spare left was ended: its device freed
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sbx", "sbx.disk"]


def test_with_no_spare_ready_a_disk_is_made_on_the_spot(tmp_path: Path) -> None:
    disks = Disks.prepare(DISK_MB)
    assert disks is not None
    spares = disks.keep_spares(tmp_path, 1)  # never filled
    image, target = tmp_path / "sbx.disk", tmp_path / "sbx"
    target.mkdir()
    try:
        device = disks.new(image, target)

        assert attached_under(tmp_path) == {device.removeprefix("/dev/"): str(image)}
        assert f" {device} " in mount_line(target)
        assert spares.ready == 0
    finally:
        subprocess.run(["umount", str(target)], check=False)


def test_a_sandbox_killed_mid_upload_answers_502_and_leaves_no_loop_device(small_disks: LocalEndpoint) -> None:
    sandbox = Sandbox.create(timeout=600)
    image = next(p for p in loop_backing_files() if p.endswith(f"/{sandbox.sandbox_id}.disk"))
    host, port = small_disks.sandbox_url.removeprefix("http://").split(":")
    head = (
        f"POST /files?path=/home/user/held.bin&username=user HTTP/1.1\r\nHost: {host}\r\n"
        f"E2b-Sandbox-Id: {sandbox.sandbox_id}\r\nX-Access-Token: {sandbox._envd_access_token}\r\n"
        f"Content-Type: application/octet-stream\r\nContent-Length: {32 << 20}\r\n\r\n"
    )
    uploading = socket.create_connection((host, int(port)))
    # and the rest never: the upload stays open, its first mebibytes written as they came, not at the body's end
    uploading.sendall(head.encode() + os.urandom(2 << 20))
    deadline = time.monotonic() + scaled(30)
    while sandbox.commands.run("stat -c %s /home/user/held.bin 2>/dev/null || echo 0").stdout.strip() == "0":
        assert time.monotonic() < deadline, "the upload's file was never written"
        time.sleep(0.05)

    sandbox.kill()  # the upload's file is open in the server: it must be closed for the disk to go
    uploading.settimeout(scaled(30))
    answer = uploading.recv(65536)
    uploading.close()

    def left() -> list[str]:  # the image is removed first; the kernel frees its loop device after, in the background
        return [
            *[f"loop device on {b}" for b in loop_backing_files() if b in (image, f"{image} (deleted)")],
            *([image] if Path(image).exists() else []),
        ]

    while left() and time.monotonic() < deadline + scaled(30):
        time.sleep(0.05)

    assert answer.split(b"\r\n")[0] == b"HTTP/1.1 502 Bad Gateway"  # E2B's proxy's, to a request not yet answered
    assert left() == []


def test_a_server_that_stops_leaves_no_mount_and_no_loop_device() -> None:
    with serving(disk_size_mb=DISK_MB, pool_size=0) as local:
        sandbox = sandbox_via(local.env())
        sandbox.commands.run("nohup sleep 300 >/dev/null 2>&1 &")  # still running at shutdown
        image = Path(next(p for p in loop_backing_files() if p.endswith(f"/{sandbox.sandbox_id}.disk")))
        server_dir = image.parents[1]
        mounted = [line for line in Path("/proc/self/mountinfo").read_text().splitlines() if str(server_dir) in line]

    assert sum(f"/boxes/{sandbox.sandbox_id} " in line for line in mounted) == 1  # with the spare disks
    assert str(server_dir) not in Path("/proc/self/mountinfo").read_text()
    assert not any(str(server_dir) in backing for backing in loop_backing_files())
    assert not server_dir.exists()


def test_a_crashed_servers_mounted_disks_are_removed_by_the_next_server() -> None:
    with serve_until_done() as (process, exports):
        sandbox = sandbox_via(exports)
        sandbox.commands.run("nohup sleep 300 >/dev/null 2>&1 &")
        server_dir = next(Path(f"/tmp/e2b-bench-localbox-{os.getuid()}").glob(f"server-{process.pid}-*"))
        running = sandbox_pids(server_dir)
        mounted = [line for line in Path("/proc/self/mountinfo").read_text().splitlines() if str(server_dir) in line]

        crash_then_serve_again(process, running)

    assert len(mounted) >= 1  # the sandbox's disk (and those of the pool)
    assert str(server_dir) not in Path("/proc/self/mountinfo").read_text()
    assert not any(str(server_dir) in backing for backing in loop_backing_files())
    assert not server_dir.exists()


WITHOUT_LOOP_DEVICES = """
import json, logging, os
logging.basicConfig(format="%(message)s")
from e2b import Sandbox
from bench.localbox.server import serving
with serving(disk_size_mb=64, pool_size=0) as local:
    os.environ.update(local.env())
    sandbox = Sandbox.create(timeout=60)
    written = sandbox.commands.run("dd if=/dev/zero of=/home/user/f bs=1M count=100 2>&1 | tail -1").stdout
    metric = sandbox.get_metrics()[-1]
    sandbox.kill()
print(json.dumps({"written": written, "total": metric.disk_total}))
"""


def test_a_host_without_loop_devices_says_so_once_and_its_sandboxes_still_run() -> None:
    # /dev/loop-control is /dev/null in this server's own mount namespace: no loop device can be had.
    done = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c",
         f'mount --bind /dev/null /dev/loop-control && exec "$0" -c {shlex.quote(WITHOUT_LOOP_DEVICES)}',
         sys.executable],
        cwd=REPO, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip

    result = json.loads(done.stdout.splitlines()[-1])
    warnings = [line for line in done.stderr.splitlines() if "not size-limited" in line]
    assert len(warnings) == 1, done.stderr
    assert result["written"].startswith("104857600 bytes")  # past the advertised 64 MiB: nothing enforces it
    assert result["total"] == 64 * 2**20  # as advertised (its use is counted by a walk of the upper layer)
