"""Snapshots and forks: a copy of a sandbox's root changes, stacked as a lower layer of new sandboxes.

A snapshot copies the sandbox's overlay upper directory (frozen meanwhile, so the copy is consistent) and
records the layers it sat on; a sandbox created from it mounts `copy:...:template` as its lower layers, so
creating one copies nothing. Snapshots hold the filesystem only: processes and memory are not carried over.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from .box import remove_tree, shift_ids
from .disk import Disks
from .messages import PATH_MAX
from .registry import ID_ALPHABET, Registry, Sandbox

TAG = "default"
TOO_LONG = "File name too long"  # strerror(ENAMETOOLONG) in the C locale


class SnapshotError(Exception):
    """The sandbox's files could not be copied into a snapshot (`status`: the API's answer)."""

    def __init__(self, message: str, status: int = 500) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Snapshot:
    id: str  # without the tag
    name: str | None
    sandbox_id: str
    layers: str  # overlay lowerdir: the copy first, then what it sat on
    created_at: float
    listed: bool = True  # a fork's snapshot is not one the user made

    @property
    def snapshot_id(self) -> str:
        return f"{self.name or self.id}:{TAG}"

    @property
    def names(self) -> list[str]:
        return [f"{self.name}:{TAG}"] if self.name else []

    def info(self) -> dict[str, object]:
        return {"snapshotID": self.snapshot_id, "names": self.names}

    def known_as(self, ref: str) -> bool:
        return ref in {self.id, f"{self.id}:{TAG}", *(n for n in (self.name, *self.names) if n)}


class Snapshots:
    def __init__(self, registry: Registry) -> None:
        self.registry = registry
        self.dir = registry.boxes_dir.parent / "snapshots"
        self.items: dict[str, Snapshot] = {}

    def find(self, ref: str) -> Snapshot | None:
        return next((s for s in self.items.values() if s.known_as(ref)), None)

    def listed(self, sandbox_id: str | None, name: str | None) -> list[Snapshot]:
        found = [
            s
            for s in self.items.values()
            if s.listed and sandbox_id in (None, s.sandbox_id) and (name is None or s.known_as(name))
        ]
        return sorted(found, key=lambda s: s.created_at, reverse=True)

    def delete(self, ref: str) -> bool:
        """Forget a snapshot; its files stay while sandboxes made from it mount them (until shutdown)."""
        snapshot = self.find(ref)
        if snapshot is None:
            return False
        del self.items[snapshot.id]
        return True

    async def take(self, sandbox: Sandbox, name: str | None, listed: bool = True) -> Snapshot:
        snapshot_id = "".join(secrets.choice(ID_ALPHABET) for _ in range(20))
        copy = self.dir / snapshot_id
        self.dir.mkdir(parents=True, exist_ok=True)
        box = sandbox.box
        upper = sandbox.kept_root or box.dir / "upper"
        frozen = sandbox.state == "paused"
        if not frozen:
            await box.freeze()
        ids = box.kept_ids if sandbox.kept_root else box.ids
        id_base = ids.base if ids else 0
        try:
            if box.disks is not None and upper.is_file():  # a powered-off sandbox's disk image
                await asyncio.get_running_loop().run_in_executor(None, _copy_image, box.disks, upper, copy, id_base)
            else:
                await asyncio.get_running_loop().run_in_executor(None, _copy_tree, upper, copy, id_base)
        finally:
            if not frozen:
                await box.thaw()
        snapshot = Snapshot(snapshot_id, name, sandbox.id, f"{copy}:{box.template_root}", time.time(), listed)
        if name and (same := self.find(name)) is not None:
            self.items.pop(same.id)  # a name points at its newest snapshot, as a tag does
        self.items[snapshot_id] = snapshot
        return snapshot


def _copy_image(disks: Disks, image: Path, target: Path, id_base: int) -> None:
    """The upper directory kept in an unmounted disk image, copied as `_copy_tree` copies a mounted one."""
    with disks.reading(image, target.parent) as root:
        _copy_tree(root / "upper", target, id_base)


def _copy_tree(source: Path, target: Path, id_base: int) -> None:
    """Everything of an upper directory, whiteouts and overlay xattrs included (shared blocks where possible),
    owned by ids 0..65535 like the template, so any sandbox mounts it idmapped to its own range. Hard links stay
    links, FIFOs and sockets are copied, setuid/setgid bits and device nodes are dropped (`shift_ids`). On any
    failure nothing of the copy is left, and the error names paths as the sandbox sees them."""
    try:
        done = subprocess.run(
            ["cp", "-a", "--reflink=auto", f"{source}/.", str(target)],
            capture_output=True,
            text=True,
            check=False,
            env={**os.environ, "LC_ALL": "C"},
        )
        if done.returncode != 0 and TOO_LONG in done.stderr:
            # A tree deeper than any path: the sandbox's own doing, refused as such (a client error naming the limit).
            raise SnapshotError(
                f"a snapshot copies paths of up to {PATH_MAX - 1} bytes (PATH_MAX) and the sandbox's files hold a "
                f"longer one: {_in_sandbox(done.stderr.split(TOO_LONG)[0], source, target)[:200]}...",
                400,
            )
        if done.returncode != 0:
            raise SnapshotError(f"copying the sandbox's files failed: {_in_sandbox(done.stderr, source, target)}")
        shift_ids(target, -id_base)
    except BaseException as exc:
        remove_tree(target)
        if isinstance(exc, OSError):
            name = _in_sandbox(str(exc.filename or ""), source, target)
            raise SnapshotError(f"the sandbox's files could not be copied: {exc.strerror} ({name})") from exc
        raise


def _in_sandbox(text: str, source: Path, target: Path) -> str:
    """Host paths of the copy's source and target turned into the paths the sandbox sees (`/home/user/...`)."""
    for root in (f"{source}/.", str(source), f"{target}/.", str(target)):
        text = text.replace(root, "")
    return text.strip()[-500:]
