"""Python quickstart runner: drives the unmodified `e2b` SDK through the 11 quickstart steps.

The protocol, step registry and clean-up live in driver.py, shared with the probe runner.
"""

from __future__ import annotations

import contextlib
import sys

from driver import (
    NOT_RECEIVED,
    RUN_TAG,
    Context,
    Fail,
    Observed,
    exception_details,
    excerpt,
    expect,
    kill_twice,
    main,
    step,
    wait_until_seen,
)

SUITE = "quickstart"
WORK_FILE = "/home/user/e2b-bench-py05.txt"
WORK_TEXT = "e2b-bench round trip\nünïcödé ✓\n"
MISSING_FILE = "/home/user/e2b-bench-missing.txt"


# --- steps ---------------------------------------------------------------------------------------


@step("py01_create")
def create(ctx: Context, obs: Observed) -> None:
    from e2b import Sandbox

    sandbox = Sandbox.create(template=ctx.template, timeout=ctx.shared_timeout_s, metadata=ctx.metadata)
    ctx.sandbox, ctx.sandbox_id = sandbox, sandbox.sandbox_id
    ctx.created.append(sandbox.sandbox_id)
    ctx.shared_created(sandbox.sandbox_id)
    ctx.watch(sandbox.sandbox_id, lambda: ctx.sandbox)  # later steps need its state: never replaced
    obs["sandbox_id"] = sandbox.sandbox_id
    expect(isinstance(sandbox.sandbox_id, str) and sandbox.sandbox_id != "", "sandbox_id is empty")


@step("py02_run_echo")
def run_echo(ctx: Context, obs: Observed) -> None:
    result = ctx.sandbox.commands.run("echo hello")
    obs.update(exit_code=result.exit_code, stdout=excerpt(result.stdout), stderr=excerpt(result.stderr))
    expect(result.exit_code == 0, f"exit_code is {result.exit_code!r}, expected 0")
    expect(result.stdout == "hello\n", f"stdout is {result.stdout!r}, expected 'hello\\n'")
    expect(result.stderr == "", f"stderr is {result.stderr!r}, expected ''")


@step("py03_run_nonzero_exit_raises")
def run_nonzero_exit(ctx: Context, obs: Observed) -> None:
    from e2b import CommandExitException

    try:
        result = ctx.sandbox.commands.run("echo oops >&2; exit 3")
    except CommandExitException as exc:
        obs.update(exception_details(exc))
        expect(exc.exit_code == 3, f"exit_code is {exc.exit_code!r}, expected 3")
        expect(exc.error == "exit status 3", f"error is {exc.error!r}, expected 'exit status 3'")
        expect(exc.stderr == "oops\n", f"stderr is {exc.stderr!r}, expected 'oops\\n'")
        expect(exc.stdout == "", f"stdout is {exc.stdout!r}, expected ''")
        return
    obs.update(exit_code=result.exit_code, stdout=excerpt(result.stdout), stderr=excerpt(result.stderr))
    raise Fail(f"run returned exit_code {result.exit_code!r} instead of raising CommandExitException")


STREAM_GATE = "/tmp/e2b-bench-py04-seen"
# In lockstep: the command writes its next line only once the step has received the one before (on_stdout runs a
# second command that makes the file the first waits for), so each line is read and sent on its own however
# loaded the endpoint's host is; an endpoint that holds output back until the end makes the command say so
STREAMED = "rm -f {gate}.*; for i in 1 2 3; do echo $i; [ $i = 3 ] || {wait}; done"


