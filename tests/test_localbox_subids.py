"""Sandboxes' host ids honour the host's subordinate id configuration (/etc/subuid, /etc/subgid)."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2b import Sandbox

from bench.localbox import box
from bench.localbox.agentlink import AgentError
from bench.localbox.box import ID_BASE, ID_COUNT, IdRange, SubordinateIds
from bench.localbox.server import LocalServer, in_thread

SLOT = 4000  # far from the slots running sandboxes take first


def slot(n: int, count: int = 1) -> str:
    return f"{ID_BASE + n * ID_COUNT}:{count * ID_COUNT}"


def subids(tmp_path: Path, subuid: str, subgid: str) -> tuple[Path, Path]:
    files = (tmp_path / "subuid", tmp_path / "subgid")
    files[0].write_text(subuid)
    files[1].write_text(subgid)
    return files


@pytest.mark.parametrize(
    ("subuid", "subgid", "first_slots"),
    [
        ("", "", [0, 1, 2]),  # nothing configured: the grid from ID_BASE
        (f"alice:{slot(0)}\nbob:{slot(2)}\n", f"alice:{slot(0)}\n# comment\nbob:{slot(2)}\n", [1, 3, 4]),
        (f"alice:{slot(0)}\nroot:{slot(5, 3)}\n", f"0:{slot(6, 4)}\n", [6, 7]),  # root's uids and gids both
        (f"root:{ID_BASE + 5 * ID_COUNT + 1}:{3 * ID_COUNT}\n", f"root:{slot(0, 100)}\n", [6, 7]),  # whole only
    ],
    ids=["none", "other users' ranges", "root's ranges", "root's unaligned range"],
)
def test_sandbox_ids_are_taken_where_the_subordinate_id_files_allow(
    tmp_path: Path, subuid: str, subgid: str, first_slots: list[int]
) -> None:
    subordinate = SubordinateIds.read(subids(tmp_path, subuid, subgid))

    assert subordinate.slots()[: len(first_slots)] == first_slots


def test_a_configuration_that_leaves_no_range_is_refused_in_one_sentence(tmp_path: Path) -> None:
    subordinate = SubordinateIds.read(subids(tmp_path, f"root:{ID_BASE}:1000\n", f"root:{slot(0)}\n"))

    with pytest.raises(AgentError) as refused:
        IdRange.take(tmp_path / "locks", subordinate)

    assert str(refused.value).startswith("/etc/subuid and /etc/subgid leave sandboxes no whole range of 65536 ids")
    assert not list((tmp_path / "locks").iterdir())


@pytest.fixture
def configured_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[LocalServer]:
    monkeypatch.setattr(box, "SUBID_FILES", subids(tmp_path, f"root:{slot(SLOT)}\n", f"root:{slot(SLOT)}\n"))
    local = LocalServer(pool_size=0)
    with in_thread(local):
        yield local


def test_a_sandbox_runs_as_ids_of_roots_configured_range(configured_server: LocalServer) -> None:
    ep = configured_server.endpoint
    sandbox = Sandbox.create(timeout=60, api_key=ep.api_key, api_url=ep.api_url, sandbox_url=ep.sandbox_url)
    try:
        record = configured_server.registry.get(sandbox.sandbox_id)
        assert record is not None
        pid1 = record.box._root_pid()
        uid_map = Path(f"/proc/{pid1}/uid_map").read_text().split()
        host_uid = os.stat(f"/proc/{pid1}").st_uid
    finally:
        sandbox.kill()

    assert uid_map[:2] == ["0", str(ID_BASE + SLOT * ID_COUNT)]
    assert host_uid == int(uid_map[1])


def test_a_server_takes_the_lowest_range_it_may_find_free_and_a_released_one_first(tmp_path: Path) -> None:
    locks, grid = tmp_path / "locks", SubordinateIds()
    taken = [IdRange.take(locks, grid) for _ in range(3)]
    other = os.open(locks / "3", os.O_RDWR | os.O_CREAT)  # slot 3 held by another server's sandbox
    fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
    try:
        taken[1].release()
        again, past_other = IdRange.take(locks, grid), IdRange.take(locks, grid)
    finally:
        os.close(other)

    slots = [(ids.base - ID_BASE) // ID_COUNT for ids in (*taken, again, past_other)]
    assert slots == [0, 1, 2, 1, 4]


def test_the_subordinate_id_files_are_read_again_when_they_change(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = subids(tmp_path, f"root:{slot(SLOT)}\n", f"root:{slot(SLOT)}\n")
    monkeypatch.setattr(box, "SUBID_FILES", files)
    before = box._configured_slots()
    for path in files:
        path.write_text(f"root:{slot(SLOT + 1, 2)}\n")

    assert (before, box._configured_slots()) == ([SLOT], [SLOT + 1, SLOT + 2])
