"""envd's HTTP side: `GET /health` and `GET`/`POST /files` (multipart, octet-stream, gzip, metadata)."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from email.message import Message
from typing import Literal
from urllib.parse import quote

from python_multipart.multipart import MultipartParser, parse_options_header
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from bench.asgi import BODY_EXTENSION, RawBody, spare_buffer

from .agentlink import AgentError, AgentGone
from .api import ApiError
from .messages import PATH_MAX
from .registry import Sandbox

CHUNK = 1 << 20
WRITE_BATCH = 1 << 20  # bytes of a request body handed to a writer thread at once
MAX_READ_AHEAD = 64 << 20  # body bytes read ahead of the file at most
IOV_MAX = os.sysconf("SC_IOV_MAX")
_writers = ThreadPoolExecutor(max_workers=8, thread_name_prefix="e2b-bench-file-writes")
_readers = ThreadPoolExecutor(max_workers=8, thread_name_prefix="e2b-bench-file-reads")
BODY_THREADS = 32  # uploads whose bodies are read by threads at once; more are read on the event loop


class BodyThreads:
    """The threads that read, parse and write uploads' bodies (`RawBody.rest_in_thread`), claimed one per upload
    on the event loop. An upload that finds them all busy (e.g. clients holding their bodies open) is read on
    the event loop as before, so no upload waits for another's client."""

    def __init__(self, size: int) -> None:
        self._executor = ThreadPoolExecutor(max_workers=size, thread_name_prefix="e2b-bench-upload-bodies")
        self._free = size

    @contextlib.contextmanager
    def claimed(self, body: object) -> Iterator[ThreadPoolExecutor | None]:
        """A thread's executor for the block if `body` is a `RawBody` and a thread is free, else None."""
        if not isinstance(body, RawBody) or not self._free:
            yield None
            return
        self._free -= 1
        try:
            yield self._executor
        finally:
            self._free += 1


_bodies = BodyThreads(BODY_THREADS)
INFLATE_PIECE = 1 << 20  # a gzip body is inflated this much at a time, each piece written before the next
DEFAULT_USER = "user"
METADATA_HEADER = "x-metadata-"
METADATA_KEY_MAX = 246  # the VFS xattr name limit less the `user.e2b.` prefix
METADATA_TOTAL_MAX = 4096


def file_error(exc: AgentError, path: str) -> ApiError:
    if isinstance(exc, AgentGone):
        return ApiError(502, "sandbox is not running")
    known = {
        errno.ENOENT: (404, f"path '{path}' does not exist"),
        errno.EISDIR: (400, f"path '{path}' is a directory"),
        errno.ENOTDIR: (400, f"a parent of '{path}' is not a directory"),
        errno.EACCES: (403, f"permission denied: '{path}'"),
        errno.EPERM: (403, f"permission denied: '{path}'"),
        errno.ENOSPC: (507, "not enough disk space available"),
        errno.ENAMETOOLONG: (400, f"path '{path}' is too long"),
        errno.ELOOP: (400, f"path '{path}' goes through a link that leaves the sandbox or loops"),
        errno.EINVAL: (400, f"path '{path}' is not a regular file"),
        errno.ENXIO: (400, f"path '{path}' is not a regular file"),
    }
    status, message = known.get(exc.errno or 0, (500, f"{exc}"))
    return ApiError(status, message)


def checked_path(raw: str | None) -> str:
    """A path from the query, refused with 400 when it cannot name a file."""
    if not raw:
        raise ApiError(400, "'path' is required")
    if "\0" in raw:
        raise ApiError(400, "path contains a NUL byte")
    if len(raw.encode()) >= PATH_MAX:
        raise ApiError(400, f"path is longer than {PATH_MAX - 1} bytes")
    return raw


def upload_metadata(request: Request) -> dict[str, str]:
    """`X-Metadata-<key>` headers as envd keeps them: the first of repeated keys, printable ASCII, capped."""
    metadata: dict[str, str] = {}
    for name, value in request.headers.items():
        if name.startswith(METADATA_HEADER):
            metadata.setdefault(name[len(METADATA_HEADER) :], value)
    for key, value in metadata.items():
        if not key or not (key + value).isascii() or not (key + value).isprintable():
            raise ApiError(400, f"metadata key and value must be printable US-ASCII: '{key}'")
        if len(key) > METADATA_KEY_MAX:
            raise ApiError(400, f"metadata key longer than {METADATA_KEY_MAX} bytes: '{key[:32]}...'")
    if sum(len("user.e2b.") + len(k) + len(v) for k, v in metadata.items()) > METADATA_TOTAL_MAX:
        raise ApiError(400, f"metadata larger than {METADATA_TOTAL_MAX} bytes in all")
    return metadata


