"""envd: the Process and Filesystem Connect services, mounted from the e2b package's generated apps."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import errno
import signal
import uuid
from collections.abc import AsyncIterator
from typing import Any, Literal

from connectrpc.code import Code
from connectrpc.codec import Codec, proto_binary_codec, proto_json_codec
from connectrpc.errors import ConnectError
from connectrpc.request import RequestContext
from e2b.envd.filesystem import filesystem_pb as fs_pb
from e2b.envd.filesystem.filesystem_connect import Filesystem, FilesystemASGIApplication
from e2b.envd.process import process_pb as pb
from e2b.envd.process.process_connect import Process, ProcessASGIApplication
from protobuf import Oneof

from .agentlink import AgentError
from .box import ExitStatus, ProcessRecord
from .messages import PATH_MAX, connect_error, entry_message
from .registry import Registry, Sandbox
from .watch import WatchClosed, Watcher

DEFAULT_USER = "user"
KEEPALIVE_DEFAULT_S = 50.0
KILL_REAP_WAIT_S = 5.0
KILL_LATE_S = 3.0  # with the kill_returns_early quirk: when the kill lands after the answer
SIGNALS = {pb.Signal.SIGKILL: signal.SIGKILL, pb.Signal.SIGTERM: signal.SIGTERM}


def request_user(headers, sandbox: Sandbox) -> str:
    """The user an RPC acts as: `Authorization: Basic base64(user:)`, else (or under `ignore_user`) the default."""
    auth = headers.get("authorization", "")
    if auth.lower().startswith("basic "):
        with contextlib.suppress(ValueError):
            name = base64.b64decode(auth[6:].strip()).decode().split(":", 1)[0]
            if name:
                return sandbox.quirks.user(name, DEFAULT_USER)
    return DEFAULT_USER


class StreamSlot:
    """A process stream's place in its sandbox's `envd_pool`: released when the stream ends, or (`pool_until_exit`)
    once its command has ended too."""

    def __init__(self, pool: asyncio.Semaphore | None) -> None:
        self.pool = pool
        self.kept = False

    def keep_until_done(self, record: ProcessRecord) -> None:
        """Under `pool_until_exit`: hold the slot past the stream, until the command ends (or the sandbox stops,
        which ends it), as a pool thread reading a silent command's output never notices its client left."""
        if self.pool is None or record.done.is_set():
            return
        self.kept = True
        record.done_callbacks.append(self.release)

    def release(self) -> None:
        if self.pool is not None:
            self.pool.release()
            self.pool = None


@contextlib.asynccontextmanager
async def stream_slot(sandbox: Sandbox, ctx: RequestContext) -> AsyncIterator[StreamSlot]:
    """One of the sandbox's `envd_pool` process streams, held while the stream is served (no bound without the
    quirk). A stream past the pool waits, sending nothing, until one ends (its command ended, its client went away,
    the sandbox stopped: each closes the stream, which releases its slot) or its own deadline passes."""
    size = sandbox.quirks.envd_pool
    if not size:
        yield StreamSlot(None)
        return
    if sandbox.stream_pool is None:
        sandbox.stream_pool = asyncio.Semaphore(size)
    pool = sandbox.stream_pool
    remaining = ctx.timeout_ms
    try:
        # asyncio.timeout cancels the acquire itself, which hands a wake-up it got on (no slot is lost).
        async with asyncio.timeout(None if remaining is None else max(remaining / 1000, 0)):
            await pool.acquire()
    except TimeoutError:
        raise ConnectError(Code.DEADLINE_EXCEEDED, "context deadline exceeded") from None
    slot = StreamSlot(pool)
    try:
        yield slot
    finally:
        if not slot.kept:
            slot.release()


