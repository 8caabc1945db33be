"""Snapshots and forks (#13 item 15): a sandbox's files, taken at a moment, become new sandboxes.

The embedded endpoint keeps the filesystem (not memory): each test checks files through commands in the new
sandboxes, and the listing and deletion through the SDK and the REST API.
"""

from __future__ import annotations

import asyncio
import os
import stat
from pathlib import Path

import httpx
import pytest
from e2b import AsyncSandbox, Sandbox, SandboxException
from js_sdk import run_js

from bench.localbox.box import shift_ids
from bench.localbox.server import LocalEndpoint
from bench.localbox.snapshots import SnapshotError, _copy_tree

STATE = "cat ~/state.txt; test -e /etc/issue && echo issue || echo no-issue; pgrep -x sleep | wc -l"


def test_a_snapshot_keeps_the_files_of_its_moment_and_stacks(endpoint: LocalEndpoint) -> None:
    source = Sandbox.create(timeout=120)
    made: list[Sandbox] = [source]
    try:
        source.commands.run("echo v1 > ~/state.txt; sudo rm /etc/issue; sleep 600 >/dev/null 2>&1 &")
        first = source.create_snapshot(name="snap-a")
        source.commands.run("echo v2 > ~/state.txt")
        child = Sandbox.create(template=first.snapshot_id, timeout=120)
        made.append(child)
        in_child = child.commands.run(STATE).stdout
        child.commands.run("echo v3 > ~/state.txt")
        second = child.create_snapshot()
        grandchild = Sandbox.create(template=second.snapshot_id, timeout=120)
        made.append(grandchild)
        in_grandchild = grandchild.commands.run(STATE).stdout
        in_source = source.commands.run(STATE).stdout
        by_sandbox = [s.snapshot_id for s in source.list_snapshots().next_items()]
        by_name = [s.snapshot_id for s in Sandbox.list_snapshots(name="snap-a").next_items()]
    finally:
        for sbx in made:
            sbx.kill()

    assert (first.snapshot_id, first.names) == ("snap-a:default", ["snap-a:default"])
    assert in_child == "v1\nno-issue\n0\n"  # files of the moment, a deleted template file stays deleted
    assert in_grandchild == "v3\nno-issue\n0\n"
    assert in_source == "v2\nno-issue\n1\n"  # the source runs on, its process untouched
    assert by_sandbox == by_name == ["snap-a:default"]


def test_deleting_a_snapshot_unlists_it_and_refuses_new_sandboxes(endpoint: LocalEndpoint) -> None:
    source = Sandbox.create(timeout=60)
    try:
        snapshot = source.create_snapshot()
        deleted, again = Sandbox.delete_snapshot(snapshot.snapshot_id), Sandbox.delete_snapshot(snapshot.snapshot_id)
        listed = [s.snapshot_id for s in source.list_snapshots().next_items()]
        with pytest.raises(SandboxException) as refused:
            Sandbox.create(template=snapshot.snapshot_id)
        base = httpx.delete(f"{endpoint.api_url}/templates/base", headers={"X-API-KEY": endpoint.api_key})
    finally:
        source.kill()

    assert (deleted, again, listed) == (True, False, [])
    assert "not found" in str(refused.value)
    assert base.status_code == 400


def test_a_fork_starts_sandboxes_with_the_sources_files(endpoint: LocalEndpoint) -> None:
    source = Sandbox.create(timeout=60, envs={"FROM": "source"}, metadata={"role": "source"})
    forks: list[Sandbox] = []
    try:
        source.commands.run("echo v1 > ~/state.txt")
        results = source.fork(count=2, timeout=60)
        forks = [f for f in results if isinstance(f, Sandbox)]
        forks[0].commands.run("echo changed > ~/state.txt")
        seen = [f.commands.run("cat ~/state.txt; echo $FROM").stdout for f in (source, *forks)]
        info = Sandbox.get_info(forks[1].sandbox_id)
    finally:
        for sbx in (source, *forks):
            sbx.kill()

    assert len(forks) == 2 and len({source.sandbox_id, *(f.sandbox_id for f in forks)}) == 3
    assert seen == ["v1\nsource\n", "changed\nsource\n", "v1\nsource\n"]
    assert info.metadata == {"role": "source"}


def test_the_async_sdk_snapshots_and_forks(endpoint: LocalEndpoint) -> None:
    async def scenario() -> tuple[str, str]:
        source = await AsyncSandbox.create(timeout=60)
        made = [source]
        try:
            await source.files.write("/home/user/a.txt", "async")
            snapshot = await source.create_snapshot()
            child = await AsyncSandbox.create(template=snapshot.snapshot_id, timeout=60)
            made.append(child)
            (fork,) = await source.fork(timeout=60)
            assert isinstance(fork, AsyncSandbox)
            made.append(fork)
            return await child.files.read("/home/user/a.txt"), await fork.files.read("/home/user/a.txt")
        finally:
            for sbx in made:
                await sbx.kill()

    assert asyncio.run(scenario()) == ("async", "async")


