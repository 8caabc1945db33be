"""Running the embedded endpoint: in-process (`serving()`) or as `e2b-bench serve`."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import gc
import itertools
import json
import logging
import os
import resource
import secrets
import shutil
import signal
import subprocess
import threading
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import uvicorn

from bench import asgi

from ..remote.slowness import scaled
from .app import LocalboxApp
from .box import default_state_root, private_dir, remove_tree
from .conditions import with_conditions
from .disk import unmount_under
from .hostile import with_hostile
from .mutations import mutate, stall
from .quirks import Quirks
from .registry import (
    DISK_SIZE_MB,
    POOL_GROWTH_MAX,
    POOL_SIZE,
    LocalboxConfig,
    Registry,
    cleanup_stale,
    remove_orphan_cgroups,
)
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


log = logging.getLogger("e2b-bench.localbox")


def new_state_dir(root: Path) -> Path:
    """A directory of this server's own; those of servers that died without cleaning up are cleaned now.

    What cannot be removed is reported in one sentence and left: the new server starts all the same.
    """
    private_dir(root)
    left: list[str] = []
    for stale in root.glob("server-*"):
        pid = stale.name.split("-")[1]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            left += cleanup_stale(stale / "boxes")
            left += unmount_under(stale)  # e.g. a snapshot's disk being read when the server died
            if not remove_tree(stale) and not left:
                left.append(str(stale))
    remove_orphan_cgroups()
    if left:
        log.warning(
            "e2b-bench: %d leftover(s) of a previous server could not be removed (%s); starting anyway",
            len(left),
            ", ".join(left[:3]) + (", ..." if len(left) > 3 else ""),
        )
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
    release = tuple(int(part) for part in os.uname().release.split(".")[:2] if part.isdigit())
    if release < (5, 19):
        raise HostError(
            f"sandboxes run in user namespaces over an idmapped template, which needs Linux 5.19 or later "
            f"(this is {os.uname().release})"
        )
    limit = Path("/proc/sys/user/max_user_namespaces")
    if limit.exists() and limit.read_text().strip() == "0":
        raise HostError("user namespaces are turned off on this host (sysctl user.max_user_namespaces=0)")


HEADER_TIMEOUT_S = 10.0  # a request's headers are complete this long after the connection or their first byte
MAX_CONNECTIONS = 2048  # beyond this, the longest-idle connection makes room for a new one
# A request's head is bounded before it is parsed (the parser builds a header or URL by repeated concatenation, its
# cost growing with the square of the size): a request line past URL_MAX is answered 414, a head past HEAD_MAX
# (Go's net/http default, as E2B's Go services have) 431, at once, and the connection closed.
URL_MAX = 64 << 10
HEAD_MAX = 1 << 20
# A body still to come when its answer is complete (e.g. a request refused for its key before its body was read):
# past this much (or of unknown length) the connection is closed rather than the rest read and dropped, as Go's
# net/http does.
BODY_LEFT_MAX = 256 << 10
LINGER_S = 2.0  # a closing connection's input is read and dropped this long, so the client reads the answer first
REASONS = {414: "URI Too Long", 431: "Request Header Fields Too Large"}


class GuardedHttp(asgi.ResettableHttp):
    """uvicorn's HTTP protocol (whose requests can reset their connection) plus a header timeout and a connection
    cap that idle clients cannot use up: at the cap, a new connection closes the oldest one with no request under
    way. Between requests uvicorn's keep-alive timeout (`asgi.KEEPALIVE_S`) applies."""

    _open: weakref.WeakKeyDictionary[object, dict[GuardedHttp, None]] = weakref.WeakKeyDictionary()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        open_ = self._open.setdefault(self.server_state, {})
        if len(open_) >= MAX_CONNECTIONS:
            oldest = next((c for c in open_ if c._idle), None)
            if oldest is not None:
                oldest._drop()
        open_[self] = None
        self._idle_timer: asyncio.TimerHandle | None = None
        self._arm()
        self._closing = False
        self._new_head()

    def _new_head(self) -> None:
        self._in_head, self._head_bytes, self._line_done = True, 0, False

    @property
    def _idle(self) -> bool:
        return self.cycle is None or self.cycle.response_complete

    def _arm(self) -> None:
        if self._idle_timer is not None:
            self._idle_timer.cancel()
        self._idle_timer = self.loop.call_later(scaled(HEADER_TIMEOUT_S), self._expire)

    def _expire(self) -> None:
        self._idle_timer = None
        if self._idle:
            self._drop()

    def data_received(self, data: bytes) -> None:
        if self._closing:
            return
        if self._idle and self._idle_timer is None:  # the first bytes of the next request
            self._arm()
        if self._in_head:
            if not self._line_done:
                end = data.find(b"\n")
                if self._head_bytes + (end if end >= 0 else len(data)) > URL_MAX:
                    self._refuse(414, f"the request line is longer than {URL_MAX} bytes")
                    return
                self._line_done = end >= 0
            self._head_bytes += len(data)
            if self._head_bytes > HEAD_MAX:
                self._refuse(431, f"the request's headers are longer than {HEAD_MAX} bytes")
                return
        super().data_received(data)

    def on_headers_complete(self) -> None:
        self._in_head = False
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._new_head()
        super().on_message_complete()

    def restart_parser(self) -> None:
        self._new_head()
        super().restart_parser()

    def _refuse(self, status: int, message: str) -> None:
        """Answer a request whose head is too large without parsing it, and close the connection."""
        if self._idle:  # no answer of an earlier request is under way on this connection
            body = json.dumps({"code": status, "message": message}).encode()
            head = (
                f"HTTP/1.1 {status} {REASONS[status]}\r\ncontent-type: application/json\r\n"
                f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
            )
            self.transport.write(head.encode() + body)
        self._linger()

    def _linger(self) -> None:
        """Close after what was written, reading and dropping the input meanwhile: closed with unread input, the
        connection would be reset, and the client could lose the answer."""
        self._closing = True
        self._forget()
        with contextlib.suppress(OSError, RuntimeError, NotImplementedError):
            self.transport.write_eof()
        self.loop.call_later(LINGER_S, self.transport.close)

    def _body_left(self) -> int | None:
        """Bytes of the current request's body still to come through the parser (None: of unknown length)."""
        cycle = self.cycle
        if cycle is None or not cycle.more_body or self.transport.get_protocol() is not self:
            return 0  # none, or read by a RawBody of its own
        lengths = [value for name, value in self.headers if name == b"content-length"]
        if len(lengths) != 1 or not lengths[0].isdigit():
            return None
        return int(lengths[0]) - self._body_parsed

    def _drop(self) -> None:
        self._forget()
        if not self.transport.is_closing():
            self.transport.close()

    def on_response_complete(self) -> None:
        left = self._body_left()
        super().on_response_complete()
        self._disarm()
        if (left is None or left > BODY_LEFT_MAX) and not self.transport.is_closing():
            self._linger()

    def handle_websocket_upgrade(self) -> None:
        """The connection now belongs to a WebSocket: neither idle by this measure nor counted here."""
        self._forget()
        super().handle_websocket_upgrade()

    def _forget(self) -> None:
        self._open.get(self.server_state, {}).pop(self, None)
        self._disarm()

    def _disarm(self) -> None:
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None

    def connection_lost(self, exc: Exception | None) -> None:
        self._forget()
        super().connection_lost(exc)