class EnvdBase:
    def __init__(self, registry: Registry) -> None:
        self.registry = registry

    def sandbox(self, ctx: RequestContext) -> Sandbox:
        # Authentication already happened in the envd gate; a sandbox paused since then is gone.
        sandbox = self.registry.get(ctx.request_headers.get("e2b-sandbox-id", ""))
        if sandbox is None or not sandbox.box.running:
            raise ConnectError(Code.UNAVAILABLE, "sandbox is not running")
        return sandbox

    async def home(self, sandbox: Sandbox, user: str) -> str:
        try:
            return (await sandbox.box.user(user))["home"]
        except AgentError as exc:
            if exc.errno is not None:  # the user database could not be read (e.g. pid 1 refused what it became)
                raise connect_error(exc) from exc
            raise ConnectError(Code.UNAUTHENTICATED, f"invalid user: '{user}'") from exc

    async def path(self, sandbox: Sandbox, ctx: RequestContext, path: str) -> tuple[str, str]:
        if "\0" in path:
            raise ConnectError(Code.INVALID_ARGUMENT, "path contains a NUL byte")
        if len(path.encode()) >= PATH_MAX:
            raise ConnectError(Code.INVALID_ARGUMENT, f"path is longer than {PATH_MAX - 1} bytes")
        user = request_user(ctx.request_headers, sandbox)
        home = await self.home(sandbox, user)
        return sandbox.box.resolve(path, home), user