DOWNLOAD_ENCODINGS = ("identity", "gzip")


def download_encoding(accept: str) -> str | None:
    """The body encoding of a download, as envd picks it: gzip when asked for exactly (or when identity is
    ruled out and gzip is not), identity otherwise; None when the client accepts neither (406)."""
    weights: dict[str, float] = {}
    for part in accept.split(","):
        coding, *params = (piece.strip() for piece in part.split(";"))
        if not coding:
            continue
        weight = 1.0
        for param in params:
            if param.startswith("q="):
                try:
                    weight = float(param[2:])
                except ValueError:
                    weight = 0.0
        weights[coding.lower()] = weight
    wildcard = weights.get("*")
    gzip = weights.get("gzip", wildcard if wildcard is not None else 0.0) > 0
    identity = weights.get("identity", wildcard if wildcard is not None else 1.0) > 0
    if accept.strip() == "gzip" or (gzip and not identity):
        return "gzip"
    return "identity" if identity else None


class Files:
    def __init__(self, sandbox_of) -> None:  # sandbox_of(request) -> Sandbox, already authenticated
        self.sandbox_of = sandbox_of

    async def _user(self, sandbox: Sandbox, request: Request) -> tuple[str, str]:
        user = sandbox.quirks.user(request.query_params.get("username") or DEFAULT_USER, DEFAULT_USER)
        try:
            home = (await sandbox.box.user(user))["home"]
        except AgentError as exc:
            if exc.errno is not None:  # the user database could not be read (e.g. pid 1 refused what it became)
                raise ApiError(500, f"cannot look up user '{user}': {exc}: {exc.filename}") from exc
            raise ApiError(401, f"invalid user: '{user}'") from exc
        return user, home

    async def download(self, request: Request) -> Response:
        sandbox = self.sandbox_of(request)
        user, home = await self._user(sandbox, request)
        path = sandbox.box.resolve(checked_path(request.query_params.get("path")), home)
        if download_encoding(request.headers.get("accept-encoding", "")) is None:
            raise ApiError(406, f"no acceptable encoding found, supported: [{', '.join(DOWNLOAD_ENCODINGS)}]")
        try:
            fd, info = await sandbox.box.open_read(path, user)
        except AgentError as exc:
            raise file_error(exc, path) from exc
        name = os.path.basename(path)
        fallback = name.encode("ascii", "replace").decode().replace('"', "_").replace("\\", "_")
        disposition = f"attachment; filename=\"{fallback}\"; filename*=UTF-8''{quote(name, safe='')}"
        headers = {"Content-Disposition": disposition}
        compress = download_encoding(request.headers.get("accept-encoding", "")) == "gzip"
        if info["stat_size"] == 0 and sandbox.quirks.proc_size_zero:
            os.close(fd)
            return Response(b"", media_type="application/octet-stream", headers=headers)
        if compress:
            headers["Content-Encoding"] = "gzip"
        else:
            headers["Content-Length"] = str(info["size"])
        reads = _read_regular(fd, info["size"])
        return StreamingResponse(_encoded(reads, compress), media_type="application/octet-stream", headers=headers)

    async def upload(self, request: Request) -> Response:
        sandbox = self.sandbox_of(request)
        user, home = await self._user(sandbox, request)
        metadata = upload_metadata(request)
        content_type, options = parse_options_header(request.headers.get("content-type", ""))
        raw_path = request.query_params.get("path")
        if content_type == b"multipart/form-data":
            boundary = options.get(b"boundary")
            if not boundary:
                raise ApiError(400, "multipart body without a boundary")
            written = await self._multipart(request, sandbox, user, home, raw_path, boundary, metadata)
        elif content_type in (b"application/octet-stream", b""):
            raw_path = checked_path(raw_path)
            encoding = request.headers.get("content-encoding", "identity").strip().lower()
            if encoding not in ("identity", "gzip", ""):
                raise ApiError(400, f"unsupported Content-Encoding '{encoding}'")
            if encoding == "gzip" and sandbox.quirks.refuse_gzip_upload:
                raise ApiError(400, "gzip uploads are not supported: send the body uncompressed")
            path = sandbox.box.resolve(raw_path, home)
            async with _body(request) as body:
                sink = FileSink(self._open(sandbox, path, user, metadata))
                await sink.opening_sent()
                await _write_stream(sink, body, encoding)
            written = [path]
        else:
            raise ApiError(400, f"unsupported Content-Type '{content_type.decode(errors='replace')}'")
        shown = {} if sandbox.quirks.upload_no_metadata else ({"metadata": metadata} if metadata else {})
        return JSONResponse([{"name": os.path.basename(p), "type": "file", "path": p, **shown} for p in written])

    async def _open(self, sandbox: Sandbox, path: str, user: str, metadata: dict[str, str]) -> tuple[int, bool]:
        """The upload's file and whether its old contents are still there to be written over and cut."""
        try:
            if sandbox.quirks.upload_replaces_file:  # a new file in the old one's place: its mode and links are gone
                aside = f"{path}.replaced"
                with contextlib.suppress(AgentError):
                    await sandbox.box.fs("move", source=path, destination=aside, user="root")
                try:
                    return await sandbox.box.open_write(path, user, metadata)
                finally:
                    with contextlib.suppress(AgentError):
                        await sandbox.box.fs("remove", path=aside, user="root")
            if sandbox.quirks.files_write_as_user or sandbox.quirks.upload_no_metadata:
                fd, _ = await sandbox.box.open(path, "w", user, metadata)
                return fd, False
            return await sandbox.box.open_write(path, user, metadata)
        except AgentError as exc:
            raise file_error(exc, path) from exc

    async def _multipart(
        self,
        request: Request,
        sandbox: Sandbox,
        user: str,
        home: str,
        raw_path: str | None,
        boundary: bytes,
        metadata: dict[str, str],
    ) -> list[str]:
        events: list[PartEvent] = []
        header_name = bytearray()
        header_value = bytearray()

        def on_header_field(data: bytes, start: int, end: int) -> None:
            header_name.extend(data[start:end])

        def on_header_value(data: bytes, start: int, end: int) -> None:
            header_value.extend(data[start:end])

        def on_header_end() -> None:
            events.append(("header", (bytes(header_name).decode("latin-1"), bytes(header_value).decode())))
            header_name.clear()
            header_value.clear()

        parser = MultipartParser(
            boundary,
            {
                "on_part_begin": lambda: events.append(("begin", None)),
                "on_header_field": on_header_field,
                "on_header_value": on_header_value,
                "on_header_end": on_header_end,
                "on_part_data": lambda data, start, end: events.append(("data", _slice(data, start, end))),
                "on_part_end": lambda: events.append(("end", None)),
            },
        )
        written: list[str] = []
        sink: FileSink | None = None
        headers: dict[str, str] = {}

        async def handle(event: PartEvent) -> None:
            nonlocal sink, headers
            if event[0] == "begin":
                headers = {}
            elif event[0] == "header":
                name, text = event[1]
                headers[name.lower()] = text
                if name.lower() == "content-disposition":
                    target = _part_filename(text)
                    if not raw_path and not target:
                        raise ApiError(400, "multipart part without a filename and no 'path'")
                    path = sandbox.box.resolve(checked_path(raw_path or target), home)
                    sink = FileSink(self._open(sandbox, path, user, metadata))
                    written.append(path)
                    await sink.opening_sent()
            elif event[0] == "data" and sink is not None:
                await sink.write(event[1])
            elif event[0] == "end" and sink is not None:
                current, sink = sink, None
                await current.close()

        loop = asyncio.get_running_loop()

        def taking(writes: ThreadWrites) -> Callable[[list[bytes | bytearray]], None]:
            def take(pieces: list[bytes | bytearray]) -> None:
                """In the body's thread: pieces parsed, their part data written there; what else they hold is
                handled on the event loop, in order, the thread waiting for it."""
                for piece in pieces:
                    parser.write(piece)  # type: ignore[arg-type]  # a bytearray piece: parsed as bytes are
                batch, events[:] = list(events), []
                for event in batch:
                    if event[0] == "data":
                        writes.write(event[1])
                        continue
                    writes.flush()
                    asyncio.run_coroutine_threadsafe(handle(event), loop).result()
                    writes.target(sink)
                writes.flush_if_open()

            return take

        try:
            async with _body(request) as body:
                with _bodies.claimed(body) as threads:
                    if isinstance(body, RawBody) and threads is not None:
                        writes = ThreadWrites(loop, body.nudge)
                        await body.rest_in_thread(taking(writes), threads)
                        await writes.flushed()
                    else:
                        async for chunk in body:
                            parser.write(chunk)  # type: ignore[arg-type]  # a bytearray piece: parsed as bytes are
                            batch, events[:] = list(events), []
                            for event in batch:
                                await handle(event)
            parser.finalize()
        except OSError as exc:
            if exc.errno == errno.ENOSPC:
                raise ApiError(507, "not enough disk space available") from exc
            raise
        finally:
            if sink is not None:
                await sink.abort()
        if not written:
            raise ApiError(400, "multipart body has no file part")
        return written


