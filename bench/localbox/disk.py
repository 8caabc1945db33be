"""A disk of its own for every sandbox: an ext4 file system of the sandbox's disk size, on a sparse image
file attached through a loop device and mounted at the sandbox's box directory, which holds the overlay's
upper and work directories.

A sandbox that fills it gets what a process gets on E2B, whose sandboxes are VMs with a root disk of the
template's size: ENOSPC ("No space left on device") from its own file system, `df /` showing that size,
and nothing outside it affected. (Quotas on one shared file system would cost less, but this kernel, like
many, is built without XFS and ext4 quota support, and btrfs qgroups answer EDQUOT.)

Every image is a copy of one empty file system made once per server (mkfs runs once: copying its ~1 MiB
of written blocks into a sparse file costs far less than an mkfs per sandbox). Loop devices are attached
with autoclear, so unmounting a disk is all it takes to free its device; a powered-off sandbox keeps its
image unmounted (no device held).

A few empty disks are kept attached and mounted ahead of creates (`Spares`): attaching one waits on the
host's disk (the kernel syncs a loop device's image as it is configured, which flushes the host's disk, and
the mount reads the new file system through the device), which a busy host's disk stretches to seconds. A
create takes a spare in about a millisecond: its mount bound to the sandbox's box directory, its image
renamed to the sandbox's.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import errno
import fcntl
import logging
import os
import shutil
import struct
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

from ..remote.slowness import scaled

log = logging.getLogger("e2b-bench.localbox")

libc = ctypes.CDLL(None, use_errno=True)
libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOATIME, MS_BIND = 1, 2, 4, 1024, 4096
MNT_DETACH = 2
LOOP_CTL_GET_FREE, LOOP_CONFIGURE = 0x4C82, 0x4C0A
LO_FLAGS_READ_ONLY, LO_FLAGS_AUTOCLEAR, LO_FLAGS_DIRECT_IO = 1, 4, 16
# The file system's shutdown (ext4, xfs, f2fs): every later read and write fails; NOLOGFLUSH writes nothing more.
FS_IOC_SHUTDOWN, FS_SHUTDOWN_FLAGS_NOLOGFLUSH = 0x8004587D, 2
# struct loop_config: fd, block_size, struct loop_info64 (device, inode, rdevice, offset, sizelimit, number,
# encrypt_type, encrypt_key_size, flags, file_name[64], crypt_name[64], encrypt_key[32], init[2]), reserved[8]
LOOP_CONFIG = struct.Struct("=II QQQQQ IIII 64s64s32s 2Q 8Q")
RELEASE_WAIT_S = 10.0  # at most (on a quiet host), for the kernel to free a disk's loop device after its unmount
LOOP_ATTEMPTS = 64  # another process may take the free device between asking for it and configuring it
MKFS = shutil.which("mkfs.ext4", path=f"{os.environ.get('PATH', '')}:/usr/sbin:/sbin")
# No journal (a sandbox's disk does not outlive a host crash), no reserved blocks (the sandbox's root and
# users share the whole size), inode tables left unwritten (a sparse image reads zeros there anyway).
MKFS_OPTIONS = ("-q", "-F", "-m", "0", "-O", "^has_journal", "-E", "lazy_itable_init=1,nodiscard,root_owner=0:0")
# What a sandbox deletes is given back to the host (discard). No write-back forced by a close after a truncation
# (ext4's auto_da_alloc, a guard for programs that replace files without fsync against a crash this disk does
# not outlive): with it an upload over a file sent the file to the disk as it closed, and the next upload's
# truncation waited for that write; without it the old contents are dropped from memory unwritten. No cache
# flushes (nobarrier), for the same reason: each flush of a sandbox's disk is a flush of the host's whole disk
# (the loop device syncs its image), which waits for everything the host has written, so a sandbox calling
# sync in a loop would stall every other sandbox's fsync and every create's mount, which flushed twice.
MOUNT_OPTIONS = b"noinit_itable,discard,noauto_da_alloc,nobarrier"


class DiskError(OSError):
    """A sandbox's disk could not be made, attached or mounted."""