class ProcessService(EnvdBase, Process):
    def find(self, sandbox: Sandbox, selector: pb.ProcessSelector | None) -> ProcessRecord:
        chosen = selector.selector if selector else None
        for record in sandbox.box.processes.values():
            if chosen is not None and chosen.field == "pid" and record.pid == chosen.value:
                return record
            if chosen is not None and chosen.field == "tag" and record.tag == chosen.value:
                return record
        what = f"{chosen.field} {chosen.value}" if chosen else "no selector"
        raise ConnectError(Code.NOT_FOUND, f"process with {what} not found")

    async def list(self, request: pb.ListRequest, ctx: RequestContext) -> pb.ListResponse:
        sandbox = self.sandbox(ctx)
        return pb.ListResponse(
            processes=[
                pb.ProcessInfo(
                    config=pb.ProcessConfig(cmd=r.cmd, args=r.args, envs=r.envs, cwd=r.cwd),
                    pid=r.pid,
                    tag=r.tag,
                )
                for r in sandbox.box.processes.values()
                if not r.reaped.is_set()  # a process already waited for is not running, output or not
            ]
        )

    async def start(self, request: pb.StartRequest, ctx: RequestContext) -> AsyncIterator[pb.StartResponse]:
        sandbox = self.sandbox(ctx)
        sandbox.quirks.check_start(request)
        config = request.process or pb.ProcessConfig()
        if not config.cmd:
            raise ConnectError(Code.INVALID_ARGUMENT, "process.cmd is required")
        user = request_user(ctx.request_headers, sandbox)
        await self.home(sandbox, user)
        async with stream_slot(sandbox, ctx) as slot:
            pty = None
            if request.pty:
                size = request.pty.size  # a pty without a size gets envd's 0 x 0, so the defaults
                pty = (size.cols or 80, size.rows or 24) if size is not None else (80, 24)
            try:
                record = await sandbox.box.spawn(
                    cmd=config.cmd,
                    args=list(config.args),
                    envs={**sandbox.env_vars, **dict(config.envs)},
                    cwd=sandbox.quirks.command_cwd(config.cwd, sandbox.last_cwd),
                    user=user,
                    tag=request.tag or None,
                    stdin=bool(request.stdin),
                    pty=pty,
                )
            except AgentError as exc:
                raise start_error(exc, config, pty) from exc
            sandbox.last_cwd = config.cwd or None
            if sandbox.quirks.pool_until_exit:
                slot.keep_until_done(record)
            queue = record.subscribe()
            deadline_ms = ctx.timeout_ms
            if deadline_ms is not None:
                # The deadline belongs to the process, not to this stream: a disconnect does not stop it.
                kill = asyncio.get_running_loop().call_later(
                    deadline_ms / 1000, lambda: asyncio.ensure_future(self._kill_quietly(sandbox, record))
                )
                record.done_callbacks.append(kill.cancel)
            yield pb.StartResponse(event=_start_event(record.pid))
            async for event in self.events(sandbox, record, queue, ctx):
                yield pb.StartResponse(event=event)

    async def connect(self, request: pb.ConnectRequest, ctx: RequestContext) -> AsyncIterator[pb.ConnectResponse]:
        sandbox = self.sandbox(ctx)
        try:
            record = self.find(sandbox, request.process)
        except ConnectError:
            ended = _ended(sandbox, request.process)
            if ended is None or ended.exit is None:
                raise
            # envd's Connect to a process that ended in the last 30 s: its start and its end (connect.go).
            yield pb.ConnectResponse(event=_start_event(ended.pid))
            yield pb.ConnectResponse(event=_end_event(ended.exit))
            return
        async with stream_slot(sandbox, ctx) as slot:
            if sandbox.quirks.pool_until_exit:
                slot.keep_until_done(record)
            queue = record.subscribe()
            yield pb.ConnectResponse(event=_start_event(record.pid))
            async for event in self.events(sandbox, record, queue, ctx):
                yield pb.ConnectResponse(event=event)

    @staticmethod
    async def _kill_quietly(sandbox: Sandbox, record: ProcessRecord) -> None:
        if not record.done.is_set():
            with contextlib.suppress(AgentError):
                await sandbox.box.signal(record.pid, signal.SIGKILL)

    async def events(
        self, sandbox: Sandbox, record: ProcessRecord, queue: asyncio.Queue, ctx: RequestContext
    ) -> AsyncIterator[pb.ProcessEvent]:
        interval = _keepalive_interval(ctx)
        try:
            while True:
                remaining = ctx.timeout_ms
                wait = interval if remaining is None else min(interval, max(remaining / 1000, 0))
                try:
                    event = await asyncio.wait_for(queue.get(), wait)
                except TimeoutError:
                    remaining = ctx.timeout_ms
                    if remaining is not None and remaining <= 0:
                        raise ConnectError(Code.DEADLINE_EXCEEDED, "context deadline exceeded") from None
                    keepalive: Oneof[Literal["keepalive"], pb.ProcessEvent.KeepAlive]
                    keepalive = Oneof("keepalive", pb.ProcessEvent.KeepAlive())
                    yield pb.ProcessEvent(event=keepalive)
                    continue
                if event[0] == "data":
                    _, kind, data = event
                    data = sandbox.quirks.pty_output(data) if kind == "pty" else data
                    output = pb.ProcessEvent.DataEvent(output=Oneof(kind, data))
                    data_event: Oneof[Literal["data"], pb.ProcessEvent.DataEvent] = Oneof("data", output)
                    yield pb.ProcessEvent(event=data_event)
                else:
                    kind, status = event
                    if kind == "gone" and not sandbox.quirks.kill_stream_clean_end:
                        raise stream_cut(sandbox)
                    yield _end_event(status)
                    return
        finally:
            record.unsubscribe(queue)

    async def send_signal(self, request: pb.SendSignalRequest, ctx: RequestContext) -> pb.SendSignalResponse:
        sandbox = self.sandbox(ctx)
        record = self.find(sandbox, request.process)
        signum = SIGNALS.get(request.signal)
        if signum is None:
            raise ConnectError(Code.INVALID_ARGUMENT, f"unsupported signal {request.signal}")
        if signum == signal.SIGKILL and sandbox.quirks.kill_returns_early:
            # A layer that signals asynchronously: it answers at once and the kill lands a moment later.
            asyncio.get_running_loop().call_later(KILL_LATE_S, _kill_later, sandbox, record.pid)
            return pb.SendSignalResponse()
        try:
            await sandbox.box.signal(record.pid, signum)
        except AgentError as exc:
            raise connect_error(exc) from exc
        if signum == signal.SIGKILL:
            # envd answers once the process is gone: a list or wait right after never sees it alive.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(record.reaped.wait(), KILL_REAP_WAIT_S)
        return pb.SendSignalResponse()

    async def _input(self, sandbox: Sandbox, record: ProcessRecord, data: pb.ProcessInput | None) -> None:
        if data is None or data.input is None:
            return
        try:
            await sandbox.box.write_input(record, data.input.value, pty=data.input.field == "pty")
        except (AgentError, OSError) as exc:
            raise ConnectError(Code.FAILED_PRECONDITION, f"cannot write input: {exc}") from exc

    async def send_input(self, request: pb.SendInputRequest, ctx: RequestContext) -> pb.SendInputResponse:
        sandbox = self.sandbox(ctx)
        await self._input(sandbox, self.find(sandbox, request.process), request.input)
        return pb.SendInputResponse()

    async def stream_input(
        self, request: AsyncIterator[pb.StreamInputRequest], ctx: RequestContext
    ) -> pb.StreamInputResponse:
        sandbox = self.sandbox(ctx)
        record: ProcessRecord | None = None
        async for message in request:
            event = message.event
            if event is None or event.field == "keepalive":
                continue
            if event.field == "start":
                record = self.find(sandbox, event.value.process)
            elif record is None:
                raise ConnectError(Code.FAILED_PRECONDITION, "input sent before the start message")
            else:
                await self._input(sandbox, record, event.value.input)
        return pb.StreamInputResponse()

    async def close_stdin(self, request: pb.CloseStdinRequest, ctx: RequestContext) -> pb.CloseStdinResponse:
        sandbox = self.sandbox(ctx)
        record = self.find(sandbox, request.process)
        try:
            await sandbox.box.close_input(record)
        except (AgentError, OSError) as exc:
            raise ConnectError(Code.FAILED_PRECONDITION, f"cannot close stdin: {exc}") from exc
        return pb.CloseStdinResponse()

    async def update(self, request: pb.UpdateRequest, ctx: RequestContext) -> pb.UpdateResponse:
        sandbox = self.sandbox(ctx)
        record = self.find(sandbox, request.process)
        if request.pty and request.pty.size:
            try:
                await sandbox.box.resize(record, request.pty.size.cols, request.pty.size.rows)
            except AgentError as exc:
                raise ConnectError(Code.FAILED_PRECONDITION, str(exc)) from exc
        return pb.UpdateResponse()


