"""Directory watches: an inotify instance made inside the sandbox, read by the server."""

from __future__ import annotations

import asyncio
import contextlib
import os
import struct
from typing import TYPE_CHECKING

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
        self.raw: list[tuple[int, str]] = []  # (mask, absolute path)
        self.arrived = asyncio.Event()
        self.tasks: set[asyncio.Future] = set()

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
        self.arrived.set()

    async def _add(self, path: str) -> None:
        with contextlib.suppress(AgentError):
            added = await self.sandbox.box.fs("watch_add", watch=self.watch_id, path=path)
            self.paths.update({int(k): v for k, v in added["paths"].items()})

    async def next_events(self) -> list[fs_pb.FilesystemEvent]:
        """The next events; raises WatchClosed once the watch was closed (its sandbox killed) and drained."""
        while not self.raw:
            if self.fd < 0:
                raise WatchClosed(self.root)
            self.arrived.clear()
            await self.arrived.wait()
        return await self.drain()

    async def drain(self) -> list[fs_pb.FilesystemEvent]:
        raw, self.raw = self.raw, []
        events = []
        for mask, full in raw:
            kind = next((k for bits, k in KINDS if mask & bits), None)
            if kind is None:
                continue
            name = os.path.relpath(full, self.root)
            entry = None
            if self.include_entry and kind != fs_pb.EventType.REMOVE and kind != fs_pb.EventType.RENAME:
                with contextlib.suppress(AgentError):
                    info = await self.sandbox.box.fs("stat", path=full, user=self.user)
                    entry = entry_message(info, go_dir_bit=self.sandbox.quirks.dir_mode_go_bit)
            events.append(fs_pb.FilesystemEvent(name=name, type=kind, entry=entry))
        return events

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
