"""Directory watches: an inotify instance made inside the sandbox, read by the server."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import struct
from typing import TYPE_CHECKING

from connectrpc.code import Code
from connectrpc.errors import ConnectError
from e2b.envd.filesystem import filesystem_pb as fs_pb

from .agentlink import AgentError
from .messages import connect_error, entry_message

if TYPE_CHECKING:
    from .registry import Sandbox

HEADER = struct.Struct("iIII")
IN_MODIFY, IN_ATTRIB, IN_MOVED_FROM, IN_MOVED_TO = 0x2, 0x4, 0x40, 0x80
IN_CREATE, IN_DELETE, IN_ISDIR, IN_Q_OVERFLOW = 0x100, 0x200, 0x40000000, 0x4000
IN_DELETE_SELF, IN_MOVE_SELF = 0x400, 0x800
KINDS = (
    (IN_CREATE | IN_MOVED_TO, fs_pb.EventType.CREATE),
    (IN_MODIFY, fs_pb.EventType.WRITE),
    (IN_DELETE | IN_DELETE_SELF, fs_pb.EventType.REMOVE),
    (IN_MOVED_FROM | IN_MOVE_SELF, fs_pb.EventType.RENAME),
    (IN_ATTRIB, fs_pb.EventType.CHMOD),
)


# Events one watcher holds undelivered (its stream's client not reading, or not polled): past this the server
# stops reading its inotify descriptor, and the kernel's own queue (fs.inotify.max_queued_events, charged to the
# sandbox) takes the rest until it overflows, which the watcher then reports as envd reports fsnotify's overflow.
PENDING_MAX = 4096
PENDING_BYTES_MAX = 1 << 20  # of their paths
SLICE = 256  # events converted between two turns of the event loop
OVERFLOW = "watcher error: fsnotify: queue or buffer overflow"


class WatchClosed(Exception):
    """The watch was closed while a stream waited on it."""


class Watcher:
    def __init__(self, sandbox: Sandbox, root: str, recursive: bool, include_entry: bool, user: str) -> None:
        self.sandbox = sandbox
        self.root = root.rstrip("/") or "/"
        self.recursive = recursive
        self.include_entry = include_entry
        self.user = user
        self.watch_id = 0
        self.fd = -1
        self.paths: dict[int, str] = {}
        self.raw: collections.deque[tuple[int, str]] = collections.deque()  # (mask, absolute path)
        self.ready: list[fs_pb.FilesystemEvent] = []  # converted by a drain, not yet returned
        self.arrived = asyncio.Event()
        self.tasks: set[asyncio.Future] = set()
        self.pending_bytes = 0
        self.paused = False
        self.overflowed = False

    @classmethod
    async def open(cls, sandbox: Sandbox, path: str, recursive: bool, include_entry: bool, user: str) -> Watcher:
        watcher = cls(sandbox, path, recursive, include_entry, user)
        try:
            watcher.watch_id, watcher.fd, watcher.paths = await sandbox.box.watch(path, recursive, user)
        except AgentError as exc:
            raise connect_error(exc) from exc
        asyncio.get_running_loop().add_reader(watcher.fd, watcher._readable)
        return watcher

    def _readable(self) -> None:
        try:
            data = os.read(self.fd, 65536)
        except (BlockingIOError, OSError):
            return
        offset = 0
        while offset + HEADER.size <= len(data):
            wd, mask, _cookie, length = HEADER.unpack_from(data, offset)
            name = data[offset + HEADER.size : offset + HEADER.size + length].rstrip(b"\0").decode(errors="replace")
            offset += HEADER.size + length
            self.overflowed |= bool(mask & IN_Q_OVERFLOW)
            self.pending_bytes += len(name)
            directory = self.paths.get(wd)
            if directory is None:
                continue
            if not name:
                # The watched directory itself went (envd's fsnotify: REMOVE or RENAME named "."; the stream
                # stays open with nothing more to say). A subdirectory's own event repeats its parent's: dropped.
                if (directory.rstrip("/") or "/") != self.root or not mask & (IN_DELETE_SELF | IN_MOVE_SELF):
                    continue
                self.raw.append((mask, self.root))
                continue
            full = f"{directory.rstrip('/')}/{name}"
            self.raw.append((mask, full))
            if self.recursive and mask & IN_ISDIR and mask & (IN_CREATE | IN_MOVED_TO):
                task = asyncio.ensure_future(self._add(full))
                self.tasks.add(task)
                task.add_done_callback(self.tasks.discard)
        if len(self.raw) >= PENDING_MAX or self.pending_bytes >= PENDING_BYTES_MAX:
            self.paused = True
            asyncio.get_running_loop().remove_reader(self.fd)
        self.arrived.set()

    async def _add(self, path: str) -> None:
        with contextlib.suppress(AgentError):
            added = await self.sandbox.box.fs("watch_add", watch=self.watch_id, path=path)
            self.paths.update({int(k): v for k, v in added["paths"].items()})

    async def next_events(self) -> list[fs_pb.FilesystemEvent]:
        """The next events; raises WatchClosed once the watch was closed (its sandbox killed) and drained."""
        while not self.raw and not self.ready:
            if self.overflowed:
                raise ConnectError(Code.INTERNAL, OVERFLOW)
            if self.fd < 0:
                raise WatchClosed(self.root)
            self.arrived.clear()
            await self.arrived.wait()
        return await self.drain()

    async def drain(self) -> list[fs_pb.FilesystemEvent]:
        """What arrived before this call (at most PENDING_MAX events), converted a slice at a time; an event
        leaves `raw` once converted, so a drain cancelled midway (its stream's keepalive wait) loses none."""
        if self.overflowed:
            raise ConnectError(Code.INTERNAL, OVERFLOW)
        for index in range(len(self.raw)):
            if index % SLICE == SLICE - 1:
                await asyncio.sleep(0)
            if not self.raw:  # another drain of the same watcher took the rest
                break
            mask, full = self.raw[0]
            event = await self._event(mask, full)
            if self.raw and self.raw[0] == (mask, full):
                self.raw.popleft()
            if event is not None:
                self.ready.append(event)
        events, self.ready = self.ready, []
        self.pending_bytes = sum(len(full) for _, full in self.raw)
        if self.paused and self.fd >= 0:
            self.paused = False
            asyncio.get_running_loop().add_reader(self.fd, self._readable)
        return events

    async def _event(self, mask: int, full: str) -> fs_pb.FilesystemEvent | None:
        kind = next((k for bits, k in KINDS if mask & bits), None)
        if kind is None:
            return None
        name = os.path.relpath(full, self.root)
        entry = None
        if self.include_entry and kind != fs_pb.EventType.REMOVE and kind != fs_pb.EventType.RENAME:
            with contextlib.suppress(AgentError):
                info = await self.sandbox.box.fs("stat", path=full, user=self.user)
                entry = entry_message(info, go_dir_bit=self.sandbox.quirks.dir_mode_go_bit)
        return fs_pb.FilesystemEvent(name=name, type=kind, entry=entry)

    async def close(self) -> None:
        if self.fd < 0:
            return
        with contextlib.suppress(ValueError, OSError):
            asyncio.get_running_loop().remove_reader(self.fd)
        with contextlib.suppress(OSError):
            os.close(self.fd)
        self.fd = -1
        self.arrived.set()  # a stream waiting for events learns the watch is gone
        with contextlib.suppress(AgentError):
            await self.sandbox.box.fs("watch_close", watch=self.watch_id)
