"""Running the embedded endpoint: in-process (`serving()`) or as `e2b-bench serve`."""

from __future__ import annotations

import contextlib
import itertools
import os
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import uvicorn

from bench import asgi

from .app import LocalboxApp
from .mutations import mutate
from .quirks import Quirks
from .registry import LocalboxConfig, Registry, cleanup_stale
from .template import default_cache_dir, ensure_template

DEBUG_API_PORT = 3000
DEBUG_ENVD_PORT = 49983


class HostError(Exception):
    """This host cannot run isolated sandboxes; the message says what is missing."""


@dataclass(frozen=True)
class LocalEndpoint:
    api_url: str
    sandbox_url: str
    api_key: str

    def env(self) -> dict[str, str]:
        return {"E2B_API_KEY": self.api_key, "E2B_API_URL": self.api_url, "E2B_SANDBOX_URL": self.sandbox_url}


_instances = itertools.count(1)


def default_state_root() -> Path:
    return Path(tempfile.gettempdir()) / f"e2b-bench-localbox-{os.getuid()}"


def new_state_dir(root: Path) -> Path:
    """A directory of this server's own; those of servers that died without cleaning up are cleaned now."""
    root.mkdir(parents=True, exist_ok=True)
    for stale in root.glob("server-*"):
        pid = stale.name.split("-")[1]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            cleanup_stale(stale / "boxes")
            shutil.rmtree(stale, ignore_errors=True)
    return root / f"server-{os.getpid()}-{next(_instances)}"


def check_host() -> None:
    """Fail early, in one sentence, when namespaces or overlayfs are not available."""
    if shutil.which("unshare") is None:
        raise HostError("the embedded endpoint needs util-linux's 'unshare' command, which is not installed")
    if os.geteuid() != 0:
        raise HostError(
            "the embedded endpoint creates mount, pid, uts and ipc namespaces and overlayfs roots, "
            "which needs root on this version: run it as root (e.g. in a container or VM)"
        )
    probe = subprocess.run(
        ["unshare", "--mount", "--pid", "--uts", "--ipc", "--fork", "true"],
        capture_output=True,
        text=True,
        check=False,
    )
    if probe.returncode != 0:
        raise HostError(
            f"this host refuses to create mount/pid/uts/ipc namespaces ({probe.stderr.strip()}): "
            "the embedded endpoint cannot isolate sandboxes here"
        )
    if "overlay" not in Path("/proc/filesystems").read_text():
        raise HostError("this kernel has no overlayfs (try 'modprobe overlay'): sandbox roots cannot be mounted")


class LocalServer:
    """The embedded endpoint's uvicorn server, bound before it starts so port 0 works."""

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        api_key: str | None = None,
        state_dir: Path | None = None,
        cache_dir: Path | None = None,
        quirks: Quirks | None = None,
        debug_ports: bool = False,
        pool_size: int = 4,
    ) -> None:
        check_host()
        self.api_key = api_key or "e2b_" + secrets.token_hex(20)
        template_root = ensure_template(cache_dir or default_cache_dir())
        config = LocalboxConfig(
            state_dir=state_dir or new_state_dir(default_state_root()),
            template_root=template_root,
            api_key=self.api_key,
            quirks=quirks or Quirks(),
            pool_size=pool_size,
        )
        self.registry = Registry(config)
        self.sockets = [asgi.bind(host, port)]
        if debug_ports:
            self.sockets += [asgi.bind(host, DEBUG_API_PORT), asgi.bind(host, DEBUG_ENVD_PORT)]
        self.port = self.sockets[0].getsockname()[1]
        self.host = host
        app = mutate(LocalboxApp(self.registry, debug=debug_ports), config.quirks.mutations)
        self.server = uvicorn.Server(
            uvicorn.Config(app, lifespan="on", log_level="warning", access_log=False, timeout_graceful_shutdown=3)
        )

    @property
    def endpoint(self) -> LocalEndpoint:
        url = f"http://{self.host}:{self.port}"
        return LocalEndpoint(api_url=url, sandbox_url=url, api_key=self.api_key)

    async def serve(self) -> None:
        await self.server.serve(sockets=self.sockets)

    def run(self) -> None:
        """Serve on the calling thread, on uvicorn's preferred event loop (uvloop when installed)."""
        asgi.run(self.server, self.sockets)


@contextlib.contextmanager
def serving(**options: object) -> Iterator[LocalEndpoint]:
    """Run the embedded endpoint in a background thread for the duration of the block."""
    with in_thread(LocalServer(**options)) as endpoint:  # type: ignore[arg-type]
        yield endpoint


@contextlib.contextmanager
def in_thread(server: LocalServer) -> Iterator[LocalEndpoint]:
    with asgi.in_thread(server.server, server.sockets, "embedded endpoint"):
        yield server.endpoint