# What the multipart parser's callbacks saw, handled in order once a chunk is parsed.
PartEvent = (
    tuple[Literal["begin"], None]
    | tuple[Literal["header"], tuple[str, str]]
    | tuple[Literal["data"], bytes | memoryview]
    | tuple[Literal["end"], None]
)


def _slice(data: bytes | bytearray, start: int, end: int) -> memoryview:
    """Part data as the writer thread may keep it: a view. The parser hands over either a piece of the body
    (never reused once read: `_body`) or its own look-behind, which is `bytes`."""
    return memoryview(data)[start:end]


@contextlib.asynccontextmanager
async def _body(request: Request) -> AsyncIterator[AsyncIterator[bytes | bytearray]]:
    """The request body in pieces the handler may keep: read off the socket straight into buffers where the
    server can (`bench.asgi.RawBody`: a body with a Content-Length no one has begun to receive; its rest may be
    read by a thread, `RawBody.rest_in_thread`), else as Starlette streams it. Whatever the handler leaves
    unread is dropped as it arrives."""
    take = request.scope.get("extensions", {}).get(BODY_EXTENSION)
    raw = take() if take is not None else None
    if raw is None:
        yield request.stream()
        return
    try:
        yield raw
    finally:
        raw.drop()


def _part_filename(disposition: str) -> str | None:
    message = Message()
    message["content-disposition"] = disposition
    return message.get_param("filename", header="content-disposition")  # type: ignore[return-value]


