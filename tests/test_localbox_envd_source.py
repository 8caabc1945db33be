"""The embedded endpoint does what E2B's own envd does where its source settles a question (#43 item 5).

Each test pins one behaviour read in envd's source (/work/shared/reference/e2b-envd-source, packages/envd, the
file and function named in the test), through the unmodified SDK and checked a second way (a shell in the
sandbox as root).
"""

from __future__ import annotations

import pytest
from e2b import CommandExitException, InvalidArgumentException, NotFoundException, Sandbox

ROOT_ONLY = (
    "mkdir -p /root/closed && printf secret > /root/closed/s.txt"
    " && chmod 700 /root/closed && chmod 600 /root/closed/s.txt"
)


def test_a_download_is_opened_as_root_whoever_asks(sandbox: Sandbox) -> None:
    """internal/api/download.go GetFiles: the user is looked up only for permissions.ExpandAndResolve (`~` and
    relative paths); the file is then opened with os.Open by envd itself, which runs as root."""
    sandbox.commands.run(ROOT_ONLY, user="root")

    as_user = sandbox.files.read("/root/closed/s.txt")
    relative_as_root = sandbox.files.read("closed/s.txt", user="root")
    unchanged = sandbox.commands.run("stat -c '%U %a' /root/closed/s.txt", user="root").stdout

    assert (as_user, relative_as_root, unchanged) == ("secret", "secret", "root 600\n")


def test_stat_list_and_watch_act_as_root(sandbox: Sandbox) -> None:
    """internal/services/filesystem/stat.go Stat, dir.go ListDir, watch.go watchHandler: the user only expands the
    path; the stat, the walk and the inotify watch are envd's own, as root."""
    sandbox.commands.run(ROOT_ONLY, user="root")

    info = sandbox.files.get_info("/root/closed/s.txt")
    listed = [e.name for e in sandbox.files.list("/root/closed")]
    handle = sandbox.files.watch_dir("/root/closed")
    handle.stop()

    assert (info.owner, info.permissions, info.size) == ("root", "-rw-------", 6)
    assert listed == ["s.txt"]


def test_move_renames_as_root_and_its_new_parents_belong_to_the_user(sandbox: Sandbox) -> None:
    """internal/services/filesystem/move.go Move: permissions.EnsureDirs makes the destination's missing parents
    owned by the user, then os.Rename runs as root: no permission check of the user's."""
    sandbox.commands.run("mkdir -p /opt/held && printf r > /opt/held/r.txt && chmod 755 /opt/held", user="root")

    moved = sandbox.files.rename("/opt/held/r.txt", "/opt/new/parent/r.txt")
    seen = sandbox.commands.run(
        "stat -c '%U %n' /opt/new /opt/new/parent /opt/new/parent/r.txt; test -e /opt/held/r.txt || echo gone",
        user="root",
    ).stdout

    assert moved.path == "/opt/new/parent/r.txt"
    assert seen.splitlines() == ["user /opt/new", "user /opt/new/parent", "root /opt/new/parent/r.txt", "gone"]


def test_remove_removes_as_root(sandbox: Sandbox) -> None:
    """internal/services/filesystem/remove.go Remove: os.RemoveAll as root."""
    sandbox.commands.run(ROOT_ONLY, user="root")

    sandbox.files.remove("/root/closed")

    assert sandbox.commands.run("test -e /root/closed || echo gone", user="root").stdout == "gone\n"


def test_make_dir_under_a_root_directory_is_made_by_root_for_the_user(sandbox: Sandbox) -> None:
    """internal/services/filesystem/dir.go MakeDir: permissions.EnsureDirs mkdirs as root and chowns each new
    directory to the user, so a user makes a directory where it could not itself."""
    made = sandbox.files.make_dir("/opt/by-user/deeper")

    owners = sandbox.commands.run("stat -c '%U %a %n' /opt/by-user /opt/by-user/deeper", user="root").stdout

    assert made is True
    assert owners.splitlines() == ["user 755 /opt/by-user", "user 755 /opt/by-user/deeper"]


def test_make_dir_of_an_existing_file_is_an_invalid_argument_and_of_a_link_to_a_directory_exists(
    sandbox: Sandbox,
) -> None:
    """internal/services/filesystem/dir.go MakeDir: os.Stat (through links) of an existing path is already_exists
    for a directory (the SDKs answer False) and invalid_argument otherwise (the SDKs raise)."""
    sandbox.commands.run("mkdir -p /home/user/md && touch /home/user/md/file && ln -s /tmp /home/user/md/link")

    with pytest.raises(InvalidArgumentException) as refused:
        sandbox.files.make_dir("/home/user/md/file")
    through_link = sandbox.files.make_dir("/home/user/md/link")

    assert "not a directory" in str(refused.value)
    assert through_link is False


def test_a_working_directory_that_does_not_exist_is_an_invalid_argument(sandbox: Sandbox) -> None:
    """internal/services/process/handler/handler.go New: the resolved cwd is stat'ed (as root) before the start;
    a missing one is invalid_argument "cwd '...' does not exist"."""
    with pytest.raises(InvalidArgumentException) as refused:
        sandbox.commands.run("pwd", cwd="/no/such/dir")

    assert str(refused.value) == "cwd '/no/such/dir' does not exist"


def test_connect_to_a_process_that_ended_lately_gets_its_start_and_end(sandbox: Sandbox) -> None:
    """internal/services/process/service.go finalizeTermination keeps each exit terminatedRetentionTTL (30 s);
    connect.go handleConnect serves a process no longer running from it (serveTerminated): its start, then
    its end, no output. A pid that never ran is still not_found."""
    handle = sandbox.commands.run("exit 3", background=True)
    with pytest.raises(CommandExitException) as first:
        handle.wait()

    late = sandbox.commands.connect(handle.pid)
    with pytest.raises(CommandExitException) as again:
        late.wait()
    with pytest.raises(NotFoundException):
        sandbox.commands.connect(handle.pid + 100_000)

    assert late.pid == handle.pid
    assert (first.value.exit_code, again.value.exit_code) == (3, 3)
    assert (again.value.stdout, again.value.stderr) == ("", "")