@step("py04_run_streaming_callbacks")
def run_streaming(ctx: Context, obs: Observed) -> None:
    chunks: list[str] = []
    signalled: list[str] = []
    refused: list[dict] = []

    def on_stdout(chunk: str) -> None:
        chunks.append(chunk)
        while len(signalled) < min("".join(chunks).count("\n"), 2):  # the lines received so far, but the last
            signalled.append(f"{STREAM_GATE}.{len(signalled) + 1}")
            try:
                ctx.sandbox.commands.run(f"touch {signalled[-1]}")
            except Exception as exc:  # the step's own signal: said as such, not as the stream's fault
                refused.append(exception_details(exc))

    streamed = STREAMED.format(gate=STREAM_GATE, wait=wait_until_seen(ctx, f"{STREAM_GATE}.$i", "line $i"))
    result = ctx.sandbox.commands.run(streamed, on_stdout=on_stdout)
    obs.update(chunks=chunks, exit_code=result.exit_code, stdout=excerpt(result.stdout), stderr=excerpt(result.stderr))
    if refused:
        obs["signal_refused"] = refused
        first = refused[0]
        raise Fail(f"the step's signal (commands.run('touch ...')) raised {first['exception']}: {first['message']}")
    held = [line for line in result.stderr.splitlines() if NOT_RECEIVED in line]
    expect(not held, f"output was not sent as it came: {'; '.join(held)} (on_stdout got {chunks!r})")
    expected = ["1\n", "2\n", "3\n"]
    expect(chunks == expected, f"on_stdout got {chunks!r}, expected {expected!r}")
    expect(result.stdout == "1\n2\n3\n", f"stdout is {result.stdout!r}, expected '1\\n2\\n3\\n'")
    expect(result.exit_code == 0, f"exit_code is {result.exit_code!r}, expected 0")


@step("py05_files_write_read")
def files_write_read(ctx: Context, obs: Observed) -> None:
    info = ctx.sandbox.files.write(WORK_FILE, WORK_TEXT)
    obs["written_path"] = info.path
    expect(info.path == WORK_FILE, f"write returned path {info.path!r}, expected {WORK_FILE!r}")
    text = ctx.sandbox.files.read(WORK_FILE)
    obs["read"] = excerpt(text)
    expect(text == WORK_TEXT, f"read returned {text!r}, expected {WORK_TEXT!r}")


@step("py06_files_list_exists_info")
def files_list_exists_info(ctx: Context, obs: Observed) -> None:
    from e2b import FileNotFoundException, FileType

    files = ctx.sandbox.files
    paths = [entry.path for entry in files.list("/home/user")]
    obs["listed"] = paths[:50]
    expect(WORK_FILE in paths, f"list('/home/user') does not contain {WORK_FILE}")
    obs["exists"], obs["exists_missing"] = files.exists(WORK_FILE), files.exists(MISSING_FILE)
    expect(obs["exists"] is True, f"exists({WORK_FILE!r}) is {obs['exists']!r}, expected True")
    expect(obs["exists_missing"] is False, f"exists(missing) is {obs['exists_missing']!r}, expected False")
    try:
        content = files.read(MISSING_FILE)
    except FileNotFoundException as exc:
        obs["read_missing"] = exception_details(exc)
    else:
        raise Fail(f"read(missing) returned {excerpt(content)!r} instead of raising FileNotFoundException")
    entry = files.get_info(WORK_FILE)
    observed = {"name": entry.name, "type": entry.type, "path": entry.path, "size": entry.size}
    obs["entry"] = observed
    wanted = {
        "name": WORK_FILE.rsplit("/", 1)[1],
        "type": FileType.FILE,
        "path": WORK_FILE,
        "size": len(WORK_TEXT.encode()),
    }
    wrong = {key: observed[key] for key in wanted if observed[key] != wanted[key]}
    expect(not wrong, f"get_info fields differ: {wrong!r}, expected { ({k: wanted[k] for k in wrong})!r}")


@step("py07_background_list_kill")
def background_list_kill(ctx: Context, obs: Observed) -> None:
    from e2b import CommandExitException

    commands = ctx.sandbox.commands
    handle = commands.run("sleep 30", background=True)
    obs["pid"] = handle.pid
    killed = False
    try:
        pids = [process.pid for process in commands.list()]
        obs["listed_pids"] = pids
        expect(handle.pid in pids, f"pid {handle.pid} not in commands.list() pids {pids}")
        killed = commands.kill(handle.pid)
        obs["kill"] = killed
        expect(killed is True, f"commands.kill(pid) returned {killed!r}, expected True")
        try:
            result = handle.wait()
        except CommandExitException as exc:
            obs["wait"] = exception_details(exc)
            expect(exc.exit_code == -1, f"wait() raised exit_code {exc.exit_code!r}, expected -1")
        else:
            raise Fail(f"wait() returned exit_code {result.exit_code!r} instead of raising")
    finally:
        if killed is not True:
            # Best effort: the failure itself is already reported.
            with contextlib.suppress(Exception):
                commands.kill(handle.pid)