# glibc's mallopt parameters (malloc.h)
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
HEAP_KEPT = 32 << 20  # freed heap kept for the next request's bodies rather than handed back to the kernel
HEAP_BLOCK_MAX = 4 << 20  # blocks up to this size come from the heap, not from mmap


def keep_freed_heap() -> bool:
    """Keep the memory of a body's pieces for the next pieces. Each piece of an upload or download (256 KiB
    read off the socket, copied twice on its way to the app) is allocated and freed within milliseconds; by
    default glibc gives the top of the heap back to the kernel once about 1 MiB of it is free and takes it
    back for the next pieces, every page faulted in and zeroed again: with that, a 20 MiB upload cost the
    server 78 ms of CPU, 49 ms without. Up to HEAP_KEPT of freed heap is kept; blocks under HEAP_BLOCK_MAX
    come from it. False where the C library has no mallopt (it keeps its own policy)."""
    try:  # the C library this process already has loaded (finding it by name runs `ldconfig -p`)
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        mallopt = None
    if mallopt is None:
        return False
    return bool(mallopt(M_TRIM_THRESHOLD, HEAP_KEPT)) and bool(mallopt(M_MMAP_THRESHOLD, HEAP_BLOCK_MAX))


def raise_open_file_limit() -> None:
    """Every connection and every sandbox process pipe is a descriptor: take all the host allows."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


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
        pool_size: int = POOL_SIZE,
        pool_total: int | None = None,
        pool_growth_max: int = POOL_GROWTH_MAX,
        templates: Sequence[str] = (),
        disk_size_mb: int = DISK_SIZE_MB,
    ) -> None:
        """`pool_size`: sandboxes kept prepared ahead of creates (a burst of up to that many is served from
        them), `pool_total` at most in all; creates that find it empty grow it by up to `pool_growth_max` (and
        it shrinks back once they stop). `templates`: built-in templates besides base to build now (a cold
        build takes minutes, longer than an SDK waits for a create), instead of at their first create.
        `disk_size_mb`: every sandbox's disk."""
        check_host()
        self.api_key = api_key or "e2b_" + secrets.token_hex(20)
        template_root = ensure_template(cache_dir or default_cache_dir())
        prepared = {name: ensure_template(cache_dir, name) for name in templates}
        config = LocalboxConfig(
            state_dir=state_dir or new_state_dir(default_state_root()),
            template_root=template_root,
            api_key=self.api_key,
            quirks=quirks or Quirks(),
            pool_size=pool_size,
            pool_total=pool_total,
            growth_max=pool_growth_max,
            cache_dir=cache_dir,
            disk_size_mb=disk_size_mb,
        )
        self.registry = Registry(config)
        self.registry.template_roots.update(prepared)
        self.sockets = [asgi.bind(host, port)]
        if debug_ports:
            self.sockets += [asgi.bind(host, DEBUG_API_PORT), asgi.bind(host, DEBUG_ENVD_PORT)]
        self.port = self.sockets[0].getsockname()[1]
        self.host = host
        app = mutate(LocalboxApp(self.registry, debug=debug_ports), config.quirks.mutations)
        app = stall(app, config.quirks.stream_stall)
        app = with_hostile(app, config.quirks, self.registry)
        app = with_conditions(app, config.quirks)
        raise_open_file_limit()
        keep_freed_heap()
        self.server = uvicorn.Server(
            uvicorn.Config(
                app,
                lifespan="on",
                log_level="warning",
                access_log=False,
                timeout_graceful_shutdown=3,
                timeout_keep_alive=int(asgi.KEEPALIVE_S),
                http=GuardedHttp,
            )
        )

    def wait_prepared(self, timeout: float) -> bool:
        """Wait (from another thread than the server's) until its pool holds every sandbox it keeps prepared;
        False if `timeout` passed first."""
        return self.registry.pool_full.wait(timeout)

    def keep_warm(self, templates: dict[str, int]) -> None:
        """From any thread: the work ahead creates about this many sandboxes of each template; those with a start
        command are prepared with it done, once the template is built (a run's suites say so)."""
        self.registry.keep_warm(templates)

    def key_file(self) -> Path:
        """The API key in a file only host root can read (the state directory is 0700, the file 0600, both gone
        with the server): `serve` names the file and never prints the key."""
        path = private_dir(self.registry.config.state_dir) / "api-key"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "w") as key:
            key.write(self.api_key + "\n")
        return path

    @property
    def endpoint(self) -> LocalEndpoint:
        url = f"http://{self.host}:{self.port}"
        return LocalEndpoint(api_url=url, sandbox_url=url, api_key=self.api_key)

    async def serve(self) -> None:
        await self.server.serve(sockets=self.sockets)

    def run(self) -> None:
        """Serve on the calling thread, on uvicorn's preferred event loop (uvloop when installed).

        Until uvicorn installs its own handlers, SIGTERM and SIGINT ask for the same clean shutdown: an
        exception raised by a signal inside the loop can land where it is swallowed (a weakref callback),
        and the server would never stop.
        """
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGTERM, signal.SIGINT):
                signal.signal(signum, self._stop_soon)
        # What the server imported and booted lives to its end: kept out of every later collection, so a full
        # one (which a burst of events or sandboxes triggers) walks what requests made, not the whole heap.
        gc.freeze()
        asgi.run(self.server, self.sockets)

    def _stop_soon(self, signum: int, frame: object) -> None:
        self.server.should_exit = True


@contextlib.contextmanager
def serving(**options: object) -> Iterator[LocalEndpoint]:
    """Run the embedded endpoint in a background thread for the duration of the block."""
    with in_thread(LocalServer(**options)) as endpoint:  # type: ignore[arg-type]
        yield endpoint


@contextlib.contextmanager
def in_thread(server: LocalServer) -> Iterator[LocalEndpoint]:
    with asgi.in_thread(server.server, server.sockets, "embedded endpoint"):
        yield server.endpoint
