"""The public API of the Python SDK under test, for the coverage table: every public method of `Sandbox` and
`AsyncSandbox` and of their `commands`, `files` and `pty` members, printed as one JSON list of names such as
"AsyncSandbox.commands.run". Properties and constants are not methods; nothing is connected."""

from __future__ import annotations

import inspect
import json
import sys


def methods(cls: type) -> list[str]:
    found = []
    for name in dir(cls):
        if name.startswith("_"):
            continue
        raw = inspect.getattr_static(cls, name)
        # Plain, class and static methods, and the SDK's methods callable on the class and on an instance.
        if isinstance(raw, (property, type)) or not callable(getattr(cls, name, None)):
            continue
        found.append(name)
    return found


def surface() -> list[str]:
    import e2b
    from e2b.sandbox_async.commands.command import Commands as AsyncCommands
    from e2b.sandbox_async.commands.pty import Pty as AsyncPty
    from e2b.sandbox_async.filesystem.filesystem import Filesystem as AsyncFilesystem
    from e2b.sandbox_sync.commands.command import Commands
    from e2b.sandbox_sync.commands.pty import Pty
    from e2b.sandbox_sync.filesystem.filesystem import Filesystem

    owners = {
        "Sandbox": (e2b.Sandbox, {"commands": Commands, "files": Filesystem, "pty": Pty}),
        "AsyncSandbox": (e2b.AsyncSandbox, {"commands": AsyncCommands, "files": AsyncFilesystem, "pty": AsyncPty}),
    }
    names = set()
    for owner, (cls, members) in owners.items():
        names.update(f"{owner}.{name}" for name in methods(cls))
        for member, member_cls in members.items():
            names.update(f"{owner}.{member}.{name}" for name in methods(member_cls))
    return sorted(names)


if __name__ == "__main__":
    json.dump(surface(), sys.stdout)
    sys.stdout.write("\n")