class FileSink:
    """A file in a sandbox written while the request body is still arriving.

    The agent opens the file while the body is read, and a writer thread (the GIL is let go in write) takes
    the body in batches, one at a time, while the event loop reads on; at most MAX_READ_AHEAD bytes wait in
    memory, so neither the open nor the disk stops the reading of the socket. A file that existed is written
    over from its start and cut where the upload ends (as O_TRUNC would have left it, and a watcher sees the
    same CHMOD then WRITE): its pages are overwritten in place, about half the CPU of freeing them at the open
    and allocating them again. The response still comes only after every byte is written, the file cut and
    closed; an upload that fails leaves what was written, as envd's does. A body read by a thread of its own
    is written by that thread instead (`direct`, `ThreadWrites`); the cut and the close stay here.
    """

    def __init__(self, opening: Awaitable[tuple[int, bool]]) -> None:
        self._opening: asyncio.Future[tuple[int, bool]] = asyncio.ensure_future(opening)
        self._pending: list[bytes | bytearray | memoryview] = []
        self._pending_size = 0
        self._writing: asyncio.Future[None] | None = None
        self._opening.add_done_callback(self._ended)

    async def opening_sent(self) -> None:
        """Let the open take its first step, which sends the agent its request: otherwise it waits until the
        handler next waits for the body, after the pieces already read (milliseconds of a busy event loop)."""
        await asyncio.sleep(0)

    async def write(self, data: bytes | bytearray | memoryview) -> None:
        self._pending.append(data)
        self._pending_size += len(data)
        while self._pending_size >= MAX_READ_AHEAD:  # the open or the disk is behind: wait for it
            await asyncio.wait([self._writing if self._opening.done() and self._writing else self._opening])
            self._kick()
        if self._pending_size >= WRITE_BATCH:
            self._kick()

    def opened(self) -> bool:
        """Whether the open has ended (well or not); safe to ask from any thread."""
        return self._opening.done()

    def when_open(self, callback: Callable[[], None]) -> None:
        """Call `callback` once the open has ended (well or not)."""
        self._opening.add_done_callback(lambda _: callback())

    async def direct(self) -> int:
        """The file's descriptor, for the caller to write to from its own thread from now on (`ThreadWrites`):
        the open and every write handed over before are done first; raises what they raised."""
        fd, _ = await self._opening
        last, self._pending, self._pending_size = self._pending, [], 0
        if self._writing is not None:
            await self._writing
        if last:
            self._writing = asyncio.get_running_loop().run_in_executor(_writers, _write_all, fd, last)
            await self._writing
        return fd

    async def close(self) -> None:
        """Write what is left, cut and close the file, all in one hop to a writer thread; raises what the open
        or a write raised."""
        fd, written_over = await self._opening
        last, self._pending, self._pending_size = self._pending, [], 0
        if self._writing is not None:
            try:
                await self._writing
            except BaseException:
                await _finished(fd, written_over)
                raise
        await _finished(fd, written_over, last)

    async def abort(self) -> None:
        """Drop what is pending; cut and close the file once it is open and no write is running."""
        self._pending, self._pending_size = [], 0
        await asyncio.wait([self._opening])  # an open under way cannot be called off: its fd must be closed
        if self._writing is not None:
            await asyncio.wait([self._writing])
            self._writing.exception()  # retrieved: the error that led here is the one reported
        if self._opening.exception() is None:
            await _finished(*self._opening.result())

    def _kick(self) -> None:
        """Hand what is pending to a writer thread, if the file is open and no write is running."""
        if not self._pending or not self._opening.done() or (self._writing and not self._writing.done()):
            return
        if self._writing is not None:
            self._writing.result()  # a failed write ends the upload
        fd, _ = self._opening.result()  # so does a failed open
        batch, self._pending, self._pending_size = self._pending, [], 0
        self._writing = asyncio.get_running_loop().run_in_executor(_writers, _write_all, fd, batch)
        self._writing.add_done_callback(self._ended)

    def _ended(self, step: asyncio.Future) -> None:
        """The open or a write ended: a batch waiting goes to the writer now, not when the next piece arrives
        (a client that pauses would leave it in memory); a failure is raised by the next write or close."""
        if not step.cancelled() and step.exception() is None and self._pending_size >= WRITE_BATCH:
            self._kick()