def start_error(exc: AgentError, config: pb.ProcessConfig, pty: tuple[int, int] | None) -> ConnectError:
    """A refused start as envd words it (internal/services/process/handler/handler.go New, Start): a working
    directory that does not exist (envd stats it as root) and one the user cannot enter (its exec changes
    directory after setuid, so the fork/exec fails) are both invalid_argument."""
    if exc.errno == errno.ENOENT and exc.filename and "working directory" in str(exc):
        return ConnectError(Code.INVALID_ARGUMENT, f"cwd '{exc.filename}' does not exist")
    if exc.errno == errno.EACCES and exc.filename:
        command = " ".join([config.cmd, *config.args])
        failed = "fork/exec /bin/sh: permission denied"
        if pty is None:
            return ConnectError(Code.INVALID_ARGUMENT, f"error starting process '{command}': {failed}")
        cols, rows = pty
        where = f"in dir '{exc.filename}' with '{cols}' cols and '{rows}' rows"
        return ConnectError(Code.INVALID_ARGUMENT, f"error starting pty with command '{command}' {where}: {failed}")
    return connect_error(exc)


def stream_cut(sandbox: Sandbox) -> ConnectError:
    """The end message of a stream whose stopped sandbox kept its connection (`kill_stream_unavailable`): without
    the quirk the connection is cut first (inflight.py), as E2B's proxy loses it, and this is never sent."""
    return ConnectError(Code.UNAVAILABLE, f"the connection to sandbox {sandbox.id} ended before the stream completed")


def _start_event(pid: int) -> pb.ProcessEvent:
    start: Oneof[Literal["start"], pb.ProcessEvent.StartEvent] = Oneof("start", pb.ProcessEvent.StartEvent(pid=pid))
    return pb.ProcessEvent(event=start)


def _end_event(status: ExitStatus) -> pb.ProcessEvent:
    end = pb.ProcessEvent.EndEvent(
        exit_code=status.exit_code, exited=status.exited, status=status.status, error=status.error
    )
    end_event: Oneof[Literal["end"], pb.ProcessEvent.EndEvent] = Oneof("end", end)
    return pb.ProcessEvent(event=end_event)


def _ended(sandbox: Sandbox, selector: pb.ProcessSelector | None) -> ProcessRecord | None:
    """The process that ended lately (`Box.ended_process`) which `selector` names, if any."""
    chosen = selector.selector if selector else None
    if chosen is None:
        return None
    if chosen.field == "pid":
        return sandbox.box.ended_process(pid=chosen.value)
    return sandbox.box.ended_process(tag=chosen.value) if chosen.field == "tag" else None


