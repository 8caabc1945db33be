"""The envd Connect stubs generated in the `e2b` package, imported without loading the SDK's client.

Importing any `e2b.*` module first runs the package's `__init__`, which loads the whole client (both sandbox
classes, the REST models, the MCP, volume and template types): 0.2-0.6 s of CPU that every `run`, `serve`
and `bench` process paid only for the generated message and service classes its endpoint serves.

`defer_sdk_init()` puts the package in `sys.modules` with its `__init__` not yet run. Its submodules import
as usual, as the very module objects the client imports later (no second copy of a message class or of a
registered descriptor). The first name asked of the package itself (`from e2b import Sandbox`, `e2b.X`)
runs `__init__` there and then, under a lock, so a process that does use the client gets all of it.
"""

from __future__ import annotations

import importlib.util
import sys
import threading
from types import ModuleType
from typing import Any

PACKAGE = "e2b"
_lock = threading.RLock()


def defer_sdk_init(package: str = PACKAGE) -> None:
    """Make `package`'s submodules importable without running its `__init__` until a name of its own is used.
    Nothing changes when it is already imported, or not installed (its import then fails as it would)."""
    with _lock:
        if package in sys.modules:
            return
        spec = importlib.util.find_spec(package)
        if spec is None or spec.loader is None or spec.submodule_search_locations is None:
            return
        module = importlib.util.module_from_spec(spec)
        module.__getattr__ = _init_on_first_use(module)  # type: ignore[method-assign]
        sys.modules[package] = module


def _init_on_first_use(module: ModuleType) -> Any:
    ran = False

    def __getattr__(name: str) -> Any:
        # Called only for a name the module does not (yet) have.
        nonlocal ran
        with _lock:  # another thread asking meanwhile waits for the whole `__init__`, as an import would
            if not ran:
                ran = True
                assert module.__spec__ is not None and module.__spec__.loader is not None
                try:
                    module.__spec__.loader.exec_module(module)
                except BaseException:
                    if sys.modules.get(module.__name__) is module:  # a failed import leaves no module behind
                        del sys.modules[module.__name__]
                    raise
        try:
            return module.__dict__[name]
        except KeyError:
            raise AttributeError(f"module {module.__name__!r} has no attribute {name!r}") from None

    return __getattr__
