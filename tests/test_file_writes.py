"""The endpoint's file writer: every byte of any list of buffers reaches the file, in order."""

from __future__ import annotations

import os
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from bench.localbox.files import _write_all

# varied small buffers, and large ones (a byte repeated: the order still shows) as a socket hands them over
BUFFER = st.one_of(
    st.binary(max_size=300),
    st.builds(lambda byte, size: bytes([byte]) * size, st.integers(0, 255), st.integers(60_000, 70_000)),
)


@settings(max_examples=60, deadline=None)
@given(buffers=st.lists(BUFFER, max_size=40), offsets=st.lists(st.integers(0, 5), max_size=40), many=st.booleans())
def test_every_byte_of_every_buffer_is_written_in_order(
    tmp_path_factory, buffers: list[bytes], offsets: list[int], many: bool
) -> None:
    # memoryview slices as the multipart parser hands them over, and more buffers than one writev takes
    offsets = offsets + [0] * (len(buffers) - len(offsets))
    views: list[bytes | memoryview] = [
        memoryview(b)[min(o, len(b)) :] if i % 2 else b
        for i, (b, o) in enumerate(zip(buffers, offsets[: len(buffers)], strict=True))
    ]
    if many:
        views = views + [b"x", b"", b"yz"] * 700
    target = Path(tmp_path_factory.mktemp("writes")) / "file"

    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        _write_all(fd, views)
    finally:
        os.close(fd)

    assert target.read_bytes() == b"".join(bytes(v) for v in views)