def _keepalive_interval(ctx: RequestContext) -> float:
    try:
        return max(float(ctx.request_headers.get("keepalive-ping-interval", KEEPALIVE_DEFAULT_S)), 0.05)
    except ValueError:
        return KEEPALIVE_DEFAULT_S


def entry(sandbox: Sandbox, info: dict) -> fs_pb.EntryInfo:
    return entry_message(info, go_dir_bit=sandbox.quirks.dir_mode_go_bit)


class FilesystemService(EnvdBase, Filesystem):
    async def _fs(self, sandbox: Sandbox, op: str, **fields: object) -> dict[str, Any]:
        try:
            return await sandbox.box.fs(op, **fields)
        except AgentError as exc:
            raise connect_error(exc) from exc

    async def stat(self, request: fs_pb.StatRequest, ctx: RequestContext) -> fs_pb.StatResponse:
        sandbox = self.sandbox(ctx)
        path, user = await self.path(sandbox, ctx, request.path)
        info = await self._fs(sandbox, "stat", path=path, user=user)
        if sandbox.quirks.stale_file_info:
            info = sandbox.stat_answers.setdefault(path, info)
        return fs_pb.StatResponse(entry=entry(sandbox, info))

    async def make_dir(self, request: fs_pb.MakeDirRequest, ctx: RequestContext) -> fs_pb.MakeDirResponse:
        sandbox = self.sandbox(ctx)
        path, user = await self.path(sandbox, ctx, request.path)
        info = await self._fs(sandbox, "mkdir", path=path, user=user)
        return fs_pb.MakeDirResponse(entry=entry(sandbox, info))

    async def move(self, request: fs_pb.MoveRequest, ctx: RequestContext) -> fs_pb.MoveResponse:
        sandbox = self.sandbox(ctx)
        source, user = await self.path(sandbox, ctx, request.source)
        destination, _ = await self.path(sandbox, ctx, request.destination)
        info = await self._fs(sandbox, "move", source=source, destination=destination, user=user)
        if sandbox.quirks.drop_mutation_answer:  # applied; what a proxy in front that lost the answer says
            raise ConnectError(Code.UNAVAILABLE, "upstream connect error or disconnect/reset before headers")
        return fs_pb.MoveResponse(entry=entry(sandbox, info))

    async def list_dir(self, request: fs_pb.ListDirRequest, ctx: RequestContext) -> fs_pb.ListDirResponse:
        sandbox = self.sandbox(ctx)
        path, user = await self.path(sandbox, ctx, request.path)
        try:
            entries = await sandbox.box.list_dir(path, max(request.depth, 1), user)
        except AgentError as exc:
            raise connect_error(exc) from exc
        return fs_pb.ListDirResponse(entries=[entry(sandbox, e) for e in entries])

    async def remove(self, request: fs_pb.RemoveRequest, ctx: RequestContext) -> fs_pb.RemoveResponse:
        sandbox = self.sandbox(ctx)
        path, user = await self.path(sandbox, ctx, request.path)
        try:
            await sandbox.box.fs("remove", path=path, user=user)
        except AgentError as exc:
            # envd removes with RemoveAll: a path that is not there is already removed.
            if exc.errno != errno.ENOENT or sandbox.quirks.remove_missing_404:
                raise connect_error(exc) from exc
        return fs_pb.RemoveResponse()

    async def watch_dir(
        self, request: fs_pb.WatchDirRequest, ctx: RequestContext
    ) -> AsyncIterator[fs_pb.WatchDirResponse]:
        sandbox = self.sandbox(ctx)
        path, user = await self.path(sandbox, ctx, request.path)
        watcher = await Watcher.open(sandbox, path, request.recursive, request.include_entry, user)
        stream_id = f"stream-{uuid.uuid4().hex}"
        sandbox.watchers[stream_id] = watcher  # so killing the sandbox closes it, and this stream ends
        interval = _keepalive_interval(ctx)
        try:
            start: Oneof[Literal["start"], fs_pb.WatchDirResponse.StartEvent]
            start = Oneof("start", fs_pb.WatchDirResponse.StartEvent())
            yield fs_pb.WatchDirResponse(event=start)
            while True:
                try:
                    events = await asyncio.wait_for(watcher.next_events(), interval)
                except WatchClosed:
                    raise stream_cut(sandbox) from None
                except TimeoutError:
                    if not sandbox.box.running:
                        raise stream_cut(sandbox) from None
                    keepalive: Oneof[Literal["keepalive"], fs_pb.WatchDirResponse.KeepAlive]
                    keepalive = Oneof("keepalive", fs_pb.WatchDirResponse.KeepAlive())
                    yield fs_pb.WatchDirResponse(event=keepalive)
                    continue
                for event in events:
                    change: Oneof[Literal["filesystem"], fs_pb.FilesystemEvent] = Oneof("filesystem", event)
                    yield fs_pb.WatchDirResponse(event=change)
        finally:
            sandbox.watchers.pop(stream_id, None)
            await watcher.close()

    async def create_watcher(
        self, request: fs_pb.CreateWatcherRequest, ctx: RequestContext
    ) -> fs_pb.CreateWatcherResponse:
        sandbox = self.sandbox(ctx)
        path, user = await self.path(sandbox, ctx, request.path)
        watcher = await Watcher.open(sandbox, path, request.recursive, request.include_entry, user)
        watcher_id = uuid.uuid4().hex
        sandbox.watchers[watcher_id] = watcher
        return fs_pb.CreateWatcherResponse(watcher_id=watcher_id)

    async def get_watcher_events(
        self, request: fs_pb.GetWatcherEventsRequest, ctx: RequestContext
    ) -> fs_pb.GetWatcherEventsResponse:
        sandbox = self.sandbox(ctx)
        watcher = sandbox.watchers.get(request.watcher_id)
        if watcher is None:
            raise ConnectError(Code.NOT_FOUND, f"watcher {request.watcher_id} not found")
        return fs_pb.GetWatcherEventsResponse(events=await watcher.drain())

    async def remove_watcher(
        self, request: fs_pb.RemoveWatcherRequest, ctx: RequestContext
    ) -> fs_pb.RemoveWatcherResponse:
        sandbox = self.sandbox(ctx)
        watcher = sandbox.watchers.pop(request.watcher_id, None)
        if watcher is None:
            raise ConnectError(Code.NOT_FOUND, f"watcher {request.watcher_id} not found")
        await watcher.close()
        return fs_pb.RemoveWatcherResponse()


