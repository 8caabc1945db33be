"""envd messages and errors built from the agent's answers (shared by the Filesystem service and watches)."""

from __future__ import annotations

import errno

from connectrpc.code import Code
from connectrpc.errors import ConnectError
from e2b.envd.filesystem import filesystem_pb as fs_pb
from protobuf.wkt.google.protobuf.timestamp_pb import Timestamp

from .agentlink import AgentError, AgentGone

ERRNO_CODES = {
    errno.ENOENT: Code.NOT_FOUND,
    errno.EEXIST: Code.ALREADY_EXISTS,
    errno.EACCES: Code.PERMISSION_DENIED,
    errno.EPERM: Code.PERMISSION_DENIED,
    errno.ENOTDIR: Code.INVALID_ARGUMENT,
    errno.EISDIR: Code.INVALID_ARGUMENT,
    errno.ENOTEMPTY: Code.INVALID_ARGUMENT,
    errno.ESRCH: Code.NOT_FOUND,
    errno.ENOSPC: Code.RESOURCE_EXHAUSTED,
    errno.ENAMETOOLONG: Code.INVALID_ARGUMENT,
    errno.ELOOP: Code.INVALID_ARGUMENT,
    errno.EINVAL: Code.INVALID_ARGUMENT,
}
PATH_MAX = 4096  # bytes of a path, its NUL included (Linux)
GO_MODE_DIR = 0o20000000000  # Go's fs.ModeDir, which envd's EntryInfo.mode (Mode().Perm()) leaves out
FILE_TYPES = {
    "file": fs_pb.FileType.FILE,
    "directory": fs_pb.FileType.DIRECTORY,
    "symlink": fs_pb.FileType.SYMLINK,
}


def connect_error(exc: AgentError) -> ConnectError:
    if isinstance(exc, AgentGone):
        return ConnectError(Code.UNAVAILABLE, "sandbox is not running")
    code = ERRNO_CODES.get(exc.errno or 0, Code.INTERNAL)
    target = f": {exc.filename}" if exc.filename else ""
    return ConnectError(code, valid_text(f"{exc}{target}"))


def valid_text(text: str) -> str:
    """A file name as a protobuf string can carry it: bytes that are not UTF-8 (kept by Python as surrogates)
    become U+FFFD, so a directory holding such a name still lists."""
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def entry_message(info: dict, go_dir_bit: bool = False) -> fs_pb.EntryInfo:
    kind = info["type"]
    mode = info["mode"] & 0o777
    if go_dir_bit and kind == "directory":
        mode |= GO_MODE_DIR
    is_symlink = kind == "symlink"
    shown = info.get("target_type", kind) if is_symlink else kind
    mtime = info["mtime_ns"]
    return fs_pb.EntryInfo(
        name=valid_text(info["name"]),
        type=FILE_TYPES.get(shown, fs_pb.FileType.UNSPECIFIED),
        path=valid_text(info["path"]),
        size=info["size"],
        mode=mode,
        permissions=info["permissions"],
        owner=info["owner"],
        group=info["group"],
        modified_time=Timestamp(seconds=mtime // 1_000_000_000, nanos=mtime % 1_000_000_000),
        symlink_target=valid_text(info["symlink_target"]) if "symlink_target" in info else None,
        metadata=info.get("metadata") or {},
        is_symlink=is_symlink,
    )