class ThreadWrites:
    """An upload's part data written by the thread that reads its body (`RawBody.rest_in_thread`) to the file of
    the `FileSink` it targets: held (the pieces kept, at most MAX_READ_AHEAD bytes) while the file opens, so the
    open does not stop the reading, then written in order, each before the thread reads on."""

    def __init__(self, loop: asyncio.AbstractEventLoop, opened: Callable[[], None]) -> None:
        self._loop = loop
        self._opened = opened  # called once the target's file is open: the thread then writes what it holds
        self._sink: FileSink | None = None
        self._fd: int | None = None
        self._held: list[bytes | bytearray | memoryview] = []
        self._held_size = 0

    def target(self, sink: FileSink | None) -> None:
        """Write to `sink` from now on (none: drop part data), once what is held for the last one is written."""
        if sink is not self._sink:
            self.flush()
            self._sink, self._fd = sink, None
            if sink is not None:
                self._loop.call_soon_threadsafe(sink.when_open, self._opened)

    def take(self, pieces: list[bytes | bytearray]) -> None:
        """In the body's thread: whole pieces of the body are the file's data (an octet-stream upload)."""
        for piece in pieces:
            self.write(piece)
        self.flush_if_open()

    def write(self, data: bytes | bytearray | memoryview) -> None:
        """In the body's thread: `data` held, to be written with what follows, or while the file opens."""
        if self._sink is None:
            return
        self._held.append(data)
        self._held_size += len(data)
        if self._held_size >= MAX_READ_AHEAD:  # the open or the disk is behind: wait for it
            self.flush()

    def flush_if_open(self) -> None:
        """In the body's thread: write what is held if the file is open (the body's reading waits for the disk
        only), else keep it while the open runs on."""
        if self._held and (self._fd is not None or (self._sink is not None and self._sink.opened())):
            self.flush()

    def flush(self) -> None:
        """In the body's thread: write what is held, once the file is open."""
        if self._held:
            self._write(self._held)

    async def flushed(self) -> None:
        """On the event loop, once the body's thread is done: write what is held."""
        if self._held and self._sink is not None:
            fd = await self._sink.direct()
            held, self._held, self._held_size = self._held, [], 0
            await self._loop.run_in_executor(_writers, _write_all, fd, held)

    def _write(self, buffers: list[bytes | bytearray | memoryview]) -> None:
        assert self._sink is not None
        if self._fd is None:
            self._fd = asyncio.run_coroutine_threadsafe(self._sink.direct(), self._loop).result()
        self._held, self._held_size = [], 0
        _write_all(self._fd, buffers)