def rpc_paths() -> set[str]:
    """Every method path the two services answer, e.g. `/process.Process/Start`."""
    return {
        f"/{service.desc().type_name}/{method.name}"
        for service in (Process, Filesystem)
        for method in service.desc().methods
    }


class StrictDecode:
    """Wraps a codec so that an undecodable request is `invalid_argument`, not an internal error."""

    def __init__(self, codec: Codec) -> None:
        self._codec = codec

    def name(self) -> str:
        return self._codec.name()

    def encode(self, message):  # type: ignore[no-untyped-def]
        return self._codec.encode(message)

    def decode(self, data, message_class):  # type: ignore[no-untyped-def]
        try:
            return self._codec.decode(data, message_class)
        except Exception as exc:
            raise ConnectError(Code.INVALID_ARGUMENT, f"cannot decode request: {exc}") from exc


def envd_apps(registry: Registry) -> list[ProcessASGIApplication | FilesystemASGIApplication]:
    codecs = [StrictDecode(proto_json_codec()), StrictDecode(proto_binary_codec())]
    # Responses are never compressed: older SDKs (e.g. 2.31) send their HTTP client's default
    # `Accept-Encoding: gzip` yet read unary bodies as plain JSON.
    return [
        ProcessASGIApplication(ProcessService(registry), codecs=codecs, compressions=[]),  # type: ignore[arg-type]
        FilesystemASGIApplication(FilesystemService(registry), codecs=codecs, compressions=[]),  # type: ignore[arg-type]
    ]


def _kill_later(sandbox: Sandbox, pid: int) -> None:
    """The kill_returns_early quirk's late SIGKILL (its error, if the process is gone, is of no interest)."""
    task = asyncio.ensure_future(sandbox.box.signal(pid, signal.SIGKILL))
    task.add_done_callback(lambda done: done.cancelled() or done.exception())
