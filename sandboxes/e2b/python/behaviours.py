"""Documented behaviours of the Python SDK, each checked twice: what the call returns, and the state it
leaves, seen through an independent path (a shell command in the sandbox, the REST API, another call).

Every behaviour is one step body run under both client flavours: `sync_<name>` drives `Sandbox`,
`async_<name>` drives `AsyncSandbox`. A body awaits every SDK result through `got(...)`, which awaits
what the async client returns and passes what the sync one returns through, so the same lines check
both. Which SDK methods a step really called is observed (a profile hook on the `e2b` package, never a
patch) and recorded in `details.sdk_calls`, for the run's coverage table.

The inventory of behaviours (sandboxes/e2b/behaviours.toml) names these cases.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import os
import re
import shlex
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode

import httpx
from driver import (
    NOT_RECEIVED,
    Context,
    Fail,
    Observed,
    Skip,
    exception_details,
    excerpt,
    expect,
    main,
    rest,
    step,
    wait_until_seen,
)

SUITES = {"behaviours"}
LOOP = asyncio.new_event_loop()
# Sizes on both sides of the buffer boundaries a transport may have (pages, stream chunks, 64 KiB frames).
BOUNDARY_SIZES = (0, 1, 4095, 4096, 4097, 65535, 65536, 65537, (1 << 20) - 1, 1 << 20, (1 << 20) + 1)
USER_HOME = "/home/user"
PROC_FILE = "/proc/sys/kernel/hostname"  # stat says 0 bytes; reading it gives the sandbox id
# Inside the sandbox: the boot id, pid 1's start time, how many `sleep 600` run, the kept file.
BOOT_STATE = (
    "cat /proc/sys/kernel/random/boot_id; cut -d' ' -f22 /proc/1/stat; pgrep -f '^sleep 600$' | wc -l; cat ~/kept"
)
# A process that outlives its command, started only once it runs (a fork may exec after the command ends).
KEEP_RUNNING = (
    "sleep 600 >/dev/null 2>&1 & for i in $(seq 500); do pgrep -f '^sleep 600$' >/dev/null && break; sleep 0.01; done"
)
WRONG_KEY = "e2b_" + "0" * 40
DEADLINE_ENDS = ("TimeoutException", "CommandExitException")
# Inside the sandbox: wait (at most 5 s) until no process matches, then say so.
GONE = "timeout 5 sh -c 'while pgrep -f \"^{pattern}$\" >/dev/null; do sleep 0.05; done' && echo gone"
# The extended attributes of a file, as the shell sees them (envd keeps file metadata as user.e2b.* xattrs).
XATTRS = (
    "python3 -c 'import json, os, sys; p = sys.argv[1]; "
    "print(json.dumps(sorted([k, os.getxattr(p, k).decode()] for k in os.listxattr(p))))'"
)


# --- observing which SDK methods a step calls ------------------------------------------------------

# The SDK's implementation classes, by the public name a user reaches them with.
PUBLIC_OWNERS = {
    "Sandbox": "Sandbox",
    "AsyncSandbox": "AsyncSandbox",
    "Commands": "Sandbox.commands",
    "Pty": "Sandbox.pty",
    "Filesystem": "Sandbox.files",
    "CommandHandle": "CommandHandle",
    "AsyncCommandHandle": "CommandHandle",
    "WatchHandle": "WatchHandle",
    "AsyncWatchHandle": "WatchHandle",
    "SandboxPaginator": "SandboxPaginator",
    "AsyncSandboxPaginator": "SandboxPaginator",
}


class CallLog:
    """Public SDK methods a step called itself (not those the SDK calls inside), as `Owner.member.method`."""

    def __init__(self) -> None:
        self.calls: set[str] = set()
        self.package = os.path.dirname(__import__("e2b").__file__)

    def hook(self, frame: Any, event: str, arg: Any) -> None:
        if event != "call" or not frame.f_code.co_filename.startswith(self.package):
            return
        caller = frame.f_back
        if caller is None or caller.f_code.co_filename.startswith(self.package):
            return
        name = frame.f_code.co_name
        bound = frame.f_locals.get("self", frame.f_locals.get("cls"))
        if name == "_wrapper" and hasattr(bound, "method"):
            # The SDK's methods callable on the class and on an instance go through one wrapper.
            name = bound.method.__name__
            bound = frame.f_locals.get("obj") or frame.f_locals.get("objtype")
        owner = bound if isinstance(bound, type) else type(bound)
        if name.startswith("_") or owner.__name__ not in PUBLIC_OWNERS:
            return
        public = PUBLIC_OWNERS[owner.__name__]
        if "sandbox_async" in owner.__module__ and public.startswith("Sandbox"):
            public = "AsyncSandbox" + public.removeprefix("Sandbox")
        self.calls.add(f"{public}.{name}")

    def __enter__(self) -> CallLog:
        sys.setprofile(self.hook)
        threading.setprofile(self.hook)
        return self

    def __exit__(self, *exc: object) -> None:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]


# --- the two client flavours ---------------------------------------------------------------------


async def got(value: Any) -> Any:
    """The value of an SDK call in either flavour: awaited when the async client returned a coroutine."""
    return await value if inspect.isawaitable(value) else value


@dataclass
class Flavour:
    name: str  # "sync" | "async"
    ctx: Context

    @property
    def Sandbox(self) -> Any:
        import e2b

        return e2b.Sandbox if self.name == "sync" else e2b.AsyncSandbox

    async def new(self, **options: Any) -> Any:
        """A fresh sandbox tagged with the run (killed when the step ends, unless the context keeps it)."""
        metadata = {**self.ctx.metadata, **options.pop("metadata", {})}
        timeout = options.pop("timeout", self.ctx.sandbox_timeout_s)
        creating = self.Sandbox.create(template=self.ctx.template, timeout=timeout, metadata=metadata, **options)
        sandbox = await got(creating)
        self.ctx.created.append(sandbox.sandbox_id)
        return sandbox

    async def shared(self) -> Any:
        """One sandbox per flavour for the behaviours that only add files and processes of their own."""
        key = f"shared-{self.name}"
        state = self.ctx.state
        if key not in state:
            state[key] = await self.new(timeout=self.ctx.shared_timeout_s)
            self.ctx.shared_created(state[key].sandbox_id)
            self.ctx.watch(state[key].sandbox_id, lambda: state.get(key), lambda: state.pop(key, None))
        self.ctx.uses(state[key].sandbox_id)
        return state[key]

    async def sh(self, sandbox: Any, command: str, **options: Any) -> str:
        """The independent path inside the sandbox: a shell command's stdout (exit 0 required)."""
        result = await got(sandbox.commands.run(command, **options))
        return result.stdout

    def dir(self, step_name: str) -> str:
        return f"{USER_HOME}/bh-{self.name}-{step_name}"


Body = Callable[[Flavour, Observed], Awaitable[None]]
BODIES: dict[str, Body] = {}


def behaviour(name: str) -> Callable[[Body], Body]:
    """Register `body` as the steps `sync_<name>` and `async_<name>`."""

    def register(body: Body) -> Body:
        BODIES[name] = body
        for flavour in ("sync", "async"):
            step(f"{flavour}_{name}")(_runner(flavour, body))
        return body

    return register


def _runner(flavour: str, body: Body) -> Callable[[Context, Observed], None]:
    def run(ctx: Context, obs: Observed) -> None:
        log = CallLog()
        try:
            with log:
                LOOP.run_until_complete(body(Flavour(flavour, ctx), obs))
        finally:
            obs["sdk_calls"] = sorted(log.calls)

    return run


# --- the second path: the REST API ----------------------------------------------------------------


def rest_get(sandbox_id: str) -> httpx.Response:
    with rest() as client:
        return client.get(f"/sandboxes/{sandbox_id}")


def flat(pages: list[list[str]]) -> list[str]:
    return [item for page in pages for item in page]