def test_the_npm_sdk_snapshots_and_forks(endpoint: LocalEndpoint, tmp_path: Path) -> None:
    seen = run_js(
        """
        const source = await Sandbox.create({ timeoutMs: 60000 });
        try {
          await source.files.write('/home/user/js.txt', 'from js');
          const snapshot = await source.createSnapshot({ name: 'js-snap' });
          const child = await Sandbox.create(snapshot.snapshotId, { timeoutMs: 60000 });
          const [fork] = await source.fork({ count: 1 });
          const read = [await child.files.read('/home/user/js.txt'), await fork.files.read('/home/user/js.txt')];
          await child.kill();
          await fork.kill();
          return [snapshot.snapshotId, ...read];
        } finally {
          await source.kill();
        }
        """,
        tmp_path,
    )

    assert seen == ["js-snap:default", "from js", "from js"]


# --- any file tree (#25 item 5) ----------------------------------------------------------------------------

ODD_TREE = (
    "mkdir -p ~/odd && cd ~/odd && echo data > a && ln a b && mkfifo f && ln -s a link"
    " && python3 -c 'import socket; socket.socket(socket.AF_UNIX).bind(\"s\")'"
    " && touch \"$(printf 'name-\\377')\" && cp /bin/true su && sudo chown root su && sudo chmod 4755 su"
)
DESCRIBE = (
    'cd ~/odd && stat -c \'%n %F %h %a\' a f link s su; test "$(stat -c %i a)" = "$(stat -c %i b)" && echo linked;'
    " ls | od -An -c | tr -s ' ' | grep -c '377'; cat b"
)


def test_a_tree_with_hard_links_fifos_sockets_odd_names_and_setuid_snapshots_and_forks(endpoint: LocalEndpoint) -> None:
    source = Sandbox.create(timeout=120)
    made: list[Sandbox] = [source]
    try:
        source.commands.run(ODD_TREE)
        before = source.commands.run(DESCRIBE).stdout
        child = Sandbox.create(template=source.create_snapshot().snapshot_id, timeout=120)
        made.append(child)
        forks = [f for f in source.fork(count=1, timeout=60) if isinstance(f, Sandbox)]
        made += forks
        seen = [sbx.commands.run(DESCRIBE).stdout for sbx in (child, *forks)]
    finally:
        for sbx in made:
            sbx.kill()

    assert before.splitlines()[:5] == [
        "a regular file 2 644",
        "f fifo 1 644",
        "link symbolic link 1 777",
        "s socket 1 755",
        "su regular file 1 4755",
    ]
    expected = before.replace("su regular file 1 4755", "su regular file 1 755")  # setuid dropped, as documented
    assert seen == [expected, expected]
    assert expected.splitlines()[5:] == ["linked", "1", "data"]


def test_a_copy_that_fails_leaves_nothing_and_names_no_host_path(tmp_path: Path) -> None:
    source, target = tmp_path / "upper", tmp_path / "copy"
    (source / "d").mkdir(parents=True)
    (source / "a").write_text("copied first")
    target.mkdir()
    (target / "d").write_text("a file where the sandbox has a directory")

    with pytest.raises(SnapshotError) as failed:
        _copy_tree(source, target, 0)

    assert "/d" in str(failed.value) and str(tmp_path) not in str(failed.value)
    assert not target.exists()


def test_a_layer_keeps_overlay_whiteouts_and_drops_device_nodes(tmp_path: Path) -> None:
    layer = tmp_path / "layer"
    layer.mkdir()
    os.mknod(layer / "whiteout", 0o600 | stat.S_IFCHR, os.makedev(0, 0))
    os.mknod(layer / "null", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    os.mknod(layer / "disk", 0o600 | stat.S_IFBLK, os.makedev(7, 0))

    shift_ids(layer, 0)

    assert sorted(p.name for p in layer.iterdir()) == ["whiteout"]


def test_a_template_alias_is_found_for_a_built_in_template_and_a_named_snapshot(endpoint: LocalEndpoint) -> None:
    from e2b import Template

    headers = {"X-API-KEY": endpoint.api_key}
    source = Sandbox.create(timeout=60)
    try:
        before = Template.exists("alias-snap")
        snapshot = source.create_snapshot(name="alias-snap")
        after = Template.exists("alias-snap")
        named = httpx.get(f"{endpoint.api_url}/templates/aliases/alias-snap", headers=headers)
    finally:
        source.kill()
    base = httpx.get(f"{endpoint.api_url}/templates/aliases/base", headers=headers)
    missing = httpx.get(f"{endpoint.api_url}/templates/aliases/no-such-template", headers=headers)

    assert (Template.exists("base"), Template.exists("no-such-template"), before, after) == (True, False, False, True)
    assert (base.status_code, base.json()) == (200, {"templateID": "base", "public": True})
    assert (named.status_code, named.json()["public"], snapshot.names) == (200, False, ["alias-snap:default"])
    assert isinstance(named.json()["templateID"], str) and named.json()["templateID"]
    assert (missing.status_code, missing.json()["message"]) == (404, "template alias 'no-such-template' not found")