@dataclass(frozen=True)
class Extent:
    offset: int
    data: bytes


class Disks:
    """The sandbox disks of one server, all of `size_mb`: made from one empty file system kept in memory."""

    def __init__(self, size_mb: int, extents: list[Extent]) -> None:
        self.size_mb = size_mb
        self._extents = extents
        self.spares: Spares | None = None  # empty disks mounted ahead of creates (`keep_spares`)

    def keep_spares(self, directory: Path, count: int) -> Spares:
        """From now on keep `count` empty disks mounted in `directory` for `new` to take (`Spares.fill`)."""
        self.spares = Spares(self, directory, count)
        return self.spares

    def new(self, image: Path, target: Path) -> str:
        """An empty disk mounted at `target`, its image at `image`: a spare if one is ready, else made now.
        Returns its loop device."""
        if self.spares is not None:
            device = self.spares.take(image, target)
            if device is not None:
                return device
        self.create(image)
        return self.mount(image, target)

    @classmethod
    def prepare(cls, size_mb: int) -> Disks | None:
        """The server's disks, or None (said once in the log) when this host cannot make them: the sandboxes
        then write to the state directory's file system, with no size limit."""
        try:
            disks = cls(size_mb, _empty_file_system(size_mb))
            with tempfile.TemporaryDirectory(prefix="e2b-bench-disk-") as scratch:  # one disk, end to end
                probe = Path(scratch) / "probe.img"
                disks.create(probe)
                with disks.reading(probe, Path(scratch)):
                    pass
            return disks
        except (OSError, subprocess.SubprocessError) as exc:
            log.warning(
                "e2b-bench: sandbox disks are not size-limited on this host (%s); sandboxes write to the "
                "server's state directory with no limit",
                exc,
            )
            return None

    def create(self, image: Path) -> None:
        """A new, empty disk image (a sparse file: it costs what the sandbox writes)."""
        fd = os.open(image, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            os.ftruncate(fd, self.size_mb << 20)
            for extent in self._extents:
                os.pwrite(fd, extent.data, extent.offset)
        except BaseException:
            os.close(fd)
            image.unlink()
            raise
        os.close(fd)

    def mount(self, image: Path, target: Path, read_only: bool = False) -> str:
        """Attach `image` to a free loop device and mount its file system at `target`; returns the device."""
        backing = os.open(image, (os.O_RDONLY if read_only else os.O_RDWR) | os.O_CLOEXEC)
        try:
            device, loop_fd = _attach(backing, read_only)
        finally:
            os.close(backing)
        try:
            flags = MS_NOSUID | MS_NODEV | MS_NOATIME | (MS_RDONLY if read_only else 0)
            if libc.mount(device.encode(), bytes(target), b"ext4", flags, MOUNT_OPTIONS) != 0:
                err = ctypes.get_errno()
                raise DiskError(err, f"mounting the sandbox's disk {image.name}: {os.strerror(err)}")
        finally:
            os.close(loop_fd)  # autoclear: the device is freed when its file system is unmounted
        return device

    @contextlib.contextmanager
    def reading(self, image: Path, under: Path) -> Iterator[Path]:
        """The file system of an unmounted image, mounted read-only in a directory of its own under `under`."""
        target = Path(tempfile.mkdtemp(prefix=".reading-", dir=under))
        try:
            self.mount(image, target, read_only=True)
            try:
                yield target
            finally:
                unmount(target)
        finally:
            target.rmdir()


@dataclass(frozen=True)
class Spare:
    root: Path  # where it is mounted until taken
    image: Path
    device: str


class Spares:
    """Empty disks attached and mounted ahead of creates, in `directory` (hidden names no sandbox id takes), so
    that a create does not wait on the host's disk (see the module's doc). `fill` makes them, one thread at a
    time; `take` gives one to a create; `close` ends them."""

    def __init__(self, disks: Disks, directory: Path, count: int) -> None:
        self.disks = disks
        self.directory = directory
        self.count = count
        self._ready: list[Spare] = []
        self._made = 0
        self._lock = threading.Lock()
        self._closed = False

    @property
    def wanted(self) -> int:
        """How many more spares `fill` would make now."""
        with self._lock:
            return 0 if self._closed else max(self.count - len(self._ready), 0)

    @property
    def ready(self) -> int:
        with self._lock:
            return len(self._ready)

    def resize(self, count: int) -> list[Spare]:
        """Keep `count` from now on; returns the ready spares beyond it, for the caller to end (`end_spares`)."""
        with self._lock:
            self.count = max(count, 0)
            extra, self._ready = self._ready[self.count :], self._ready[: self.count]
        return extra

    def fill(self) -> None:
        """Make spares until `count` are ready (blocking: for a thread of its own). A spare that cannot be made
        raises, and creates then make their own disks as they did without spares."""
        while self.wanted > 0:
            with self._lock:
                self._made += 1
                name = f".spare-{self._made}"
            root, image = self.directory / name, self.directory / f"{name}.disk"
            root.mkdir(mode=0o700)
            try:
                self.disks.create(image)
                try:
                    device = self.disks.mount(image, root)
                except BaseException:
                    image.unlink(missing_ok=True)
                    raise
            except BaseException:
                root.rmdir()
                raise
            spare = Spare(root, image, device)
            with self._lock:
                if not self._closed:
                    self._ready.append(spare)
                    continue
            end_spares([spare])  # closed meanwhile

    def take(self, image: Path, target: Path) -> str | None:
        """Give a ready spare to a create: mounted at `target` (an empty directory), its image renamed to
        `image`; returns its loop device, or None when none is ready (nothing changed then)."""
        with self._lock:
            if not self._ready:
                return None
            spare = self._ready.pop(0)
        try:
            os.rename(spare.image, image)
        except BaseException:
            end_spares([spare])
            raise
        if libc.mount(bytes(spare.root), bytes(target), None, MS_BIND, None) != 0:  # its flags come with it
            err = ctypes.get_errno()
            end_spares([replace(spare, image=image)])  # renamed already
            raise DiskError(err, f"mounting a sandbox's disk at {target}: {os.strerror(err)}")
        libc.umount2(bytes(spare.root), MNT_DETACH)  # the disk stays mounted at target alone
        spare.root.rmdir()
        return spare.device

    def close(self) -> None:
        """End every ready spare; `fill` makes no more (one it is making is ended as it is done)."""
        with self._lock:
            self._closed = True
            ready, self._ready = self._ready, []
        end_spares(ready)


def end_spares(spares: list[Spare]) -> None:
    """Unmount spares nobody took and remove their images and mount points, then wait (bounded, blocking: for a
    thread) until their devices have let go of the images, so a server that stopped holds none of them."""
    letting_go = []
    for spare in spares:
        drop_unwritten(spare.root, spare.device)  # its image goes next: nothing of it is written back
        with contextlib.suppress(OSError):
            if (loop := unmount(spare.root, wait=False)) is not None:
                letting_go.append((loop, spare.root))
        spare.image.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            spare.root.rmdir()
    _wait_freed(letting_go)


def drop_unwritten(target: Path, device: str) -> bool:
    """Shut the file system of loop device `device`, mounted at `target`, down without writing what it has
    not written yet: for a disk deleted next. Its last process's exit and its unmount would otherwise write
    back every page the sandbox dirtied (a fork's copy, a download's file) through the loop device and flush
    the host's disk, only for the image to be deleted; meanwhile every create's own flush of its new image
    waits behind that. False, and nothing changed, unless what is open at `target` is that device's file
    system (never the host's own) and it has such a shutdown."""
    try:
        fd = os.open(target, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        if not device.startswith("/dev/loop") or os.fstat(fd).st_dev != os.stat(device).st_rdev:
            return False
        fcntl.ioctl(fd, FS_IOC_SHUTDOWN, struct.pack("I", FS_SHUTDOWN_FLAGS_NOLOGFLUSH))
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def unmount(target: Path, wait: bool = True) -> tuple[str, str] | None:
    """Unmount a disk and wait (bounded) until its loop device has let go of the image: the kernel releases
    the file system when its last user is gone (the sandbox's mount namespace, torn down as its last
    process exits) and then frees the device in the background, a few milliseconds after the unmount
    returns, later on a busy host. Still in use somewhere, the disk is detached and goes when that ends.
    With `wait=False`, returns the (device, backing file) still to be let go, for `released` to await
    without holding a thread."""
    loop = _loop_of(target)
    if libc.umount2(bytes(target), 0) != 0:
        err = ctypes.get_errno()
        if err == errno.EINVAL:  # not a mount point (any more)
            return None
        if err != errno.EBUSY:
            raise DiskError(err, f"unmounting {target}: {os.strerror(err)}")
        libc.umount2(bytes(target), MNT_DETACH)
    if not wait or loop is None:
        return loop
    _wait_freed([(loop, target)])
    return None


def _wait_freed(loops: list[tuple[tuple[str, str], Path]]) -> None:
    """Wait (bounded, blocking) until each (loop device, backing file) unmounted from its target has let go."""
    deadline, pause = time.monotonic() + scaled(RELEASE_WAIT_S), 0.001
    while not all(_freed(*loop) for loop, _ in loops) and time.monotonic() < deadline:
        time.sleep(pause)
        pause = min(pause * 2, 0.05)
    for loop, target in loops:
        _warn_unless_freed(loop, target)


async def released(loop: tuple[str, str], target: Path) -> None:
    """Wait (bounded, on the event loop) until loop device `loop` has let go of its image after `unmount`."""
    deadline, pause = time.monotonic() + scaled(RELEASE_WAIT_S), 0.001
    while not _freed(*loop) and time.monotonic() < deadline:
        await asyncio.sleep(pause)
        pause = min(pause * 2, 0.05)
    _warn_unless_freed(loop, target)


def _warn_unless_freed(loop: tuple[str, str], target: Path) -> None:
    if not _freed(*loop):
        log.warning(
            "e2b-bench: the disk unmounted from %s still holds %s after %.0f s; the kernel frees it when its "
            "last user ends",
            target,
            loop[0],
            scaled(RELEASE_WAIT_S),
        )


def _loop_of(target: Path) -> tuple[str, str] | None:
    """(loop device name, its backing file) of the disk mounted at `target`, if a loop device backs it."""
    source = None
    for point, mounted in _mount_table():
        if point == str(target):
            source = mounted  # the topmost mount there is the last one listed
    if source is None or not source.startswith("/dev/loop"):
        return None
    name = source.removeprefix("/dev/")
    try:
        return name, Path(f"/sys/block/{name}/loop/backing_file").read_text().strip()
    except OSError:
        return None


def _freed(name: str, backing: str) -> bool:
    """Whether loop device `name` no longer names `backing` (it is free, or bound anew)."""
    try:
        now = Path(f"/sys/block/{name}/loop/backing_file").read_text().strip()
    except OSError:  # no backing file: the device is free
        return True
    return not now.startswith(backing)


def loop_backings() -> dict[str, str]:
    """Each attached loop device's name -> the file backing it. A device released between the listing and the
    read (by another sandbox's teardown, or another server's) is left out."""
    found = {}
    for entry in Path("/sys/block").glob("loop*/loop/backing_file"):
        with contextlib.suppress(OSError):
            found[entry.parts[3]] = entry.read_text().strip()
    return found


def mounts_under(root: Path) -> list[Path]:
    """Mount points at or under `root` in this mount namespace, deepest first."""
    prefix = str(root).rstrip("/")
    found = [Path(point) for point, _ in _mount_table() if point == prefix or point.startswith(prefix + "/")]
    return sorted(found, key=lambda p: len(p.parts), reverse=True)


def unmount_under(root: Path) -> list[str]:
    """Unmount everything at or under `root` (a dead server's disks); returns what could not be."""
    left = []
    for point in mounts_under(root):
        try:
            unmount(point)
        except OSError:
            left.append(str(point))
    return left


def _mount_table() -> Iterator[tuple[str, str]]:
    """(mount point, mount source) of every mount in this mount namespace, in /proc/self/mountinfo's order."""
    with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as table:
        for line in table:
            fields, _, tail = line.partition(" - ")
            yield _unescape(fields.split(" ", 5)[4]), tail.split(" ", 2)[1]


def _unescape(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash as octal escapes."""
    for code in ("\\040", "\\011", "\\012", "\\134"):
        field = field.replace(code, chr(int(code[1:], 8)))
    return field


def _attach(backing: int, read_only: bool) -> tuple[str, int]:
    """A loop device bound to `backing` (autoclear, direct I/O): its path and an open descriptor of it."""
    flags = LO_FLAGS_AUTOCLEAR | LO_FLAGS_DIRECT_IO | (LO_FLAGS_READ_ONLY if read_only else 0)
    config = LOOP_CONFIG.pack(backing, 0, 0, 0, 0, 0, 0, 0, 0, 0, flags, b"", b"", b"", 0, 0, *([0] * 8))
    control = os.open("/dev/loop-control", os.O_RDWR | os.O_CLOEXEC)
    try:
        for _ in range(LOOP_ATTEMPTS):
            try:
                number = fcntl.ioctl(control, LOOP_CTL_GET_FREE)
            except OSError as exc:
                raise DiskError(exc.errno, f"no free loop device: {exc.strerror}") from exc
            device = f"/dev/loop{number}"
            loop_fd = os.open(device, os.O_RDWR | os.O_CLOEXEC)
            try:
                fcntl.ioctl(loop_fd, LOOP_CONFIGURE, config)
            except OSError as exc:
                os.close(loop_fd)
                if exc.errno == errno.EBUSY:  # taken by someone else meanwhile: ask for another
                    continue
                raise DiskError(exc.errno, f"attaching a loop device: {exc.strerror}") from exc
            return device, loop_fd
    finally:
        os.close(control)
    raise DiskError(errno.EBUSY, "no loop device stayed free long enough to be attached")


def _empty_file_system(size_mb: int) -> list[Extent]:
    """The written blocks of a freshly made, empty ext4 of `size_mb` (the rest of it reads as zeros)."""
    if os.geteuid() != 0 or not os.path.exists("/dev/loop-control"):
        raise DiskError(errno.EPERM, "loop devices need root and /dev/loop-control")
    if MKFS is None:
        raise DiskError(errno.ENOENT, "mkfs.ext4 (e2fsprogs) is not installed")
    if "ext4" not in Path("/proc/filesystems").read_text():
        raise DiskError(errno.ENODEV, "this kernel has no ext4")
    with tempfile.TemporaryDirectory(prefix="e2b-bench-disk-") as scratch:
        image = Path(scratch) / "empty.img"
        with open(image, "wb") as f:
            f.truncate(size_mb << 20)
        done = subprocess.run([MKFS, *MKFS_OPTIONS, str(image)], capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise DiskError(errno.EIO, f"mkfs.ext4 failed: {done.stderr.strip()[-300:]}")
        return list(_data_extents(image))


def _data_extents(image: Path) -> Iterator[Extent]:
    with open(image, "rb") as f:
        fd, offset = f.fileno(), 0
        while True:
            try:
                start = os.lseek(fd, offset, os.SEEK_DATA)
            except OSError as exc:
                if exc.errno == errno.ENXIO:  # no data after offset
                    return
                raise
            offset = os.lseek(fd, start, os.SEEK_HOLE)
            yield Extent(start, os.pread(fd, offset - start, start))