@step("py08_list_and_get_info")
def list_and_get_info(ctx: Context, obs: Observed) -> None:
    from e2b import Sandbox, SandboxQuery, SandboxState

    paginator = Sandbox.list(query=SandboxQuery(state=[SandboxState.RUNNING], metadata=ctx.metadata))
    ids: list[str] = []
    for _ in range(20):
        ids.extend(item.sandbox_id for item in paginator.next_items())
        if not paginator.has_next:
            break
    obs["listed_ids"] = ids[:50]
    expect(ctx.sandbox_id in ids, f"Sandbox.list(running, metadata) does not contain {ctx.sandbox_id}")
    info = ctx.sandbox.get_info()
    obs["info"] = {"sandbox_id": info.sandbox_id, "state": info.state, "metadata": info.metadata}
    expect(info.sandbox_id == ctx.sandbox_id, f"get_info().sandbox_id is {info.sandbox_id!r}")
    expect(info.state == SandboxState.RUNNING, f"get_info().state is {info.state!r}, expected running")
    tag = info.metadata.get(RUN_TAG)
    expect(tag == ctx.run_id, f"get_info().metadata[{RUN_TAG!r}] is {tag!r}, expected {ctx.run_id!r}")


@step("py09_set_timeout_pause_connect")
def set_timeout_pause_connect(ctx: Context, obs: Observed) -> None:
    from e2b import Sandbox, SandboxState

    # Longer than the sandbox was given, so endAt moves later and the steps after this one keep their sandbox.
    seconds = ctx.shared_timeout_s + 60
    before = Sandbox.get_info(ctx.sandbox_id).end_at
    ctx.sandbox.set_timeout(seconds)
    after = Sandbox.get_info(ctx.sandbox_id).end_at
    obs.update(end_at_before=before.isoformat(), end_at_after=after.isoformat())
    expect(after > before, f"end_at did not move after set_timeout({seconds}): {before} -> {after}")
    ctx.lifetime_changed(ctx.sandbox_id)  # a resume gives it the endpoint's default lifetime
    paused = ctx.sandbox.pause()
    obs["pause"] = paused
    expect(paused is True, f"pause() returned {paused!r}, expected True")
    state = Sandbox.get_info(ctx.sandbox_id).state
    obs["state_after_pause"] = state
    expect(state == SandboxState.PAUSED, f"state after pause() is {state!r}, expected paused")
    # connect() rotates the envd access token: the old handle must not be used for envd any more.
    ctx.sandbox = Sandbox.connect(ctx.sandbox_id)
    result = ctx.sandbox.commands.run("echo back")
    obs.update(exit_code=result.exit_code, stdout=excerpt(result.stdout))
    expect(result.stdout == "back\n", f"run('echo back') stdout is {result.stdout!r}, expected 'back\\n'")


step("py10_kill")(kill_twice)


@step("py11_refusals")
def refusals(ctx: Context, obs: Observed) -> None:
    from e2b import AuthenticationException, Sandbox, SandboxNotFoundException

    try:
        info = Sandbox.get_info(ctx.sandbox_id)
    except SandboxNotFoundException as exc:
        obs["get_info_killed"] = exception_details(exc)
    else:
        raise Fail(f"Sandbox.get_info(killed id) returned state {info.state!r} instead of raising")
    try:
        stray = Sandbox.create(
            template=ctx.template, api_key="e2b_wrong", timeout=ctx.sandbox_timeout_s, metadata=ctx.metadata
        )
    except AuthenticationException as exc:
        obs["create_wrong_key"] = exception_details(exc)
    else:
        ctx.created.append(stray.sandbox_id)
        raise Fail(f"Sandbox.create(api_key='e2b_wrong') created sandbox {stray.sandbox_id}")


if __name__ == "__main__":
    sys.exit(main({SUITE}))
