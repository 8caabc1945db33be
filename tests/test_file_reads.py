"""The endpoint's download reader: a regular file's bytes up to its size at open, from the page cache or a thread."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from bench.localbox.files import CHUNK, _read_cached, _read_regular

SIZE = 3 * CHUNK + 12345  # several chunks and a short last one


def read_all(fd: int, size: int) -> bytes:
    async def collect() -> bytes:
        return b"".join([bytes(chunk) async for chunk in _read_regular(fd, size)])

    return asyncio.run(collect())


def test_a_file_appended_to_after_open_is_read_up_to_its_size_at_open(tmp_path: Path) -> None:
    content = os.urandom(SIZE)
    target = tmp_path / "file"
    target.write_bytes(content)
    fd = os.open(target, os.O_RDONLY)
    with target.open("ab") as appender:  # the sandbox keeps writing while the download runs
        appender.write(b"later" * 1000)

    assert read_all(fd, SIZE) == content


def test_a_file_the_page_cache_does_not_hold_is_read_whole_by_a_thread(tmp_path: Path) -> None:
    content = os.urandom(SIZE)
    target = tmp_path / "file"
    target.write_bytes(content)
    fd = os.open(target, os.O_RDONLY)
    os.fsync(fd)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # clean pages dropped: a read now waits on the disk
    assert _read_cached(fd, CHUNK, 0) is None, "the page cache still holds the file: the thread path is not tried"

    assert read_all(fd, SIZE) == content


def test_a_file_that_shrank_after_open_ends_where_it_ends(tmp_path: Path) -> None:
    target = tmp_path / "file"
    target.write_bytes(b"x" * SIZE)
    fd = os.open(target, os.O_RDONLY)
    os.truncate(target, 100)

    assert read_all(fd, SIZE) == b"x" * 100