def _write_all(fd: int, buffers: list[bytes | bytearray | memoryview]) -> None:
    """writev, in groups of at most IOV_MAX buffers, until every byte is written."""
    views = [memoryview(b).cast("B") for b in buffers if len(b)]
    while views:
        written = os.writev(fd, views[:IOV_MAX])
        while views and written >= len(views[0]):
            written -= len(views.pop(0))
        if written:
            views[0] = views[0][written:]


async def _finished(fd: int, written_over: bool, last: list[bytes | bytearray | memoryview] | None = None) -> None:
    """Write the last buffers and close an upload's file, cut first where the upload's writes ended if it held
    older contents; in a writer thread (cutting frees blocks, which can wait on the disk), which closes the file
    even if the wait is called off."""
    finish = asyncio.get_running_loop().run_in_executor(_writers, _write_cut_close, fd, last or [], written_over)
    await asyncio.shield(finish)


def _write_cut_close(fd: int, last: list[bytes | bytearray | memoryview], written_over: bool) -> None:
    try:
        _write_all(fd, last)
    finally:
        try:
            if written_over:  # cut where the writes ended, failed or not: none of the old contents stays after
                end = os.lseek(fd, 0, os.SEEK_CUR)  # every write went on from the last
                # O_TRUNC's WRITE event comes even for a file that was empty: so does this cut's, if nothing was written
                if end == 0 or os.fstat(fd).st_size > end:
                    os.ftruncate(fd, end)
        finally:
            os.close(fd)


async def _inflated(stream: AsyncIterator[bytes | bytearray]) -> AsyncIterator[bytes]:
    """A gzip body inflated a piece at a time: the next piece waits until the file has taken this one."""
    inflater = zlib.decompressobj(wbits=31)
    async for chunk in stream:
        data = chunk
        while data and not inflater.eof:
            yield inflater.decompress(data, INFLATE_PIECE)
            data = inflater.unconsumed_tail
    if not inflater.eof:
        raise ApiError(400, "gzip body is truncated")


async def _write_stream(sink: FileSink, stream: AsyncIterator[bytes | bytearray], encoding: str) -> None:
    try:
        try:
            with _bodies.claimed(stream if encoding != "gzip" else None) as threads:
                if isinstance(stream, RawBody) and threads is not None:
                    writes = ThreadWrites(asyncio.get_running_loop(), stream.nudge)
                    writes.target(sink)
                    await stream.rest_in_thread(writes.take, threads)
                    await writes.flushed()
                else:
                    async for chunk in _inflated(stream) if encoding == "gzip" else stream:
                        await sink.write(chunk)
        except BaseException:
            await sink.abort()
            raise
        await sink.close()
    except zlib.error as exc:
        raise ApiError(400, f"gzip body is invalid: {exc}") from exc
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            raise ApiError(507, "not enough disk space available") from exc
        raise


async def _read_regular(fd: int, size: int) -> AsyncIterator[bytes | memoryview]:
    """A regular file's first `size` bytes (its size when opened, as envd sends it): a file a sandbox keeps
    appending to ends all the same. What the page cache holds is read at once, on the event loop (a
    RWF_NOWAIT read never waits on the disk); only a read that would wait goes to a thread, so a download
    of a cached file makes no thread hop per chunk, and a slow disk still never stops the event loop."""
    loop = asyncio.get_running_loop()
    offset = 0
    try:
        while offset < size:
            want = min(CHUNK, size - offset)
            chunk: bytes | memoryview | None = _read_cached(fd, want, offset)
            if chunk is None:
                chunk = await loop.run_in_executor(_readers, os.pread, fd, want, offset)
            if not chunk:
                return
            offset += len(chunk)
            yield chunk
    finally:
        os.close(fd)


def _read_cached(fd: int, size: int, offset: int) -> memoryview | None:
    """Up to `size` bytes at `offset` as far as the page cache holds them (none at the end of the file), in a
    buffer of their own; None when none are cached or the file system cannot tell without waiting."""
    buffer = spare_buffer(size)
    try:
        got = os.preadv(fd, [buffer], offset, os.RWF_NOWAIT)
    except OSError as exc:
        if exc.errno in (errno.EAGAIN, errno.EOPNOTSUPP, errno.EINVAL):
            return None
        raise
    return memoryview(buffer)[:got]


async def _encoded(chunks: AsyncIterator[bytes | memoryview], compress: bool) -> AsyncIterator[bytes | memoryview]:
    deflater = zlib.compressobj(1, zlib.DEFLATED, 31) if compress else None
    async for chunk in chunks:
        yield deflater.compress(chunk) if deflater else chunk
    if deflater:
        yield deflater.flush()