def parse_time(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def same(obs: Observed, key: str, observed: Any, wanted: Any) -> None:
    """Record `observed` under `key` and require it to equal `wanted`."""
    obs[key] = excerpt(observed) if isinstance(observed, str) else observed
    if observed != wanted:
        raise Fail(f"{key}: got {excerpt(repr(observed))}, expected {excerpt(repr(wanted))}")


async def raises(obs: Observed, key: str, call: Callable[[], Any], *names: str) -> BaseException:
    """Run `call`; it must raise one of the SDK exception classes `names`."""
    try:
        value = await got(call())
    except Exception as exc:
        obs[key] = exception_details(exc)
        expect(type(exc).__name__ in names, f"{key}: raised {type(exc).__name__}: {exc}, expected {' or '.join(names)}")
        return exc
    obs[key] = {"returned": excerpt(repr(value))}
    raise Fail(f"{key}: returned {excerpt(repr(value))} instead of raising {' or '.join(names)}")


# --- lifecycle -----------------------------------------------------------------------------------


@behaviour("create_envs_metadata")
async def create_envs_metadata(fl: Flavour, obs: Observed) -> None:
    sbx = await fl.new(envs={"BH_VAR": "v 1 ✓", "BH_EMPTY": ""}, metadata={"bh-key": "bh value"})
    same(
        obs,
        "envs_in_shell",
        await fl.sh(sbx, 'printf "%s|%s|%s" "$BH_VAR" "${BH_EMPTY-unset}" "$HOME"'),
        f"v 1 ✓||{USER_HOME}",
    )
    body = rest_get(sbx.sandbox_id).json()
    same(obs, "rest_metadata", body.get("metadata", {}).get("bh-key"), "bh value")
    info = await got(sbx.get_info())
    same(obs, "sdk_metadata", info.metadata.get("bh-key"), "bh value")
    same(obs, "template_id_agrees", info.template_id, body.get("templateID"))


@behaviour("create_timeout_end_at")
async def create_timeout_end_at(fl: Flavour, obs: Observed) -> None:
    sbx = await fl.new(timeout=97)
    body = rest_get(sbx.sandbox_id).json()
    lifetime = (parse_time(body["endAt"]) - parse_time(body["startedAt"])).total_seconds()
    obs["rest_lifetime_s"] = lifetime
    expect(abs(lifetime - 97) <= 3, f"endAt - startedAt is {lifetime:.1f} s, expected the 97 s asked for")


@behaviour("get_info_fields")
async def get_info_fields(fl: Flavour, obs: Observed) -> None:
    sbx = await fl.shared()
    info = await got(sbx.get_info())
    body = rest_get(sbx.sandbox_id).json()
    now = datetime.now(UTC)
    sdk = {
        "sandboxID": info.sandbox_id,
        "templateID": info.template_id,
        "state": getattr(info.state, "value", info.state),
        "cpuCount": info.cpu_count,
        "memoryMB": info.memory_mb,
        "metadata": info.metadata,
        "startedAt": info.started_at.timestamp(),
        "endAt": info.end_at.timestamp(),
    }
    wire = {key: body.get(key) for key in sdk}
    wire["startedAt"] = parse_time(body["startedAt"]).timestamp()
    wire["endAt"] = parse_time(body["endAt"]).timestamp()
    same(obs, "sdk_equals_rest", sdk, wire)
    expect(info.state is not None and sdk["state"] == "running", f"state is {sdk['state']!r}, expected 'running'")
    expect(info.started_at <= now <= info.end_at, f"now {now} is not within [{info.started_at}, {info.end_at}]")
    expect(info.cpu_count >= 1 and info.memory_mb >= 1, f"cpuCount {info.cpu_count}, memoryMB {info.memory_mb}")
    expect(bool(body.get("envdVersion")), "envdVersion is missing")


@behaviour("set_timeout")
async def set_timeout(fl: Flavour, obs: Observed) -> None:
    sbx = await fl.new()  # its own: a shared sandbox cut to 180 s would expire under later cases
    for seconds in (250, 180):  # longer, then shorter: both move endAt to now + timeout
        asked = time.time()
        await got(sbx.set_timeout(seconds))
        end = parse_time(rest_get(sbx.sandbox_id).json()["endAt"]).timestamp()
        obs[f"end_minus_now_{seconds}"] = round(end - asked, 1)
        expect(abs(end - asked - seconds) <= 3, f"set_timeout({seconds}) put endAt {end - asked:.1f} s ahead")


@behaviour("list_filters_paging")
async def list_filters_paging(fl: Flavour, obs: Observed) -> None:
    from e2b import SandboxQuery, SandboxState

    group = f"{fl.ctx.run_id}-{fl.name}-list"
    first = await fl.new(metadata={"bh-group": group, "bh-which": "first"})
    second = await fl.new(metadata={"bh-group": group, "bh-which": "second"})
    await got(second.beta_pause())

    async def ids(query: Any, limit: int | None = None) -> tuple[list[list[str]], bool]:
        paginator = fl.Sandbox.list(query=query, limit=limit)
        pages = [[s.sandbox_id for s in await got(paginator.next_items())]]
        while paginator.has_next and len(pages) < 5:
            pages.append([s.sandbox_id for s in await got(paginator.next_items())])
        return pages, paginator.has_next

    both = SandboxQuery(metadata={"bh-group": group}, state=[SandboxState.RUNNING, SandboxState.PAUSED])
    pages, _ = await ids(both)
    same(obs, "both_states", sorted(flat(pages)), sorted([first.sandbox_id, second.sandbox_id]))
    pages, _ = await ids(SandboxQuery(metadata={"bh-group": group, "bh-which": "first"}))
    same(obs, "metadata_filter", flat(pages), [first.sandbox_id])
    pages, _ = await ids(SandboxQuery(metadata={"bh-group": group}, state=[SandboxState.PAUSED]))
    same(obs, "state_paused", flat(pages), [second.sandbox_id])
    pages, _ = await ids(SandboxQuery(metadata={"bh-group": group}, state=[SandboxState.RUNNING]))
    same(obs, "state_running", flat(pages), [first.sandbox_id])
    pages, more = await ids(both, limit=1)
    same(obs, "pages_of_one", [len(page) for page in pages], [1, 1])
    same(obs, "pages_cover_both", sorted(flat(pages)), sorted([first.sandbox_id, second.sandbox_id]))
    expect(not more, "has_next is still true after the last page")
    with rest() as client:
        wire = client.get("/v2/sandboxes", params={"metadata": f"bh-group={group}", "state": "paused"}).json()
    same(obs, "rest_filter", [s["sandboxID"] for s in wire], [second.sandbox_id])


@behaviour("pause_connect")
async def pause_connect(fl: Flavour, obs: Observed) -> None:
    from e2b import SandboxState

    sbx = await fl.new()
    await got(sbx.files.write(f"{USER_HOME}/kept.txt", "kept across pause"))
    expect(await got(sbx.pause()) is True, "pause() did not return True")
    same(obs, "rest_state_paused", rest_get(sbx.sandbox_id).json().get("state"), "paused")
    info = await got(sbx.get_info())
    same(obs, "sdk_state_paused", info.state, SandboxState.PAUSED)
    resumed = await got(fl.Sandbox.connect(sbx.sandbox_id))
    same(obs, "rest_state_resumed", rest_get(sbx.sandbox_id).json().get("state"), "running")
    same(obs, "file_kept", await fl.sh(resumed, f"cat {USER_HOME}/kept.txt"), "kept across pause")
    expect(await got(resumed.is_running()) is True, "is_running() is not True after connect")


@behaviour("kill")
async def kill(fl: Flavour, obs: Observed) -> None:
    from e2b import Sandbox

    sbx = await fl.new()
    expect(await got(sbx.is_running()) is True, "is_running() is not True on a new sandbox")
    same(obs, "kill", await got(sbx.kill()), True)
    fl.ctx.killed.add(sbx.sandbox_id)
    same(obs, "rest_status_after_kill", rest_get(sbx.sandbox_id).status_code, 404)
    same(obs, "is_running_after_kill", await got(sbx.is_running()), False)
    same(obs, "kill_again", await got(fl.Sandbox.kill(sbx.sandbox_id)), False)
    listed = [s.sandbox_id for s in Sandbox.list(query=_tag(fl)).next_items()]
    expect(sbx.sandbox_id not in listed, "a killed sandbox is still listed")


def _tag(fl: Flavour) -> Any:
    from e2b import SandboxQuery

    return SandboxQuery(metadata=fl.ctx.metadata)


@behaviour("metrics")
async def metrics(fl: Flavour, obs: Observed) -> None:
    sbx = await fl.shared()
    samples = await got(sbx.get_metrics())
    obs["samples"] = len(samples)
    expect(len(samples) >= 1, "get_metrics() returned no sample")
    last = samples[-1]
    obs["last"] = {"cpu_count": last.cpu_count, "mem_total": last.mem_total, "disk_total": last.disk_total}
    cpus = int((await fl.sh(sbx, "nproc")).strip())
    expect(last.cpu_count >= 1 and last.mem_total > 0 and last.disk_total > 0, f"empty sample {obs['last']}")
    obs["nproc"] = cpus
    with rest() as client:
        wire = client.get(f"/sandboxes/{sbx.sandbox_id}/metrics")
    same(obs, "rest_status", wire.status_code, 200)
    expect(len(wire.json()) >= 1, "GET /sandboxes/{id}/metrics returned no sample")


@behaviour("create_internet_access")
async def create_internet_access(fl: Flavour, obs: Observed) -> None:
    sbx = await fl.new(allow_internet_access=False)
    same(obs, "rest", rest_get(sbx.sandbox_id).json().get("allowInternetAccess"), False)
    same(obs, "sdk", (await got(sbx.get_info())).allow_internet_access, False)


@behaviour("snapshots")
async def snapshots(fl: Flavour, obs: Observed) -> None:
    sbx = await fl.new()
    await got(sbx.files.write(f"{USER_HOME}/origin.txt", "from the origin"))
    snapshot = await got(sbx.create_snapshot())
    obs["snapshot"] = {"id": snapshot.snapshot_id, "names": snapshot.names}
    listed = [s.snapshot_id for s in await got(sbx.list_snapshots().next_items())]
    expect(snapshot.snapshot_id in listed, "list_snapshots() does not list the new snapshot")
    restored = await _from_snapshot(fl, snapshot.snapshot_id)
    same(obs, "restored_file", await fl.sh(restored, f"cat {USER_HOME}/origin.txt"), "from the origin")
    same(obs, "delete_snapshot", await got(fl.Sandbox.delete_snapshot(snapshot.snapshot_id)), True)
    with rest() as client:
        after = client.get("/snapshots", params={"sandboxID": sbx.sandbox_id}).json()
    expect(snapshot.snapshot_id not in str(after), "GET /snapshots still lists the deleted snapshot")


@behaviour("fork")
async def fork(fl: Flavour, obs: Observed) -> None:
    sbx = await fl.new()
    await got(sbx.files.write(f"{USER_HOME}/origin.txt", "from the origin"))
    forks = await got(sbx.fork())
    fl.ctx.created.extend(f.sandbox_id for f in forks if hasattr(f, "sandbox_id"))
    expect(len(forks) == 1 and hasattr(forks[0], "sandbox_id"), f"fork() returned {forks!r}")
    same(obs, "forked_file", await fl.sh(forks[0], f"cat {USER_HOME}/origin.txt"), "from the origin")
    await fl.sh(forks[0], f"echo changed > {USER_HOME}/origin.txt")
    same(obs, "origin_untouched", await fl.sh(sbx, f"cat {USER_HOME}/origin.txt"), "from the origin")


@behaviour("metrics_window")
async def metrics_window(fl: Flavour, obs: Observed) -> None:
    sbx = await fl.shared()
    before = datetime.fromtimestamp(time.time() - 7200, UTC)
    same(obs, "window_before_creation", await got(sbx.get_metrics(start=before, end=before)), [])
    with rest() as client:
        wrong = client.get(f"/sandboxes/{sbx.sandbox_id}/metrics", params={"start": "not-a-time"}).status_code
    same(obs, "bad_start", wrong, 400)


async def _from_snapshot(fl: Flavour, snapshot_id: str) -> Any:
    """A sandbox created from a snapshot: the snapshot id takes the template's place."""
    sandbox = await got(
        fl.Sandbox.create(template=snapshot_id, timeout=fl.ctx.sandbox_timeout_s, metadata=fl.ctx.metadata)
    )
    fl.ctx.created.append(sandbox.sandbox_id)
    return sandbox


@behaviour("host_and_mcp")
async def host_and_mcp(fl: Flavour, obs: Observed) -> None:
    sbx = await fl.new()
    domain = rest_get(sbx.sandbox_id).json().get("domain") or os.environ.get("E2B_DOMAIN") or "e2b.app"
    same(obs, "get_host", sbx.get_host(8123), f"8123-{sbx.sandbox_id}.{domain}")
    same(obs, "get_mcp_url", sbx.get_mcp_url(), f"https://50005-{sbx.sandbox_id}.{domain}/mcp")
    token = "bh-mcp-" + fl.name
    await fl.sh(sbx, f"mkdir -p /etc/mcp-gateway && printf {token} > /etc/mcp-gateway/.token", user="root")
    same(obs, "get_mcp_token", await got(sbx.get_mcp_token()), token)


@behaviour("update_network")
async def update_network(fl: Flavour, obs: Observed) -> None:
    sbx = await fl.new()
    await got(sbx.update_network({"deny_out": ["10.9.9.9/32"]}))
    network = rest_get(sbx.sandbox_id).json().get("network") or {}
    obs["rest_network"] = network
    expect("10.9.9.9/32" in (network.get("denyOut") or []), f"GET /sandboxes/{{id}} network is {network}")


def envd_statuses(made: dict[str, Any]) -> dict[str, Any]:
    """Statuses of envd's file routes of a secure sandbox, with and without its access token."""
    sandbox_id, token = made["sandboxID"], made.get("envdAccessToken") or ""
    base = os.environ.get("E2B_SANDBOX_URL") or f"https://49983-{sandbox_id}.{made.get('domain') or 'e2b.app'}"
    headers = {"E2b-Sandbox-Id": sandbox_id}
    authorized = {**headers, "X-Access-Token": token}
    path = {"path": "/home/user/envd-statuses.txt", "username": "user"}
    seen: dict[str, Any] = {}
    with httpx.Client(base_url=base.rstrip("/"), timeout=30) as envd:
        upload = {"files": {"file": ("envd-statuses.txt", b"envd")}}
        seen["POST /files"] = envd.post("/files", params=path, headers=authorized, **upload).status_code
        seen["POST /files no token"] = envd.post("/files", params=path, headers=headers, **upload).status_code
        octet = {**authorized, "Content-Type": "application/octet-stream"}
        seen["POST /files no path"] = envd.post("/files", content=b"x", headers=octet).status_code
        read = envd.get("/files", params=path, headers=authorized)
        seen["GET /files"], seen["GET /files content"] = read.status_code, read.text
        seen["GET /files no token"] = envd.get("/files", params=path, headers=headers).status_code
        missing = {**path, "path": "/home/user/no-such-file"}
        seen["GET /files missing"] = envd.get("/files", params=missing, headers=authorized).status_code
        directory = {**path, "path": "/home/user"}
        seen["GET /files of a directory"] = envd.get("/files", params=directory, headers=authorized).status_code
    return seen


@behaviour("download_encoding")
async def download_encoding(fl: Flavour, obs: Observed) -> None:
    """GET /files answers in an encoding the client accepts (identity or gzip), and 406 when it accepts none."""
    sbx = await fl.new()
    path = f"{USER_HOME}/encoding.txt"
    await got(sbx.files.write(path, "e2b " * 1000))
    url = sbx.download_url(path, use_signature_expiration=120)
    zipped = httpx.get(url, headers={"Accept-Encoding": "gzip"})
    same(
        obs,
        "gzip",
        [zipped.status_code, zipped.headers.get("content-encoding"), zipped.text],
        [200, "gzip", "e2b " * 1000],
    )
    refused = httpx.get(url, headers={"Accept-Encoding": "br;q=1, identity;q=0"})
    obs["refused_body"] = excerpt(refused.text)
    same(obs, "none_acceptable", refused.status_code, 406)


@behaviour("rest_statuses")
async def rest_statuses(fl: Flavour, obs: Observed) -> None:
    """Each documented status of the sandbox routes a client can provoke, and the state each call leaves."""
    sbx = await fl.new()
    sid, unknown, bad = sbx.sandbox_id, "bh-no-such-sandbox", {"X-API-KEY": WRONG_KEY}
    seen: dict[str, Any] = {}
    with rest() as client:

        def hit(name: str, method: str, path: str, **options: Any) -> httpx.Response:
            response = client.request(method, path, **options)
            seen[name] = response.status_code
            return response

        def state() -> str:
            return client.get(f"/sandboxes/{sid}").json().get("state")

        tag = {"metadata": urlencode(fl.ctx.metadata)}
        hit("GET /sandboxes", "GET", "/sandboxes", params=tag)
        hit("GET /sandboxes wrong key", "GET", "/sandboxes", headers=bad)
        hit("GET /v2/sandboxes bad state", "GET", "/v2/sandboxes", params={"state": "bogus"})
        hit("GET /v2/sandboxes wrong key", "GET", "/v2/sandboxes", headers=bad)
        body = {"templateID": fl.ctx.template or "base", "timeout": 60, "metadata": fl.ctx.metadata}
        made = hit("POST /sandboxes", "POST", "/sandboxes", json={**body, "secure": True})
        if made.status_code == 201:
            fl.ctx.created.append(made.json()["sandboxID"])
            seen.update(envd_statuses(made.json()))
        hit("POST /sandboxes bad body", "POST", "/sandboxes", json={**body, "templateID": 5})
        hit("POST /sandboxes wrong key", "POST", "/sandboxes", json=body, headers=bad)
        for name, method, route, options in (
            ("GET", "GET", "", {}),
            ("timeout", "POST", "/timeout", {"json": {"timeout": 100}}),
            ("refreshes", "POST", "/refreshes", {"json": {"duration": 10}}),
            ("metrics", "GET", "/metrics", {}),
        ):
            hit(f"{name} unknown", method, f"/sandboxes/{unknown}{route}", **options)
            hit(f"{name} wrong key", method, f"/sandboxes/{sid}{route}", headers=bad, **options)
            hit(name, method, f"/sandboxes/{sid}{route}", **options)
        hit("pause", "POST", f"/sandboxes/{sid}/pause")
        seen["state after pause"] = state()
        hit("pause again", "POST", f"/sandboxes/{sid}/pause")
        hit("resume", "POST", f"/sandboxes/{sid}/resume", json={"timeout": 60})
        seen["state after resume"] = state()
        hit("resume again", "POST", f"/sandboxes/{sid}/resume", json={"timeout": 60})
        hit("connect running", "POST", f"/sandboxes/{sid}/connect", json={"timeout": 60})
        hit("pause unknown", "POST", f"/sandboxes/{unknown}/pause")
        hit("resume unknown", "POST", f"/sandboxes/{unknown}/resume", json={"timeout": 60})
        hit("connect unknown", "POST", f"/sandboxes/{unknown}/connect", json={"timeout": 60})
        hit("pause wrong key", "POST", f"/sandboxes/{sid}/pause", headers=bad)
        hit("fork wrong key", "POST", f"/sandboxes/{sid}/fork", json={}, headers=bad)
        hit("snapshot wrong key", "POST", f"/sandboxes/{sid}/snapshots", json={}, headers=bad)
        hit("GET /snapshots wrong key", "GET", "/snapshots", headers=bad)
        hit("network wrong key", "PUT", f"/sandboxes/{sid}/network", json={"denyOut": []}, headers=bad)
        not_json = {"content": b"{", "headers": {"Content-Type": "application/json"}}
        hit("resume bad body", "POST", f"/sandboxes/{sid}/resume", **not_json)
        hit("resume wrong key", "POST", f"/sandboxes/{sid}/resume", json={"timeout": 60}, headers=bad)
        hit("connect bad body", "POST", f"/sandboxes/{sid}/connect", **not_json)
        hit("connect wrong key", "POST", f"/sandboxes/{sid}/connect", json={"timeout": 60}, headers=bad)
        hit("fork unknown", "POST", f"/sandboxes/{unknown}/fork", json={})
        hit("snapshot unknown", "POST", f"/sandboxes/{unknown}/snapshots", json={})
        hit("snapshot bad body", "POST", f"/sandboxes/{sid}/snapshots", **not_json)
        hit("network unknown", "PUT", f"/sandboxes/{unknown}/network", json={})
        hit("network unrestricted", "PUT", f"/sandboxes/{sid}/network", json={})
        # A documented route on a live sandbox never answers 404, which the SDKs read as "sandbox not found".
        logs = client.get(f"/sandboxes/{sid}/logs").status_code
        obs["logs_status"] = logs
        expect(logs != 404, f"GET /sandboxes/{{id}}/logs of a live sandbox answered {logs}, as if it did not exist")
        hit("pause", "POST", f"/sandboxes/{sid}/pause")
        hit("connect paused", "POST", f"/sandboxes/{sid}/connect", json={"timeout": 60})
        seen["state after connect"] = state()
        hit("DELETE wrong key", "DELETE", f"/sandboxes/{sid}", headers=bad)
        hit("DELETE", "DELETE", f"/sandboxes/{sid}")
        fl.ctx.killed.add(sid)
        hit("DELETE again", "DELETE", f"/sandboxes/{sid}")
        hit("GET after DELETE", "GET", f"/sandboxes/{sid}")
    wanted = {
        "GET /sandboxes": 200, "GET /sandboxes wrong key": 401, "GET /v2/sandboxes bad state": 400,
        "GET /v2/sandboxes wrong key": 401, "POST /sandboxes": 201, "POST /sandboxes bad body": 400,
        "POST /sandboxes wrong key": 401,
        "GET unknown": 404, "GET wrong key": 401, "GET": 200,
        "timeout unknown": 404, "timeout wrong key": 401, "timeout": 204,
        "refreshes unknown": 404, "refreshes wrong key": 401, "refreshes": 204,
        "metrics unknown": 404, "metrics wrong key": 401, "metrics": 200,
        "pause": 204, "state after pause": "paused", "pause again": 409, "resume": 201, "state after resume": "running",
        "resume again": 409, "connect running": 200, "pause unknown": 404, "resume unknown": 404,
        "connect unknown": 404, "pause wrong key": 401, "connect paused": 201, "state after connect": "running",
        "DELETE wrong key": 401, "DELETE": 204, "DELETE again": 404, "GET after DELETE": 404,
        "fork wrong key": 401, "snapshot wrong key": 401, "GET /snapshots wrong key": 401, "network wrong key": 401,
        "fork unknown": 404, "snapshot unknown": 404, "snapshot bad body": 400, "network unknown": 404,
        "network unrestricted": 204,
        "resume bad body": 400, "resume wrong key": 401, "connect bad body": 400, "connect wrong key": 401,
        "POST /files": 200, "POST /files no token": 401, "POST /files no path": 400, "GET /files": 200,
        "GET /files no token": 401, "GET /files missing": 404, "GET /files of a directory": 400,
        "GET /files content": "envd",
    }  # fmt: skip
    wrong = {name: seen.get(name) for name in wanted if seen.get(name) != wanted[name]}
    obs["seen"] = seen
    expect(not wrong, f"statuses differ: {wrong}, expected { ({k: wanted[k] for k in wrong}) }")


# --- commands ------------------------------------------------------------------------------------


@behaviour("run_envs_cwd_user")
async def run_envs_cwd_user(fl: Flavour, obs: Observed) -> None:
    sbx = await fl.shared()
    result = await got(
        sbx.commands.run(
            'printf "%s|" "$BH_A" "$BH_B"; pwd; whoami', envs={"BH_A": "a b", "BH_B": "=x="}, cwd="/tmp", user="root"
        )
    )
    same(obs, "stdout", result.stdout, "a b|=x=|/tmp\nroot\n")
    same(obs, "default_user", await fl.sh(sbx, "whoami; pwd"), f"user\n{USER_HOME}\n")


@behaviour("run_streams")
async def run_streams(fl: Flavour, obs: Observed) -> None:
    sbx = await fl.shared()
    out: list[str] = []
    err: list[str] = []
    signals: list[Any] = []
    # The rest is written once the client has received out1 (a second command it runs makes the file the first
    # waits for): output sent as it comes, not at the command's end, however loaded the endpoint's host is
    gate = f"/tmp/bh-{fl.name}-streams-seen"
    waits = wait_until_seen(fl.ctx, gate, "out1")
    script = f"rm -f {gate}; for i in 1 2 3; do echo out$i; echo err$i >&2; [ $i = 1 ] && {waits}; sleep 0.05; done"

    def on_stdout(chunk: str) -> None:
        out.append(chunk)
        if not signals and "out1\n" in "".join(out):
            touched = sbx.commands.run(f"touch {gate}")
            if inspect.isawaitable(touched):  # kept: its error is retrieved even when the main command fails first
                touched = asyncio.ensure_future(touched)
                touched.add_done_callback(lambda done: done.cancelled() or done.exception())
            signals.append(touched)

    result = await got(sbx.commands.run(script, on_stdout=on_stdout, on_stderr=err.append))
    for signal in signals:
        await got(signal)
    same(obs, "stdout", result.stdout, "out1\nout2\nout3\n")
    said = result.stderr.splitlines(True)
    same(obs, "held_back", [line.strip() for line in said if NOT_RECEIVED in line], [])
    same(obs, "stderr", "".join(line for line in said if NOT_RECEIVED not in line), "err1\nerr2\nerr3\n")
    same(obs, "on_stdout_joined", "".join(out), result.stdout)
    same(obs, "on_stderr_joined", "".join(err), result.stderr)
    same(obs, "exit_code", result.exit_code, 0)


@behaviour("run_exit_code")
async def run_exit_code(fl: Flavour, obs: Observed) -> None:
    sbx = await fl.shared()
    marker = f"/tmp/bh-{fl.name}-exit-marker"
    exc = await raises(
        obs, "exit_7", lambda: sbx.commands.run(f"echo partial; echo ran > {marker}; exit 7"), "CommandExitException"
    )
    same(obs, "exit_code", getattr(exc, "exit_code", None), 7)
    same(obs, "stdout_kept", getattr(exc, "stdout", None), "partial\n")
    same(obs, "side_effect", await got(sbx.files.read(marker)), "ran\n")


@behaviour("run_timeout")
async def run_timeout(fl: Flavour, obs: Observed) -> None:
    sbx = await fl.shared()
    # The deadline ends the stream and kills the process at the same moment (envd runs the process under
    # the request's context): the SDK raises whichever it sees first, a timeout or the kill.
    exc = await raises(obs, "timeout", lambda: sbx.commands.run("sleep 21.5", timeout=1), *DEADLINE_ENDS)
    if type(exc).__name__ == "CommandExitException":
        same(obs, "killed", [getattr(exc, "exit_code", None), getattr(exc, "error", None)], [-1, "signal: killed"])
    same(obs, "process_gone", await fl.sh(sbx, GONE.format(pattern="sleep 21.5")), "gone\n")


@behaviour("background_list_kill")
async def background_list_kill(fl: Flavour, obs: Observed) -> None:
    sbx = await fl.shared()
    handle = await got(sbx.commands.run("sleep 45", background=True, envs={"BH_TAG": fl.name}, cwd="/tmp"))
    listed = {p.pid: p for p in await got(sbx.commands.list())}
    expect(handle.pid in listed, f"pid {handle.pid} is not in commands.list()")
    proc = listed[handle.pid]
    obs["listed"] = {"cmd": proc.cmd, "args": proc.args, "cwd": proc.cwd, "envs_has_tag": proc.envs.get("BH_TAG")}
    same(obs, "listed_cwd", proc.cwd, "/tmp")
    same(obs, "listed_env", proc.envs.get("BH_TAG"), fl.name)
    same(obs, "alive_in_shell", await fl.sh(sbx, f"kill -0 {handle.pid} && echo alive"), "alive\n")
    same(obs, "kill", await got(sbx.commands.kill(handle.pid)), True)
    listed_after = {p.pid for p in await got(sbx.commands.list())}
    same(obs, "listed_right_after_kill", handle.pid in listed_after, False)  # kill answers once it is gone
    exc = await raises(obs, "wait_after_kill", handle.wait, "CommandExitException")
    same(obs, "killed_exit_code", getattr(exc, "exit_code", None), -1)
    same(obs, "gone_in_shell", await fl.sh(sbx, f"kill -0 {handle.pid} 2>/dev/null || echo gone"), "gone\n")
    expect(handle.pid not in {p.pid for p in await got(sbx.commands.list())}, "a killed pid is still listed")
    same(obs, "kill_again", await got(sbx.commands.kill(handle.pid)), False)


@behaviour("stdin")
async def stdin(fl: Flavour, obs: Observed) -> None:
    sbx = await fl.shared()
    handle = await got(
        sbx.commands.run('while read -r line; do echo "got:$line"; done; echo eof', background=True, stdin=True)
    )
    await got(sbx.commands.send_stdin(handle.pid, "one\n"))
    await got(sbx.commands.send_stdin(handle.pid, "two ✓\n"))
    await got(sbx.commands.close_stdin(handle.pid))
    result = await got(handle.wait())
    same(obs, "stdout", result.stdout, "got:one\ngot:two ✓\neof\n")


@behaviour("stream_input")
async def stream_input(fl: Flavour, obs: Observed) -> None:
    sbx = await fl.shared()
    handle = await got(sbx.commands.run("cat; echo eof", background=True, stdin=True))
    lines = ["alpha\n", b"beta\n"]
    await _stream_input(fl, sbx.commands, handle.pid, lines)
    await got(sbx.commands.close_stdin(handle.pid))
    same(obs, "stdout", (await got(handle.wait())).stdout, "alpha\nbeta\neof\n")


async def _stream_input(fl: Flavour, owner: Any, pid: int, data: list[Any]) -> None:
    """`stream_input`: the sync client takes an iterable, the async one returns a handle to send with."""
    if fl.name == "sync":
        owner.stream_input(pid, iter(data))
        return
    handle = await got(owner.stream_input(pid))
    for item in data:
        await handle.send(item)
    await handle.close()


@behaviour("connect_command")
async def connect_command(fl: Flavour, obs: Observed) -> None:
    sbx = await fl.shared()
    flag = f"/tmp/bh-{fl.name}-go"
    handle = await got(
        sbx.commands.run(f"echo before; while [ ! -e {flag} ]; do sleep 0.05; done; echo after", background=True)
    )
    await got(handle.disconnect())
    same(obs, "alive_after_disconnect", await fl.sh(sbx, f"kill -0 {handle.pid} && echo alive"), "alive\n")
    again = await got(sbx.commands.connect(handle.pid))
    await fl.sh(sbx, f"touch {flag}")  # the later output is written only once connected again
    result = await got(again.wait())
    same(obs, "exit_code", result.exit_code, 0)
    expect(result.stdout.endswith("after\n"), f"connect() got stdout {result.stdout!r}, expected it to end 'after\\n'")


@behaviour("output_sizes")
async def output_sizes(fl: Flavour, obs: Observed) -> None:
    sbx = await fl.shared()
    wrong = {}
    for size in BOUNDARY_SIZES:
        result = await got(sbx.commands.run(f"head -c {size} /dev/zero | tr '\\0' 'y'"))
        if result.stdout != "y" * size:
            wrong[size] = len(result.stdout)
    same(obs, "wrong_lengths", wrong, {})


# --- files ---------------------------------------------------------------------------------------


@behaviour("write_read_sizes")
async def write_read_sizes(fl: Flavour, obs: Observed) -> None:
    sbx = await fl.shared()
    base = fl.dir("sizes")
    wrong: dict[str, Any] = {}
    for size in BOUNDARY_SIZES:
        data = os.urandom(size)
        path = f"{base}/f{size}.bin"
        await got(sbx.files.write(path, data))
        inside = (await fl.sh(sbx, f"stat -c %s {path}; sha256sum < {path}")).split()
        back = await got(sbx.files.read(path, format="bytes"))
        digest = hashlib.sha256(data).hexdigest()
        if inside[:2] != [str(size), digest] or bytes(back) != data:
            sha_ok = inside[1:2] == [digest]
            wrong[str(size)] = {"stat_size": inside[0], "sha_inside_ok": sha_ok, "read_back": len(back)}
    same(obs, "wrong_sizes", wrong, {})


@behaviour("read_formats")
async def read_formats(fl: Flavour, obs: Observed) -> None:
    sbx = await fl.shared()
    path = f"{fl.dir('formats')}.txt"
    text = "línea 1\n\tzwei\r\n三\n"
    await fl.sh(sbx, f"printf %s {shlex.quote(text)} > {path}")
    same(obs, "text", await got(sbx.files.read(path)), text)
    same(obs, "bytes", bytes(await got(sbx.files.read(path, format="bytes"))), text.encode())
    stream = await got(sbx.files.read(path, format="stream"))
    chunks = [c async for c in stream] if fl.name == "async" else list(stream)
    same(obs, "stream", b"".join(bytes(c) for c in chunks), text.encode())


@behaviour("write_files")
async def write_files(fl: Flavour, obs: Observed) -> None:
    from e2b.sandbox.filesystem.filesystem import WriteEntry

    sbx = await fl.shared()
    base = fl.dir("write-files")
    entries = [
        WriteEntry(path=f"{base}/a.txt", data="A"),
        WriteEntry(path=f"{base}/new/deeper/b.bin", data=b"\0B\xff"),
        WriteEntry(path=f"{base}/c.txt", data=""),
    ]
    infos = await got(sbx.files.write_files(entries))
    same(obs, "returned_paths", [i.path for i in infos], [e["path"] for e in entries])
    listing = await fl.sh(sbx, f"cd {base} && find . -type f | sort && od -An -tx1 new/deeper/b.bin && cat a.txt")
    same(obs, "in_shell", listing.split(), ["./a.txt", "./c.txt", "./new/deeper/b.bin", "00", "42", "ff", "A"])


@behaviour("list_depth")
async def list_depth(fl: Flavour, obs: Observed) -> None:
    sbx = await fl.shared()
    base = fl.dir("depth")
    await fl.sh(sbx, f"mkdir -p {base}/a/b/c && touch {base}/top.txt {base}/a/one.txt {base}/a/b/two.txt")
    for depth in (1, 2, 3):
        listed = sorted(e.path for e in await got(sbx.files.list(base, depth=depth)))
        found = sorted((await fl.sh(sbx, f"find {base} -mindepth 1 -maxdepth {depth}")).split())
        same(obs, f"depth_{depth}", listed, found)
    await raises(obs, "depth_0", lambda: sbx.files.list(base, depth=0), "InvalidArgumentException")


@behaviour("entry_info")
async def entry_info(fl: Flavour, obs: Observed) -> None:
    from e2b import FileType

    sbx = await fl.shared()
    base = fl.dir("info")
    await fl.sh(sbx, f"mkdir -p {base}/d && printf 12345 > {base}/f && chmod 640 {base}/f && ln -sfn f {base}/link")
    entry = await got(sbx.files.get_info(f"{base}/f"))
    stat = (await fl.sh(sbx, f"stat -c '%s %a %A %U %G %Y' {base}/f")).split()
    same(
        obs,
        "file",
        [entry.type, entry.size, oct(entry.mode), entry.permissions, entry.owner, entry.group],
        [FileType.FILE, int(stat[0]), oct(int(stat[1], 8)), stat[2], stat[3], stat[4]],
    )
    mtime = entry.modified_time.timestamp()
    expect(abs(mtime - int(stat[5])) <= 1, f"modified_time {entry.modified_time} vs {stat[5]}")
    link = await got(sbx.files.get_info(f"{base}/link"))
    same(obs, "symlink_target", link.symlink_target, f"{base}/f")
    directory = await got(sbx.files.get_info(f"{base}/d"))
    dstat = (await fl.sh(sbx, f"stat -c '%A %U' {base}/d")).split()
    same(obs, "dir", [directory.type, directory.permissions, directory.owner], [FileType.DIR, *dstat])


@behaviour("dir_mode")
async def dir_mode(fl: Flavour, obs: Observed) -> None:
    sbx = await fl.shared()
    path = fl.dir("dir-mode")
    await fl.sh(sbx, f"mkdir -p {path} && chmod 750 {path}")
    directory = await got(sbx.files.get_info(path))
    same(obs, "mode", oct(directory.mode), oct(int((await fl.sh(sbx, f"stat -c %a {path}")).strip(), 8)))


@behaviour("make_dir")
async def make_dir(fl: Flavour, obs: Observed) -> None:
    sbx = await fl.shared()
    path = f"{fl.dir('mkdir')}/x/y"
    same(obs, "first", await got(sbx.files.make_dir(path)), True)
    same(obs, "in_shell", await fl.sh(sbx, f"test -d {path} && stat -c %U {path}"), "user\n")
    same(obs, "again", await got(sbx.files.make_dir(path)), False)


@behaviour("rename")
async def rename(fl: Flavour, obs: Observed) -> None:
    sbx = await fl.shared()
    base = fl.dir("rename")
    await got(sbx.files.write(f"{base}/old.txt", "moved"))
    entry = await got(sbx.files.rename(f"{base}/old.txt", f"{base}/new.txt"))
    same(obs, "returned", [entry.path, entry.name], [f"{base}/new.txt", "new.txt"])
    same(obs, "in_shell", await fl.sh(sbx, f"test -e {base}/old.txt || cat {base}/new.txt"), "moved")
    await raises(obs, "missing_source", lambda: sbx.files.rename(f"{base}/nope", f"{base}/x"), "FileNotFoundException")


@behaviour("remove")
async def remove(fl: Flavour, obs: Observed) -> None:
    sbx = await fl.shared()
    base = fl.dir("remove")
    await fl.sh(sbx, f"mkdir -p {base}/tree/sub && touch {base}/file {base}/tree/sub/x")
    await got(sbx.files.remove(f"{base}/file"))
    await got(sbx.files.remove(f"{base}/tree"))
    same(obs, "in_shell", await fl.sh(sbx, f"ls -A {base}"), "")
    same(obs, "exists_after", await got(sbx.files.exists(f"{base}/tree")), False)


@behaviour("remove_missing")
async def remove_missing(fl: Flavour, obs: Observed) -> None:
    sbx = await fl.shared()
    path = f"{fl.dir('remove-missing')}/never-existed"
    await got(sbx.files.remove(path))  # envd removes with RemoveAll: a missing path is fine
    same(obs, "in_shell", await fl.sh(sbx, f"test -e {path} || echo absent"), "absent\n")


@behaviour("file_metadata")
async def file_metadata(fl: Flavour, obs: Observed) -> None:
    sbx = await fl.shared()
    path = f"{fl.dir('metadata')}.txt"
    await got(sbx.files.write(path, "m", metadata={"bh-owner": "suite", "bh-n": "1"}))
    same(obs, "get_info", (await got(sbx.files.get_info(path))).metadata, {"bh-owner": "suite", "bh-n": "1"})
    listed = {e.path: e.metadata for e in await got(sbx.files.list(USER_HOME))}
    same(obs, "listed", listed.get(path), {"bh-owner": "suite", "bh-n": "1"})
    xattrs = await fl.sh(sbx, f"{XATTRS} {path}")
    same(obs, "xattrs", xattrs, '[["user.e2b.bh-n", "1"], ["user.e2b.bh-owner", "suite"]]\n')


@behaviour("file_metadata_replaced")
async def file_metadata_replaced(fl: Flavour, obs: Observed) -> None:
    sbx = await fl.shared()
    path = f"{fl.dir('metadata-replaced')}.txt"
    await got(sbx.files.write(path, "m", metadata={"bh-owner": "suite"}))
    await got(sbx.files.write(path, "m2"))  # an upload without metadata clears it
    same(obs, "cleared", (await got(sbx.files.get_info(path))).metadata or {}, {})
    same(obs, "xattrs", await fl.sh(sbx, f"{XATTRS} {path}"), "[]\n")
    same(obs, "content", await fl.sh(sbx, f"cat {path}"), "m2")


@behaviour("exists")
async def exists(fl: Flavour, obs: Observed) -> None:
    sbx = await fl.shared()
    base = fl.dir("exists")
    await fl.sh(sbx, f"mkdir -p {base}/dir && touch {base}/file")
    seen = {name: await got(sbx.files.exists(f"{base}/{name}")) for name in ("dir", "file", "missing")}
    same(obs, "exists", seen, {"dir": True, "file": True, "missing": False})


@behaviour("write_as_user")
async def write_as_user(fl: Flavour, obs: Observed) -> None:
    sbx = await fl.shared()
    base = fl.dir("owner")
    await got(sbx.files.write(f"{base}/by-user.txt", "u"))
    await got(sbx.files.write(f"/tmp/bh-{fl.name}-by-root.txt", "r", user="root"))
    owners = await fl.sh(sbx, f"stat -c %U {base}/by-user.txt /tmp/bh-{fl.name}-by-root.txt")
    same(obs, "owners", owners.split(), ["user", "root"])
    # envd opens a download as root whoever asks (internal/api/download.go GetFiles): the username only expands
    # `~` and relative paths. So the default user reads a file only root may read, and a relative path read as
    # root is root's home's.
    secret = f"/root/bh-{fl.name}-root-only.txt"
    await got(sbx.files.write(f"bh-{fl.name}-root-only.txt", f"only root {fl.name}", user="root"))
    await fl.sh(sbx, f"chmod 600 {secret}", user="root")
    try:
        same(obs, "read_root_only", await got(sbx.files.read(secret)), f"only root {fl.name}")
        relative = await got(sbx.files.read(f"bh-{fl.name}-root-only.txt", user="root"))
        same(obs, "read_relative_as_root", relative, f"only root {fl.name}")
    finally:
        await fl.sh(sbx, f"rm -f {secret} /tmp/bh-{fl.name}-by-root.txt", user="root")


@behaviour("watch_recursive")
async def watch_recursive(fl: Flavour, obs: Observed) -> None:
    sbx = await fl.shared()
    base = fl.dir("watch")
    await fl.sh(sbx, f"mkdir -p {base}/sub")
    events: list[Any] = []
    if fl.name == "sync":
        handle = sbx.files.watch_dir(base, recursive=True)
    else:
        handle = await sbx.files.watch_dir(base, on_event=events.append, recursive=True)
    try:
        await fl.sh(sbx, f"echo x > {base}/sub/deep.txt; echo y > {base}/top.txt; rm {base}/top.txt")
        for _ in range(50):  # events are delivered asynchronously: poll until they arrive
            if fl.name == "sync":
                events.extend(handle.get_new_events())
            names = {(e.name, e.type.name) for e in events}
            if {("sub/deep.txt", "CREATE"), ("top.txt", "REMOVE")} <= names:
                break
            await asyncio.sleep(0.1)
    finally:  # a watcher left open holds a stream of the shared sandbox's envd
        await got(handle.stop())
    obs["events"] = sorted(f"{e.type.name} {e.name}" for e in events)
    names = {(e.name, e.type.name) for e in events}
    for wanted in (("sub/deep.txt", "CREATE"), ("top.txt", "CREATE"), ("top.txt", "REMOVE")):
        expect(wanted in names, f"no {wanted[1]} event for {wanted[0]} (recursive watch)")


@behaviour("signed_urls")
async def signed_urls(fl: Flavour, obs: Observed) -> None:
    sbx = await fl.new(secure=True)
    path = f"{USER_HOME}/signed-{fl.name}.bin"
    payload = os.urandom(3000)
    up = httpx.post(sbx.upload_url(path, use_signature_expiration=120), files={"file": ("x.bin", payload)})
    same(obs, "upload_status", up.status_code, 200)
    same(obs, "sha_inside", (await fl.sh(sbx, f"sha256sum < {path}")).split()[0], hashlib.sha256(payload).hexdigest())
    down = httpx.get(sbx.download_url(path, use_signature_expiration=120))
    same(obs, "download", [down.status_code, down.content == payload], [200, True])
    unsigned = httpx.get(sbx.download_url(path).split("?")[0], params={"path": path, "username": "user"})
    same(obs, "unsigned_refused", unsigned.status_code, 401)


@behaviour("gzip")
async def gzip_round_trip(fl: Flavour, obs: Observed) -> None:
    sbx = await fl.shared()
    path = f"{fl.dir('gzip')}.bin"
    data = os.urandom(70000) + b"z" * 70000
    await got(sbx.files.write(path, data, gzip=True))
    same(obs, "sha_inside", (await fl.sh(sbx, f"sha256sum < {path}")).split()[0], hashlib.sha256(data).hexdigest())
    same(obs, "read_back", bytes(await got(sbx.files.read(path, format="bytes", gzip=True))) == data, True)


# --- pty -----------------------------------------------------------------------------------------


async def pty_typed(
    fl: Flavour, sbx: Any, line: bytes, resize: tuple[int, int] | None = None
) -> tuple[bytes, int | None]:
    """Open a 24x80 pty (resized to `resize` rows and columns if given), type `line` and wait for its shell to
    end: the bytes the terminal sent and the exit code (0 when the wait did not raise)."""
    from e2b import PtySize

    output = bytearray()
    if fl.name == "sync":
        terminal = sbx.pty.create(PtySize(rows=24, cols=80))
    else:
        terminal = await sbx.pty.create(PtySize(rows=24, cols=80), on_data=output.extend)
    if resize is not None:
        await got(sbx.pty.resize(terminal.pid, PtySize(rows=resize[0], cols=resize[1])))
    await got(sbx.pty.send_stdin(terminal.pid, line + b"\n"))
    try:
        if fl.name == "sync":
            await got(terminal.wait(on_pty=output.extend))
        else:
            await terminal.wait()
    except Exception as exc:
        return bytes(output), getattr(exc, "exit_code", None)
    return bytes(output), 0


@behaviour("pty_resize_kill")
async def pty_resize_kill(fl: Flavour, obs: Observed) -> None:
    from e2b import PtySize

    sbx = await fl.shared()
    data, exit_code = await pty_typed(fl, sbx, b"stty size; exit 4", resize=(33, 111))
    text = data.decode(errors="replace")
    obs["output"] = excerpt(text)
    expect("33 111" in text, "stty size inside the pty does not show the resized 33 111")
    same(obs, "exit_code", exit_code, 4)
    second = (
        await got(sbx.pty.create(PtySize(rows=10, cols=40)))
        if fl.name == "sync"
        else await sbx.pty.create(PtySize(rows=10, cols=40), on_data=lambda _: None)
    )
    same(obs, "kill", await got(sbx.pty.kill(second.pid)), True)
    killed = await raises(obs, "wait_after_kill", second.wait, "CommandExitException")
    same(obs, "killed_exit_code", getattr(killed, "exit_code", None), -1)
    same(obs, "gone_in_shell", await fl.sh(sbx, f"kill -0 {second.pid} 2>/dev/null || echo gone"), "gone\n")


@behaviour("pty_connect_input")
async def pty_connect_input(fl: Flavour, obs: Observed) -> None:
    from e2b import PtySize

    sbx = await fl.shared()
    output = bytearray()
    if fl.name == "sync":
        first = sbx.pty.create(PtySize(rows=24, cols=80))
        first.disconnect()
        again = sbx.pty.connect(first.pid)
    else:
        first = await sbx.pty.create(PtySize(rows=24, cols=80), on_data=lambda _: None)
        await first.disconnect()
        again = await sbx.pty.connect(first.pid, on_data=output.extend)
    data = [b"echo pty-$((6*7))\n", "exit 0\n"]
    await _stream_input(fl, sbx.pty, first.pid, data)
    if fl.name == "sync":
        await got(again.wait(on_pty=output.extend))
    else:
        await again.wait()
    obs["output"] = excerpt(output.decode(errors="replace"))
    expect("pty-42" in output.decode(errors="replace"), "the reconnected pty did not run the streamed input")


# --- errors --------------------------------------------------------------------------------------


@behaviour("errors")
async def errors(fl: Flavour, obs: Observed) -> None:
    sbx = await fl.shared()
    await raises(
        obs,
        "unknown_sandbox",
        lambda: fl.Sandbox.connect("bh-no-such-sandbox"),
        "SandboxNotFoundException",
        "NotFoundException",
    )
    await raises(obs, "wrong_key", lambda: fl.Sandbox.list(api_key=WRONG_KEY).next_items(), "AuthenticationException")
    await raises(obs, "read_missing", lambda: sbx.files.read(f"{USER_HOME}/bh-missing"), "FileNotFoundException")
    await raises(obs, "list_a_file", lambda: sbx.files.list("/etc/hostname"), "InvalidArgumentException")
    await raises(obs, "info_missing", lambda: sbx.files.get_info("/nope/nope"), "FileNotFoundException")
    with rest() as client:
        missing = client.get("/sandboxes/bh-no-such-sandbox").status_code
    wrong_key = httpx.get(f"{os.environ['E2B_API_URL']}/v2/sandboxes", headers={"X-API-KEY": WRONG_KEY}).status_code
    statuses = [missing, wrong_key]
    same(obs, "rest_statuses", statuses, [404, 401])


# --- what envd does where compatibility layers differ ----------------------------------------------


@behaviour("proc_file_read")
async def proc_file_read(fl: Flavour, obs: Observed) -> None:
    """A file whose stat size is 0 but has content (/proc) is read whole, and the next read still works."""
    sbx = await fl.shared()
    hostname = await got(sbx.files.read(PROC_FILE))
    ostype = await got(sbx.files.read("/proc/sys/kernel/ostype"))
    size, shell_hostname, shell_ostype = (
        await fl.sh(sbx, f"stat -c %s {PROC_FILE}; cat {PROC_FILE}; uname -s")
    ).split()
    same(obs, "stat_size", size, "0")
    same(obs, "read", hostname, shell_hostname + "\n")
    same(obs, "next_read", ostype, shell_ostype + "\n")


@behaviour("kill_cuts_stream")
async def kill_cuts_stream(fl: Flavour, obs: Observed) -> None:
    """Killing a sandbox cuts a running command's streams as E2B's proxy loses the VM: the connection ends with
    no end event and no end message (a raw Connect stream of the process shows it), so wait() raises the SDK's
    timeout error saying the sandbox was killed ('killed or reached its end of life'), never an exit code."""
    sbx = await fl.new()
    handle = await got(sbx.commands.run("echo started; sleep 600", background=True))
    made = {"sandboxID": sbx.sandbox_id, "envdAccessToken": getattr(sbx, "_envd_access_token", None) or ""}
    # The cut comes with the kill: a stream still open this long after the kill answered was not cut (waiting for
    # the command to end instead cost an endpoint that ignores kills the command's whole run, twice a run).
    cut_s = KILL_CUT_S * fl.ctx.slowness
    with httpx.Client(timeout=httpx.Timeout(30 * fl.ctx.slowness, read=cut_s)) as client:
        raw = RpcStream(client, made, "/process.Process/Connect", {"process": {"pid": handle.pid}})
        try:
            opened = raw.next_event() or {}
            same(obs, "raw_stream_opened", "start" in opened, True)
            with rest() as api:
                same(obs, "rest_kill", api.delete(f"/sandboxes/{sbx.sandbox_id}").status_code, 204)
            try:
                raw.until(lambda: False, cut_s)
                if raw.error:
                    ending = f"an end message: {raw.error!r}"
                elif raw.ended:
                    ending = f"a clean end, end event {raw.end}"
                else:
                    ending = "still open after the kill"  # keep-alives came, nothing else
            except httpx.ReadTimeout:
                ending = "still open after the kill"
            except httpx.TransportError:
                ending = "connection lost"
        finally:
            raw.close()
    if ending == "still open after the kill":
        obs["waited_s"] = round(cut_s, 1)
    same(obs, "raw_stream_ended_by", ending, "connection lost")
    try:
        result = await got(handle.wait())
    except Exception as exc:
        obs["raised"] = exception_details(exc)
        kinds = [cls.__name__ for cls in type(exc).__mro__]
        expect("TimeoutException" in kinds, f"wait() raised {type(exc).__name__}: {exc}, expected a TimeoutException")
        # What each SDK says once its health probe found the sandbox gone after the connection was lost.
        expect(
            "killed or reached its end of life" in str(exc), f"wait() raised {exc}: the SDK was not told it was killed"
        )
        return
    raise Fail(f"wait() returned exit code {result.exit_code!r}: the stream of a killed sandbox ended cleanly")


@behaviour("signed_url_refusals")
async def signed_url_refusals(fl: Flavour, obs: Observed) -> None:
    """A signed URL that expired, or whose signature is wrong, is refused with 401 and envd's message."""
    sbx = await fl.new(secure=True)
    path = f"{USER_HOME}/signed-refusal.txt"
    await got(sbx.files.write(path, "s"))
    expired = await got(sbx.download_url(path, use_signature_expiration=-10))
    valid = await got(sbx.download_url(path, use_signature_expiration=120))
    forged = valid.replace("signature=v1_", "signature=v1_x")
    answers = [httpx.get(url) for url in (valid, expired, forged)]
    same(obs, "valid", [answers[0].status_code, answers[0].text], [200, "s"])
    same(
        obs,
        "refused",
        [(a.status_code, a.json().get("message")) for a in answers[1:]],
        [(401, "signature is already expired"), (401, "invalid signature")],
    )


@behaviour("pause_filesystem")
async def pause_filesystem(fl: Flavour, obs: Observed) -> None:
    """pause(mode="filesystem") keeps the files only: resume cold-boots (no process left, a new pid 1,
    a new boot id)."""
    if "mode" not in inspect.signature(fl.Sandbox.pause).parameters:
        raise Skip("Sandbox.pause(mode=...)")  # an older SDK takes no mode (and pauses with memory)
    sbx = await fl.new()
    await fl.sh(sbx, f"echo on-disk > {USER_HOME}/kept; {KEEP_RUNNING}")
    before = (await fl.sh(sbx, BOOT_STATE)).split()
    expect(await got(sbx.pause(mode="filesystem")) is True, "pause(mode='filesystem') did not return True")
    same(obs, "rest_state_paused", rest_get(sbx.sandbox_id).json().get("state"), "paused")
    resumed = await got(fl.Sandbox.connect(sbx.sandbox_id))
    after = (await fl.sh(resumed, BOOT_STATE)).split()
    obs["before"], obs["after"] = before, after
    same(obs, "files_kept_processes_gone", [before[2:], after[2:]], [["1", "on-disk"], ["0", "on-disk"]])
    expect(before[0] != after[0], "the boot id did not change: the resume restored memory instead of booting")
    expect(before[1] != after[1], "pid 1 is the same process: the resume restored memory instead of booting")


# fidelity: wake on traffic, host masking, watch events

# A server answering every GET with the Host header it got (the sandbox's side of host masking), or with the
# contents of a file: what a port request through the endpoint reaches.
HOST_ECHO = (
    "import http.server, sys\n"
    "class H(http.server.BaseHTTPRequestHandler):\n"
    "    def do_GET(self):\n"
    "        body = (self.headers.get('Host') or '').encode()\n"
    "        self.send_response(200); self.send_header('Content-Length', str(len(body))); self.end_headers()\n"
    "        self.wfile.write(body)\n"
    "    def log_message(self, *args): pass\n"
    "http.server.HTTPServer(('127.0.0.1', int(sys.argv[1])), H).serve_forever()\n"
)
MASK_TEMPLATE = "bench-masked.internal:${PORT}"


async def serve_host_echo(fl: Flavour, sbx: Any, port: int) -> None:
    """HOST_ECHO on `port` of the sandbox's loopback, answering before this returns."""
    script = f"/tmp/bh-host-echo-{port}.py"
    await got(sbx.files.write(script, HOST_ECHO))
    await fl.sh(sbx, f"nohup python3 {script} {port} >/dev/null 2>&1 &")
    ready = f"for i in $(seq 100); do curl -s -o /dev/null localhost:{port} && echo up && break; sleep 0.1; done"
    expect((await fl.sh(sbx, ready)).strip() == "up", f"the sandbox's server on port {port} did not start")


def port_get(sandbox_id: str, host: str, port: int) -> httpx.Response:
    """A GET of a sandbox port through the endpoint: routed by headers at E2B_SANDBOX_URL when one is set, else
    at the host name `get_host` gives, as E2B routes it."""
    base = os.environ.get("E2B_SANDBOX_URL")
    if base:
        routed = {"E2b-Sandbox-Id": sandbox_id, "E2b-Sandbox-Port": str(port)}
        return httpx.get(base, headers=routed, timeout=60)
    return httpx.get(f"https://{host}", timeout=60)


def end_at(sandbox_id: str) -> float:
    return parse_time(rest_get(sandbox_id).json()["endAt"]).timestamp()


@behaviour("auto_resume_wakes_on_traffic")
async def auto_resume_wakes_on_traffic(fl: Flavour, obs: Observed) -> None:
    """lifecycle auto_resume: a paused sandbox is woken by an envd request and by a port request, each of which
    waits and succeeds; it runs again (SDK and REST) with its timeout restarted. Without it both requests get
    E2B's paused-sandbox answer and the sandbox stays paused."""
    if "lifecycle" not in inspect.signature(fl.Sandbox.create).parameters:
        raise Skip("Sandbox.create(lifecycle=...)")
    port = 8137
    for wakes in (True, False):
        label = "auto_resume" if wakes else "no_auto_resume"
        sbx = await fl.new(lifecycle={"on_timeout": "pause", "auto_resume": wakes})
        await serve_host_echo(fl, sbx, port)
        host = sbx.get_host(port)
        for request in ("envd", "port"):
            before = end_at(sbx.sandbox_id)
            expect(await got(sbx.pause()) is True, f"{label}: pause() did not return True")
            same(obs, f"{label}_{request}_paused", rest_get(sbx.sandbox_id).json().get("state"), "paused")
            if request == "envd":
                try:
                    answer: Any = (await got(sbx.commands.run("echo awake"))).stdout
                except Exception as exc:
                    answer = f"{type(exc).__name__}: {exc}"
            else:
                response = port_get(sbx.sandbox_id, host, port)
                answer = [response.status_code, response.text if response.status_code == 200 else response.json()]
            obs[f"{label}_{request}_answer"] = answer
            state = rest_get(sbx.sandbox_id).json().get("state")
            if wakes:
                if request == "port":
                    expect(answer[0] == 200 and bool(answer[1]), f"a port request to the paused sandbox got {answer}")
                else:
                    same(obs, f"{label}_envd_result", answer, "awake\n")
                same(obs, f"{label}_{request}_rest_state", state, "running")
                info = await got(sbx.get_info())
                same(obs, f"{label}_{request}_sdk_state", getattr(info.state, "value", info.state), "running")
                after = end_at(sbx.sandbox_id)
                obs[f"{label}_{request}_end_at_moved_s"] = round(after - before, 1)
                expect(after > before, f"the wake on {request} traffic did not restart the timeout (endAt stayed)")
            else:
                if request == "envd":
                    # The SDKs word it differently (the npm one names only the status): the paused state or the 409.
                    paused = re.search(r"paused|\b409\b", str(answer).lower())
                    expect(paused is not None, f"an envd request to a paused sandbox got {answer!r}")
                else:
                    body = answer[1] if isinstance(answer[1], dict) else {}
                    same(obs, f"{label}_port_status", answer[0], 409)
                    same(obs, f"{label}_port_message", body.get("message"), "The sandbox is paused")
                same(obs, f"{label}_{request}_stays_paused", state, "paused")
                await got(fl.Sandbox.connect(sbx.sandbox_id))  # resumed by hand for the next request


@behaviour("mask_request_host")
async def mask_request_host(fl: Flavour, obs: Observed) -> None:
    """network mask_request_host: a server in the sandbox sees that Host, ${PORT} replaced by the port asked
    for; a sandbox without it sees the caller's Host."""
    try:
        from e2b.sandbox.sandbox_api import SandboxNetworkOpts
    except ImportError:
        raise Skip("network mask_request_host") from None  # an older SDK has no network options
    if "mask_request_host" not in getattr(SandboxNetworkOpts, "__annotations__", {}):
        raise Skip("network mask_request_host")
    port = 8138
    masked = await fl.new(network={"mask_request_host": MASK_TEMPLATE})
    network = rest_get(masked.sandbox_id).json().get("network") or {}
    same(obs, "rest_mask_request_host", network.get("maskRequestHost"), MASK_TEMPLATE)
    plain = await fl.shared()
    seen = {}
    for name, sbx in (("masked", masked), ("plain", plain)):
        await serve_host_echo(fl, sbx, port)
        response = port_get(sbx.sandbox_id, sbx.get_host(port), port)
        same(obs, f"{name}_status", response.status_code, 200)
        seen[name] = response.text
    same(obs, "masked_host_seen", seen["masked"], MASK_TEMPLATE.replace("${PORT}", str(port)))
    obs["plain_host_seen"] = seen["plain"]
    expect(bool(seen["plain"]) and "bench-masked" not in seen["plain"], "a sandbox without the mask saw a masked Host")


# envd's events for each operation, as its inotify watcher (fsnotify) reports them: (type, name relative to
# the watched directory). The watch is recursive and `sub` exists before it starts.
WATCH_OPERATIONS = (
    ("upload a new file", [("CREATE", "up.txt"), ("CHMOD", "up.txt"), ("WRITE", "up.txt")]),
    ("append in a shell", [("WRITE", "up.txt")]),
    ("rename", [("RENAME", "up.txt"), ("CREATE", "moved.txt")]),
    ("chmod in a shell", [("CHMOD", "moved.txt")]),
    ("make_dir", [("CREATE", "made"), ("CHMOD", "made")]),
    ("remove a file", [("REMOVE", "moved.txt")]),
    ("upload into a subdirectory", [("CREATE", "sub/in.txt"), ("CHMOD", "sub/in.txt"), ("WRITE", "sub/in.txt")]),
)
# Other sequences envd gives for an operation, as they come by chance. make_dir: envd mkdirs then chowns
# (permissions.EnsureDirs); its recursive watcher adds the new directory as it learns of it, and when that add wins
# the race with the chown, the directory's own watch reports the chown too (a second CHMOD of the same name).
WATCH_ALSO: dict[str, list[list[tuple[str, str]]]] = {
    "make_dir": [[("CREATE", "made"), ("CHMOD", "made"), ("CHMOD", "made")]],
}


def watch_mismatches(got_events: dict[str, list[tuple[str, str]]]) -> dict[str, Any]:
    """Each operation whose events are none of the sequences envd gives for it: what came, what envd gives."""
    wrong: dict[str, Any] = {}
    for label, wanted in WATCH_OPERATIONS:
        accepted = [wanted, *WATCH_ALSO.get(label, [])]
        if got_events.get(label) not in accepted:
            wrong[label] = {"got": got_events.get(label), "envd_gives": accepted if len(accepted) > 1 else wanted}
    return wrong


E2B_DEFAULT_LIFETIME_S = 300  # the SDKs' default lifetime, which an endpoint ignoring a create's timeout may well give
WATCH_WAIT_S = 60  # bounds a wait for an event that arrives in milliseconds
KILL_CUT_S = 5.0  # bounds the wait, once a kill answered, for the killed sandbox's streams to be cut (quiet host)


@behaviour("watch_events_match_envd")
async def watch_events_match_envd(fl: Flavour, obs: Observed) -> None:
    """Each operation's events, exactly: after each, a marker directory is made in a shell, and the events up to
    the marker's CREATE are that operation's (inotify keeps their order). Removing the watched directory then
    ends the watch as envd's does: REMOVE '.' last, and the handle stops cleanly."""
    sbx = await fl.shared()
    base = fl.dir("watch-envd")
    await fl.sh(sbx, f"rm -rf {base}; mkdir -p {base}/sub")
    events: list[Any] = []
    if fl.name == "sync":
        handle = sbx.files.watch_dir(base, recursive=True)
    else:
        handle = await sbx.files.watch_dir(base, on_event=events.append, recursive=True)
    try:

        async def until(done: Callable[[list[tuple[str, str]]], bool]) -> list[tuple[str, str]]:
            deadline = time.monotonic() + WATCH_WAIT_S
            while True:
                if fl.name == "sync":
                    events.extend(handle.get_new_events())
                seen = [(e.type.name, e.name) for e in events]
                if done(seen) or time.monotonic() > deadline:
                    return seen
                await asyncio.sleep(0.05)

        actions: list[Callable[[], Any]] = [
            lambda: sbx.files.write(f"{base}/up.txt", "hello"),
            lambda: sbx.commands.run(f"printf more >> {base}/up.txt"),
            lambda: sbx.files.rename(f"{base}/up.txt", f"{base}/moved.txt"),
            lambda: sbx.commands.run(f"chmod 600 {base}/moved.txt"),
            lambda: sbx.files.make_dir(f"{base}/made"),
            lambda: sbx.files.remove(f"{base}/moved.txt"),
            lambda: sbx.files.write(f"{base}/sub/in.txt", "nested"),
        ]
        got_events: dict[str, list[tuple[str, str]]] = {}
        for n, ((label, _), action) in enumerate(zip(WATCH_OPERATIONS, actions, strict=True)):
            await got(action())
            marker = ("CREATE", f"mark-{n}")
            await fl.sh(sbx, f"mkdir {base}/mark-{n}")
            seen = await until(lambda seen, marker=marker: marker in seen)
            expect(marker in seen, f"{label}: no event arrived in {WATCH_WAIT_S} s")
            cut = seen.index(marker)
            got_events[label] = [e for e in seen[:cut] if not e[1].startswith("mark-")]
            del events[: cut + 1]
        obs["events"] = {label: [" ".join(e) for e in found] for label, found in got_events.items()}
        obs["events_per_operation"] = got_events
        wrong = watch_mismatches(got_events)
        if wrong:
            raise Fail(f"events_per_operation: {excerpt(repr(wrong))}")
        await got(sbx.files.remove(base))
        seen = await until(lambda seen: ("REMOVE", ".") in seen)
        obs["events_of_removal"] = [" ".join(e) for e in seen]
        expect(bool(seen) and seen[-1] == ("REMOVE", "."), "removing the watched directory did not end with REMOVE '.'")
        expect({kind for kind, _ in seen} == {"REMOVE"}, f"removing the watched directory gave {seen}")
    finally:
        await got(handle.stop())


# --- fidelity: field table and second-path checks ------------------------------------------------
# What an SDK call reports, compared with what the sandbox itself shows; options that end with their call;
# bytes envd defines; and the REST and envd options no SDK call takes, each by its effect.

# Inside the sandbox: its CPU count (the cgroup's cpu.max quota over its period where one is set, else the
# CPUs it may run on) and its memory in MiB (the cgroup's memory.max where set, else MemTotal).
SANDBOX_RESOURCES = """python3 - <<'EOF'
import math, os
def read(path):
    try:
        return open(path).read().split()
    except OSError:
        return []
v1 = "/sys/fs/cgroup/cpu/cpu.cfs_"
quota = read("/sys/fs/cgroup/cpu.max") or read(v1 + "quota_us") + read(v1 + "period_us")
limited = len(quota) == 2 and quota[0].isdigit() and int(quota[0]) > 0
cpus = math.ceil(int(quota[0]) / int(quota[1])) if limited else len(os.sched_getaffinity(0))
limit = (read("/sys/fs/cgroup/memory.max") or read("/sys/fs/cgroup/memory/memory.limit_in_bytes") or ["max"])[0]
meminfo = dict(line.split(":", 1) for line in open("/proc/meminfo"))
total = int(meminfo["MemTotal"].split()[0]) * 1024
capped = limit.isdigit() and int(limit) < total
print(cpus, (int(limit) if capped else total) >> 20, "cgroup" if capped else "meminfo")
EOF"""


def memory_agrees(reported_mb: int, seen_mb: int, source: str) -> bool:
    """A cgroup limit is exact; a VM's MemTotal is what is left after the kernel's own share (at most 15%)."""
    return seen_mb == reported_mb if source == "cgroup" else 0.85 * reported_mb <= seen_mb <= reported_mb


@behaviour("reported_resources")
async def reported_resources(fl: Flavour, obs: Observed) -> None:
    from e2b import SandboxQuery

    mark = f"{fl.ctx.run_id}-{fl.name}-resources"
    sbx = await fl.new(metadata={"bh-resources": mark})
    cpus, memory_mb, source = (await fl.sh(sbx, SANDBOX_RESOURCES)).split()
    obs["inside"] = {"cpus": int(cpus), "memory_mb": int(memory_mb), "source": source}
    info = await got(sbx.get_info())
    same(obs, "get_info_cpu_count_is_the_sandboxs", info.cpu_count, int(cpus))
    expect(
        memory_agrees(info.memory_mb, int(memory_mb), source),
        f"get_info memoryMB {info.memory_mb}, the sandbox has {memory_mb} MiB ({source})",
    )
    listed = [s for s in await got(fl.Sandbox.list(query=SandboxQuery(metadata={"bh-resources": mark})).next_items())]
    same(obs, "listed_once", [s.sandbox_id for s in listed], [sbx.sandbox_id])
    fields = ("template_id", "cpu_count", "memory_mb", "metadata", "started_at", "end_at")
    same(
        obs,
        "list_entry_equals_get_info",
        {f: str(getattr(listed[0], f, None)) for f in fields},
        {f: str(getattr(info, f, None)) for f in fields},
    )
    samples = await got(sbx.get_metrics())
    expect(len(samples) >= 1, "get_metrics() returned no sample")
    same(obs, "metrics_cpu_count_is_the_sandboxs", samples[-1].cpu_count, int(cpus))
    expect(
        memory_agrees(samples[-1].mem_total >> 20, int(memory_mb), source),
        f"metrics mem_total {samples[-1].mem_total} bytes, the sandbox has {memory_mb} MiB ({source})",
    )


@behaviour("file_info_current")
async def file_info_current(fl: Flavour, obs: Observed) -> None:
    sbx = await fl.shared()
    base = fl.dir("current")
    path = f"{base}/grows"
    await fl.sh(sbx, f"mkdir -p {base} && printf 1 > {path} && touch -d @1000000000 {path}")
    await got(sbx.files.get_info(path))  # an answer an endpoint could keep
    await fl.sh(sbx, f"printf 23456789 >> {path} && chmod 600 {path} && touch -d @1500000000 {path}")
    stat = (await fl.sh(sbx, f"stat -c '%s %a %A %Y' {path}")).split()
    wanted = [int(stat[0]), oct(int(stat[1], 8)), stat[2], int(stat[3])]
    entry = await got(sbx.files.get_info(path))
    same(
        obs,
        "get_info_is_stat_now",
        [entry.size, oct(entry.mode), entry.permissions, int(entry.modified_time.timestamp())],
        wanted,
    )
    listed = [e for e in await got(sbx.files.list(base)) if e.name == "grows"]
    expect(len(listed) == 1, f"files.list({base}) does not list the file once: {listed!r}")
    same(
        obs,
        "list_is_stat_now",
        [listed[0].size, oct(listed[0].mode), listed[0].permissions, int(listed[0].modified_time.timestamp())],
        wanted,
    )


# Inside the sandbox, as its user: a process's command line (one argument a line), then its cwd and its BH_PROC.
# The command's shell has run its profile once its body (`sleep`) is its child: its cwd is then the one it runs
# in (read earlier, a login profile's `cd` may not have happened yet).
PROC_VIEW = (
    "i=0; while [ ! -s /proc/{pid}/task/{pid}/children ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i+1)); done; "
    "tr '\\0' '\\n' < /proc/{pid}/cmdline; echo --; readlink /proc/{pid}/cwd; "
    "tr '\\0' '\\n' < /proc/{pid}/environ | grep ^BH_PROC="
)


@behaviour("process_info")
async def process_info(fl: Flavour, obs: Observed) -> None:
    sbx = await fl.shared()
    handle = await got(sbx.commands.run("sleep 47; true", background=True, envs={"BH_PROC": fl.name}, cwd="/tmp"))
    try:
        listed = [p for p in await got(sbx.commands.list()) if p.pid == handle.pid]
        expect(len(listed) == 1, f"pid {handle.pid} is not listed once by commands.list()")
        command, _, rest = (await fl.sh(sbx, PROC_VIEW.format(pid=handle.pid))).partition("--\n")
        cwd, env = rest.split()
        same(obs, "command_line", [listed[0].cmd, *listed[0].args], command.splitlines())
        same(obs, "cwd", [listed[0].cwd, cwd], ["/tmp", "/tmp"])
        same(obs, "env", [listed[0].envs.get("BH_PROC"), env], [fl.name, f"BH_PROC={fl.name}"])
    finally:
        await got(sbx.commands.kill(handle.pid))


@behaviour("options_end_with_call")
async def options_end_with_call(fl: Flavour, obs: Observed) -> None:
    sbx = await fl.new()  # its own: an option that outlives its call would change later cases' commands
    given = await got(
        sbx.commands.run('pwd; whoami; printf %s "$BH_ONCE"', envs={"BH_ONCE": "1"}, cwd="/tmp", user="root")
    )
    same(obs, "given", given.stdout, "/tmp\nroot\n1")
    same(obs, "next_call", await fl.sh(sbx, 'pwd; whoami; printf %s "${BH_ONCE-unset}"'), f"{USER_HOME}\nuser\nunset")
    await raises(obs, "short_timeout", lambda: sbx.commands.run("sleep 21.6", timeout=1), *DEADLINE_ENDS)
    same(obs, "next_call_outlives_one_second", await fl.sh(sbx, "sleep 2.5; echo done"), "done\n")


@behaviour("pty_bytes")
async def pty_bytes(fl: Flavour, obs: Observed) -> None:
    """A pty's output is the terminal's: the typed line echoed, every line ending CR LF (onlcr)."""

    typed = b"printf 'bh-one\\nbh-two\\n'; exit 3"
    data, exit_code = await pty_typed(fl, await fl.shared(), typed)
    obs["output"] = excerpt(data.decode(errors="replace"))
    expect(typed in data, "the typed line is not echoed by the pty")
    expect(b"bh-one\r\nbh-two\r\n" in data, "the command's lines do not end CR LF as a terminal sends them")
    bare = data.replace(b"\r\n", b"").count(b"\n")
    same(obs, "line_feeds_without_cr", bare, 0)
    same(obs, "exit_code", exit_code, 3)


def envd_headers(made: dict[str, Any], content_type: str, user: str = "user") -> dict[str, str]:
    import base64

    return {
        "E2b-Sandbox-Id": made["sandboxID"],
        "X-Access-Token": made.get("envdAccessToken") or "",
        "Connect-Protocol-Version": "1",
        "Content-Type": content_type,
        "Authorization": "Basic " + base64.b64encode(f"{user}:".encode()).decode(),
    }


def envd_base(sandbox_id: str) -> str:
    if os.environ.get("E2B_SANDBOX_URL"):
        return os.environ["E2B_SANDBOX_URL"].rstrip("/")
    return f"https://49983-{sandbox_id}.{os.environ.get('E2B_DOMAIN', 'e2b.app')}"


def envelope(message: dict[str, Any]) -> bytes:
    import json

    payload = json.dumps(message).encode()
    return b"\0" + len(payload).to_bytes(4, "big") + payload


class RpcStream:
    """A server stream of envd (Connect, JSON): its events as they come, decoded."""

    def __init__(self, client: httpx.Client, made: dict[str, Any], rpc: str, message: dict[str, Any]) -> None:
        self.context = client.stream(
            "POST",
            f"{envd_base(made['sandboxID'])}{rpc}",
            content=envelope(message),
            headers=envd_headers(made, "application/connect+json"),
        )
        self.response = self.context.__enter__()
        self.chunks = self.response.iter_raw()
        self.buffer = bytearray()
        self.output = bytearray()
        self.end: dict[str, Any] | None = None
        self.error = ""  # the stream's error, as its trailer (or a refused request) says it
        self.ended = False  # the stream's body ended (its trailer, or the response closed cleanly)

    def next_event(self) -> dict[str, Any] | None:
        import json

        if self.response.status_code != 200:
            self.error = f"HTTP {self.response.status_code}: {excerpt(self.response.read().decode(errors='replace'))}"
            return None
        while len(self.buffer) < 5 or len(self.buffer) < 5 + int.from_bytes(self.buffer[1:5], "big"):
            chunk = next(self.chunks, None)
            if chunk is None:
                self.ended = True
                return None
            self.buffer += chunk
        size = int.from_bytes(self.buffer[1:5], "big")
        flags, payload = self.buffer[0], bytes(self.buffer[5 : 5 + size])
        del self.buffer[: 5 + size]
        if flags & 2:  # the stream's trailer
            self.ended = True
            self.error = str((json.loads(payload or b"{}").get("error") or {}).get("message", ""))
            return None
        return json.loads(payload).get("event", {})

    def until(self, found: Callable[[], bool], seconds: float) -> None:
        """Read events (data gathered, the end kept) until `found()`, the stream's end or `seconds` (keep-alives
        come between)."""
        import base64

        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if found():
                return
            event = self.next_event()
            if event is None:
                return
            data = event.get("data") or {}
            for kind in ("stdout", "pty"):
                if kind in data:
                    self.output += base64.b64decode(data[kind])
            if "end" in event:
                self.end = event["end"]

    def close(self) -> None:
        self.context.__exit__(None, None, None)


@behaviour("process_selectors")
async def process_selectors(fl: Flavour, obs: Observed) -> None:
    """A process chosen by its tag (Connect, Update, SendInput, StreamInput, CloseStdin, SendSignal), as no SDK
    call does: each reaches the tagged process, seen in its output, its pty size and how it ended."""
    import base64

    with rest() as api:
        made = api.post(
            "/sandboxes",
            json={
                "templateID": fl.ctx.template or "base",
                "timeout": fl.ctx.sandbox_timeout_s,
                "metadata": fl.ctx.metadata,
            },
        ).json()
    fl.ctx.created.append(made["sandboxID"])
    pty_tag, cat_tag = f"bh-pty-{fl.name}", f"bh-cat-{fl.name}"
    b64 = lambda text: base64.b64encode(text.encode()).decode()  # noqa: E731
    with httpx.Client(timeout=30) as client:

        def unary(rpc: str, message: dict[str, Any]) -> int:
            url = f"{envd_base(made['sandboxID'])}/process.Process/{rpc}"
            return client.post(url, json=message, headers=envd_headers(made, "application/json")).status_code

        script = "stty size; read line; echo got:$line; stty size; exec sleep 60"
        started = {"process": {"cmd": "/bin/sh", "args": ["-c", script]}, "tag": pty_tag}
        shell = RpcStream(
            client, made, "/process.Process/Start", {**started, "pty": {"size": {"cols": 40, "rows": 10}}}
        )
        cat = RpcStream(
            client, made, "/process.Process/Start", {"process": {"cmd": "/bin/cat"}, "stdin": True, "tag": cat_tag}
        )
        try:
            pid, cat_pid = ((stream.next_event() or {}).get("start", {}).get("pid") for stream in (shell, cat))
            errors = "; ".join(stream.error for stream in (shell, cat) if stream.error)
            expect(isinstance(pid, int) and isinstance(cat_pid, int), f"Start did not begin with a pid: {errors}")
            wait = 20 * fl.ctx.slowness
            shell.until(lambda: b"10 40" in shell.output, wait)
            watcher = RpcStream(client, made, "/process.Process/Connect", {"process": {"tag": pty_tag}})
            same(obs, "connect_by_tag_pid", (watcher.next_event() or {}).get("start", {}).get("pid"), pid)
            same(
                obs,
                "update_by_tag",
                unary("Update", {"process": {"tag": pty_tag}, "pty": {"size": {"cols": 77, "rows": 22}}}),
                200,
            )
            same(
                obs,
                "send_input_by_tag",
                unary("SendInput", {"process": {"tag": pty_tag}, "input": {"pty": b64("bh-line\n")}}),
                200,
            )
            # The script prints its size again after the line it read: that line ends the wait, whatever the size.
            watcher.until(lambda: re.search(rb"got:bh-line\r?\n\d+ \d+\r?\n", watcher.output) is not None, wait)
            text = watcher.output.decode(errors="replace")
            obs["connected_output"] = excerpt(text)
            expect("got:bh-line" in text and "22 77" in text, "the tagged pty did not get its input or its new size")
            same(
                obs,
                "signal_by_tag",
                unary("SendSignal", {"process": {"tag": pty_tag}, "signal": "SIGNAL_SIGTERM"}),
                200,
            )
            shell.until(lambda: shell.end is not None, wait)
            same(obs, "ended_by_sigterm", (shell.end or {}).get("status"), "signal: terminated")
            watcher.close()

            same(
                obs,
                "send_stdin_by_tag",
                unary("SendInput", {"process": {"tag": cat_tag}, "input": {"stdin": b64("one\n")}}),
                200,
            )
            streamed = client.post(
                f"{envd_base(made['sandboxID'])}/process.Process/StreamInput",
                content=envelope({"start": {"process": {"tag": cat_tag}}})
                + envelope({"data": {"input": {"stdin": b64("two\n")}}}),
                headers=envd_headers(made, "application/connect+json"),
            )
            same(obs, "stream_input_by_tag", streamed.status_code, 200)
            cat.until(lambda: b"two" in cat.output, wait)
            same(obs, "close_stdin_by_tag", unary("CloseStdin", {"process": {"tag": cat_tag}}), 200)
            cat.until(lambda: cat.end is not None, wait)
            same(obs, "cat_output", cat.output.decode(errors="replace"), "one\ntwo\n")
            same(obs, "cat_saw_eof", [(cat.end or {}).get("exited"), (cat.end or {}).get("exitCode", 0)], [True, 0])
        finally:
            shell.close()
            cat.close()


@behaviour("rest_options")
async def rest_options(fl: Flavour, obs: Observed) -> None:
    """The REST options no SDK call takes, each by its effect: the v1 list's metadata filter; the v2 list's order,
    startedAfter and template; refreshes' duration; fork's count and timeout; snapshots' name and the filters and
    paging of GET /snapshots; connect's timeout; resume's timeout, memory and autoPause; create's autoPause and
    autoPauseMemory (a timeout pauses, filesystem only)."""
    group = f"{fl.ctx.run_id}-{fl.name}-options"
    tag = {**fl.ctx.metadata, "bh-options": group}
    with rest() as api:
        # The run's lifetime (it outlasts this case), never E2B's default: a create that ignored it would not show.
        lifetime = fl.ctx.sandbox_timeout_s + (fl.ctx.sandbox_timeout_s == E2B_DEFAULT_LIFETIME_S)

        def create(**body: Any) -> dict[str, Any]:
            made = api.post(
                "/sandboxes",
                json={"templateID": fl.ctx.template or "base", "timeout": lifetime, "metadata": tag, **body},
            )
            expect(made.status_code == 201, f"create answered {made.status_code}: {excerpt(made.text)}")
            fl.ctx.created.append(made.json()["sandboxID"])
            return made.json()

        def detail(sid: str) -> dict[str, Any]:
            return api.get(f"/sandboxes/{sid}").json()

        def ahead(sid: str) -> float:
            return parse_time(detail(sid)["endAt"]).timestamp() - time.time()

        def listed(path: str, **params: Any) -> list[str]:
            return [
                s["sandboxID"]
                for s in api.get(path, params={"metadata": urlencode({"bh-options": group}), **params}).json()
            ]

        def paused_listed(group: str) -> set[str]:
            found = api.get("/v2/sandboxes", params={"metadata": urlencode({"bh-options": group})}).json()
            return {s.get("sandboxID") for s in found if isinstance(s, dict) and s.get("state") == "paused"}

        first = create()
        made = detail(first["sandboxID"])
        obs["created_lifetime_s"] = (parse_time(made["endAt"]) - parse_time(made["startedAt"])).total_seconds()
        lived = obs["created_lifetime_s"]
        expect(abs(lived - lifetime) <= 3, f"a create of timeout {lifetime} lives {lived} s (endAt - startedAt)")
        time.sleep(1.1)  # a second later: startedAfter falls between the two
        second = create()
        ids = [first["sandboxID"], second["sandboxID"]]
        same(obs, "v1_list_by_metadata", sorted(listed("/sandboxes")), sorted(ids))
        same(
            obs,
            "v1_list_other_metadata",
            api.get("/sandboxes", params={"metadata": urlencode({"bh-options": group + "-none"})}).json(),
            [],
        )
        same(obs, "order_asc", listed("/v2/sandboxes", order="asc"), ids)
        same(obs, "order_desc", listed("/v2/sandboxes", order="desc"), ids[::-1])
        middle = (
            parse_time(detail(ids[0])["startedAt"]).timestamp() + parse_time(detail(ids[1])["startedAt"]).timestamp()
        ) / 2
        after = datetime.fromtimestamp(middle, UTC).isoformat().replace("+00:00", "Z")
        same(obs, "started_after", listed("/v2/sandboxes", startedAfter=after), ids[1:])
        same(obs, "template_own", sorted(listed("/v2/sandboxes", template=detail(ids[0])["templateID"])), sorted(ids))
        same(obs, "template_other", listed("/v2/sandboxes", template="bh-no-such-template"), [])

        # A refresh never shortens a lifetime: the sandbox (made with the run's, which may be longer) gets a short one
        # first, so the refresh's 250 s is what endAt shows.
        same(obs, "shortened", api.post(f"/sandboxes/{ids[0]}/timeout", json={"timeout": 100}).status_code, 204)
        same(obs, "refresh", api.post(f"/sandboxes/{ids[0]}/refreshes", json={"duration": 250}).status_code, 204)
        obs["refresh_ahead_s"] = round(ahead(ids[0]), 1)
        expect(abs(obs["refresh_ahead_s"] - 250) <= 5, f"refreshes(250) put endAt {obs['refresh_ahead_s']} s ahead")

        forked = api.post(f"/sandboxes/{ids[0]}/fork", json={"count": 2, "timeout": 77})
        forks = (
            [f["sandbox"]["sandboxID"] for f in forked.json() if isinstance(f, dict) and "sandbox" in f]
            if forked.status_code == 201
            else []
        )
        fl.ctx.created.extend(forks)
        same(obs, "fork_count", [forked.status_code, len(forks)], [201, 2])
        lifetimes = [(parse_time(d["endAt"]) - parse_time(d["startedAt"])).total_seconds() for d in map(detail, forks)]
        obs["fork_lifetimes_s"] = lifetimes
        expect(all(abs(life - 77) <= 5 for life in lifetimes), f"forks of timeout 77 live {lifetimes} s")

        names = [f"bh-{fl.name}-{fl.ctx.run_id[-8:]}-{n}" for n in (1, 2)]
        snaps = [api.post(f"/sandboxes/{ids[0]}/snapshots", json={"name": name}) for name in names]
        made_ids = [s.json().get("snapshotID") for s in snaps if s.status_code == 201]
        same(obs, "snapshots_made", len(made_ids), 2)
        try:
            by_name = [s.get("snapshotID") for s in api.get("/snapshots", params={"name": names[0]}).json()]
            same(obs, "snapshots_by_name", by_name, made_ids[:1])
            same(obs, "snapshots_of_other_sandbox", api.get("/snapshots", params={"sandboxID": ids[1]}).json(), [])
            page = api.get("/snapshots", params={"sandboxID": ids[0], "limit": 1})
            rest_page = api.get(
                "/snapshots",
                params={"sandboxID": ids[0], "limit": 1, "nextToken": page.headers.get("x-next-token", "")},
            )
            paged = [s.get("snapshotID") for s in page.json() + rest_page.json()]
            same(obs, "snapshots_paged", [len(page.json()), sorted(paged)], [1, sorted(made_ids)])
        finally:
            for snapshot_id in made_ids:
                api.delete(f"/templates/{snapshot_id}")

        # connect's timeout, on a paused sandbox
        api.post(f"/sandboxes/{ids[1]}/pause", json={})
        same(obs, "connect", api.post(f"/sandboxes/{ids[1]}/connect", json={"timeout": 150}).status_code, 201)
        obs["connect_ahead_s"] = round(ahead(ids[1]), 1)
        expect(
            abs(obs["connect_ahead_s"] - 150) <= 5, f"connect(timeout 150) put endAt {obs['connect_ahead_s']} s ahead"
        )

        # resume's timeout, memory and autoPause; create's autoPause and autoPauseMemory: each ends paused, no process
        sbx = await got(fl.Sandbox.connect(ids[0]))
        await fl.sh(sbx, f"echo kept > {USER_HOME}/kept; {KEEP_RUNNING}")
        api.post(f"/sandboxes/{ids[0]}/pause", json={})
        resumed = api.post(f"/sandboxes/{ids[0]}/resume", json={"timeout": 170, "autoPause": True, "memory": False})
        same(obs, "resume", resumed.status_code, 201)
        obs["resume_ahead_s"] = round(ahead(ids[0]), 1)
        expect(abs(obs["resume_ahead_s"] - 170) <= 5, f"resume(timeout 170) put endAt {obs['resume_ahead_s']} s ahead")
        pausing = create(autoPause=True, autoPauseMemory=False)
        again = await got(fl.Sandbox.connect(pausing["sandboxID"]))
        await fl.sh(again, f"echo kept > {USER_HOME}/kept; {KEEP_RUNNING}")
        for sid in (ids[0], pausing["sandboxID"]):  # now end them: what a timeout does is the lifecycle's
            api.post(f"/sandboxes/{sid}/timeout", json={"timeout": 2})
        ending = (ids[0], pausing["sandboxID"])
        deadline = time.time() + 60 * fl.ctx.slowness
        states: dict[str, Any] = {}
        while time.time() < deadline:
            # The list is a second view of their state, read before GET: once it says paused, GET gets a few
            # seconds to agree, not the whole minute (an endpoint whose GET never says paused answers the same).
            if set(ending) <= paused_listed(group):
                deadline = min(deadline, time.time() + 5 * fl.ctx.slowness)
            states = {sid: api.get(f"/sandboxes/{sid}").json().get("state") for sid in ending}
            if all(state == "paused" for state in states.values()):
                break
            time.sleep(0.5)
        same(obs, "paused_at_timeout", list(states.values()), ["paused", "paused"])
        for sid in (ids[0], pausing["sandboxID"]):
            back = await got(fl.Sandbox.connect(sid))
            same(obs, f"after_{sid[-6:]}", (await fl.sh(back, BOOT_STATE)).split()[2:], ["0", "kept"])


if __name__ == "__main__":
    sys.exit(main(SUITES))
