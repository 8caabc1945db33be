"""Python code-interpreter runner: drives the unmodified `e2b-code-interpreter` SDK through the steps of
the `[code-interpreter.py-code-interpreter]` table of sandboxes/code-interpreter/manifest.toml.

The sandbox is made on the SDK's default template (`code-interpreter-v1`); every cell goes through
`Sandbox.run_code` to the sandbox's Jupyter-backed server on port 49999. Each step asserts what the SDK
returned and, where a cell changes something, checks it through a second path (envd's files and
commands, a later cell). The step registry, outcomes and clean-up are the SDK runners' (driver.py of
sandboxes/e2b/python, loaded by path); the protocol is the runner kit's (runkit.py beside it).
"""

from __future__ import annotations

import base64
import re
import struct
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "e2b" / "python"))

from driver import Context, Fail, Observed, Refused, exception_details, excerpt, expect, kill_twice, main, step

SUITE = "code-interpreter"
TEMPLATE = "code-interpreter-v1"
HOME = "/home/user"
CONTEXT_DIR = f"{HOME}/e2b-bench-ci-context"
GO_FILE = "/tmp/e2b-bench-ci-go"  # cells/stream.py waits for it
ENV_NAME = "E2B_BENCH_CI_VAR"  # cells/env.py reads it
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")
TIMEOUT_S = 3  # the interrupted cell's timeout
AFTER_TIMEOUT_S = 15  # bound on the cell right after it (the sleep it interrupts lasts 30 s)
# Every step of the suite shares the sandbox ci01 creates: it lives three run lifetimes (a loaded host took more
# than one, 120 s scaled, to reach ci11, and it expired under the later steps: 502 "sandbox was not found").
SHARED_LIFETIMES = 3
MAX_TIMEOUT_S = 3600  # the longest lifetime E2B grants a sandbox

CELLS = Path(__file__).resolve().parents[1] / "cells"  # the cells both runners send, one file each


def cell(name: str) -> str:
    return (CELLS / f"{name}.py").read_text(encoding="utf-8")


def results_of(execution: Any) -> list[dict[str, Any]]:
    """What each result of an execution carries (formats, main or display), for the step's details."""
    return [
        {"formats": list(result.formats()), "is_main_result": result.is_main_result, "text": excerpt(result.text)}
        for result in execution.results
    ]


def run_cell(ctx: Context, obs: Observed, key: str, code: str, **options: Any) -> Any:
    """`run_code(code, **options)` with what it returned recorded under `obs[key]`."""
    execution = ctx.sandbox.run_code(code, **options)
    obs[key] = {
        "text": excerpt(execution.text),
        "results": results_of(execution),
        "stdout": execution.logs.stdout,
        "stderr": execution.logs.stderr,
        "error": None if execution.error is None else {"name": execution.error.name, "value": execution.error.value},
        "execution_count": execution.execution_count,
    }
    return execution


def expect_no_error(execution: Any, obs: Observed, key: str) -> None:
    expect(execution.error is None, f"the cell raised {obs[key]['error']!r}")


def sole_result(ctx: Context, obs: Observed, code: str) -> Any:
    """The one result of a cell that must give exactly one (and no error)."""
    execution = run_cell(ctx, obs, "cell", code)
    expect_no_error(execution, obs, "cell")
    expect(len(execution.results) == 1, f"{len(execution.results)} results, expected 1: {obs['cell']['results']!r}")
    return execution.results[0]


def expect_text(execution: Any, wanted: str, what: str) -> None:
    expect(execution.error is None, f"{what} raised {execution.error.name if execution.error else ''} in the cell")
    expect(execution.text == wanted, f"{what}: main result text is {execution.text!r}, expected {wanted!r}")


def expect_name_error(execution: Any, name: str, what: str) -> None:
    error = execution.error
    got = (error.name, error.value) if error else None
    wanted = ("NameError", f"name '{name}' is not defined")
    expect(got == wanted, f"{what}: error is {got!r}, expected {wanted!r}")


def png_size(data: bytes) -> tuple[int, int]:
    """Width and height from a PNG's IHDR chunk (the first chunk of every PNG)."""
    expect(data[:8] == PNG_SIGNATURE, f"png result does not start with the PNG signature: {data[:8]!r}")
    length, kind = struct.unpack(">I4s", data[8:16])
    expect(kind == b"IHDR" and length == 13, f"the first PNG chunk is {kind!r} ({length} bytes), expected IHDR (13)")
    width, height = struct.unpack(">II", data[16:24])
    return width, height


# --- steps ---------------------------------------------------------------------------------------


@step("ci01_create")
def create(ctx: Context, obs: Observed) -> None:
    from e2b_code_interpreter import Sandbox, SandboxException

    obs["default_template"] = Sandbox.default_template
    expect(Sandbox.default_template == TEMPLATE, f"the SDK's default template is {Sandbox.default_template!r}")
    try:
        sandbox = Sandbox.create(
            timeout=min(ctx.sandbox_timeout_s * SHARED_LIFETIMES, MAX_TIMEOUT_S), metadata=ctx.metadata
        )
    except SandboxException as exc:
        status = getattr(exc, "status_code", None)
        if status is None:  # not an answer of the endpoint's
            raise
        raise Refused(f"create on {TEMPLATE} refused: {exc}", status_code=status, message=str(exc)) from exc
    ctx.sandbox, ctx.sandbox_id = sandbox, sandbox.sandbox_id
    ctx.created.append(sandbox.sandbox_id)
    ctx.watch(sandbox.sandbox_id, lambda: ctx.sandbox)  # later steps need its contexts: never replaced
    obs["sandbox_id"] = sandbox.sandbox_id
    info = sandbox.get_info()
    obs["info"] = {"template_id": info.template_id, "name": info.name}
    expect(TEMPLATE in (info.template_id, info.name), f"get_info names template {obs['info']!r}, not {TEMPLATE}")


@step("ci02_state_across_cells")
def state_across_cells(ctx: Context, obs: Observed) -> None:
    first = run_cell(ctx, obs, "assign", "x = 41")
    expect(first.error is None and first.results == [], f"'x = 41' gave {obs['assign']!r}, expected no result")
    expect_text(run_cell(ctx, obs, "read", "x + 1"), "42", "'x + 1'")


@step("ci03_stream_callbacks")
def stream_callbacks(ctx: Context, obs: Observed) -> None:
    seen: list[list[str]] = []

    def on_stdout(message: Any) -> None:
        if not seen:  # the cell waits for this file: only a streamed first line lets it go on at once
            ctx.sandbox.files.write(GO_FILE, "go")
        seen.append(["stdout", message.line])

    execution = run_cell(
        ctx, obs, "cell", cell("stream"), on_stdout=on_stdout, on_stderr=lambda m: seen.append(["stderr", m.line])
    )
    obs["callbacks"] = seen
    wanted = [["stdout", "out-1\n"], ["stderr", "err-1\n"], ["stdout", "out-2\n"]]
    expect_no_error(execution, obs, "cell")
    # How a stream is cut into messages is the kernel's flushing (a busy host may flush "out-1" before its
    # newline): the order of the streams' text is the contract, so a stream's adjacent messages are one.
    expect(runs_of(seen) == wanted, f"the callbacks got {seen!r}, expected {wanted!r}")
    logs = ("".join(execution.logs.stdout), "".join(execution.logs.stderr))
    expect(logs == ("out-1\nout-2\n", "err-1\n"), f"logs are {(execution.logs.stdout, execution.logs.stderr)!r}")


def runs_of(messages: list[list[str]]) -> list[list[str]]:
    """`[stream, text]` messages with each stream's adjacent ones joined."""
    joined: list[list[str]] = []
    for stream, text in messages:
        if joined and joined[-1][0] == stream:
            joined[-1][1] += text
        else:
            joined.append([stream, text])
    return joined


@step("ci04_display_png")
def display_png(ctx: Context, obs: Observed) -> None:
    figure = sole_result(ctx, obs, cell("figure"))
    expect(figure.is_main_result is False, "the figure is the main result, expected a display result")
    expect(bool(figure.png), f"the figure's result has no png: {obs['cell']['results']!r}")
    data = base64.b64decode("".join(figure.png.split()), validate=True)  # line breaks are base64's own
    obs["png"] = {"bytes": len(data), "size": png_size(data), "head": base64.b64encode(data[:24]).decode()}
    expect(min(obs["png"]["size"]) > 0, f"the PNG is {obs['png']['size']!r} pixels")
    expect(str(figure.text).startswith("<Figure size"), f"the figure's text is {figure.text!r}")


@step("ci05_dataframe_html")
def dataframe_html(ctx: Context, obs: Observed) -> None:
    frame = sole_result(ctx, obs, cell("dataframe"))
    expect(frame.is_main_result is True, "the DataFrame is a display result, expected the main one")
    obs["html"] = excerpt(frame.html)
    expect(bool(frame.html) and "<table" in frame.html, "the main result has no html table")
    for header in ("<th>a</th>", "<th>b</th>"):
        expect(header in frame.html, f"the html table has no {header}")
    lines = [line.split() for line in str(frame.text).splitlines()]
    expect(lines == [["a", "b"], ["0", "1", "3"], ["1", "2", "4"]], f"the text is {frame.text!r}")


@step("ci06_display_json")
def display_json(ctx: Context, obs: Observed) -> None:
    execution = run_cell(ctx, obs, "cell", cell("json_display"))
    expect_no_error(execution, obs, "cell")
    shown = [result.json for result in execution.results if not result.is_main_result]
    obs["json"] = shown
    expect(shown == [{"answer": 42, "items": [1, 2]}], f"display results carry json {shown!r}")
    expect_text(execution, "{'k': 1}", "the dict")


@step("ci07_error")
def error(ctx: Context, obs: Observed) -> None:
    errors: list[Any] = []
    execution = run_cell(ctx, obs, "cell", "1 / 0", on_error=errors.append)
    failure = execution.error
    expect(failure is not None, "1 / 0 gave no error")
    traceback = ANSI_ESCAPE.sub("", failure.traceback)  # IPython colours its tracebacks
    obs["traceback"] = excerpt(traceback)
    got = (failure.name, failure.value)
    expect(got == ("ZeroDivisionError", "division by zero"), f"the error is {got!r}")
    expect("ZeroDivisionError" in traceback and "1 / 0" in traceback, "the traceback lacks the cell's line")
    expect(errors == [failure], f"on_error got {len(errors)} errors, expected this one")
    expect(execution.results == [], f"1 / 0 gave results {obs['cell']['results']!r}")


@step("ci08_execution_count")
def execution_count(ctx: Context, obs: Observed) -> None:
    first = run_cell(ctx, obs, "first", "'one'").execution_count
    second = run_cell(ctx, obs, "second", "'two'").execution_count
    expect(isinstance(first, int) and isinstance(second, int), f"execution counts are {first!r}, {second!r}")
    expect(second == first + 1, f"execution_count went from {first} to {second}, expected {first} to {first + 1}")


@step("ci09_env_vars")
def env_vars(ctx: Context, obs: Observed) -> None:
    expect_text(run_cell(ctx, obs, "with", cell("env"), envs={ENV_NAME: "per-run"}), "('per-run', 'per-run')", "envs")
    expect_text(run_cell(ctx, obs, "after", cell("env")), "('unset', 'unset')", "the next run")


@step("ci10_context_create_list")
def context_create_list(ctx: Context, obs: Observed) -> None:
    done = ctx.sandbox.commands.run(f"mkdir -p {CONTEXT_DIR}")
    expect(done.exit_code == 0, f"mkdir exited {done.exit_code}")
    context = ctx.sandbox.create_code_context(cwd=CONTEXT_DIR)
    ctx.state["context"] = context
    obs["created"] = {"id": context.id, "language": context.language, "cwd": context.cwd}
    expect(bool(context.id), "the context has no id")
    expect((context.language, context.cwd) == ("python", CONTEXT_DIR), f"the context is {obs['created']!r}")
    listed = {c.id: {"language": c.language, "cwd": c.cwd} for c in ctx.sandbox.list_code_contexts()}
    obs["listed"] = listed
    wanted = {"language": "python", "cwd": CONTEXT_DIR}
    expect(listed.get(context.id) == wanted, f"list_code_contexts shows it as {listed.get(context.id)!r}")


@step("ci11_context_isolation")
def context_isolation(ctx: Context, obs: Observed) -> None:
    context = ctx.state["context"]
    expect_text(run_cell(ctx, obs, "cwd", "import os; os.getcwd()", context=context), repr(CONTEXT_DIR), "getcwd()")
    expect_name_error(run_cell(ctx, obs, "x_in_context", "x", context=context), "x", "x in the context")
    expect_text(run_cell(ctx, obs, "x_in_default", "x"), "41", "x in the default context")


@step("ci12_context_restart")
def context_restart(ctx: Context, obs: Observed) -> None:
    context = ctx.state["context"]
    expect_text(run_cell(ctx, obs, "before", "y = 7; y", context=context), "7", "y before the restart")
    ctx.sandbox.restart_code_context(context)
    expect_name_error(run_cell(ctx, obs, "after", "y", context=context), "y", "y after the restart")
    expect_text(run_cell(ctx, obs, "runs", "6 * 7", context=context), "42", "a cell after the restart")


@step("ci13_timeout_interrupts")
def timeout_interrupts(ctx: Context, obs: Observed) -> None:
    from e2b import TimeoutException

    context = ctx.state["context"]
    try:
        execution = ctx.sandbox.run_code(cell("sleep"), context=context, timeout=TIMEOUT_S)
    except TimeoutException as exc:
        obs["timeout"] = exception_details(exc)
    else:
        obs["returned"] = {"results": results_of(execution), "error": str(execution.error)}
        raise Fail(f"a 30 s cell with timeout={TIMEOUT_S} returned instead of raising TimeoutException")
    message = obs["timeout"]["message"]
    expect(message.startswith("Execution timed out"), f"the timeout error says {message!r}")
    try:
        after = run_cell(ctx, obs, "next", "interrupted", context=context, timeout=AFTER_TIMEOUT_S)
    except TimeoutException as exc:
        obs["next_timeout"] = exception_details(exc)
        raise Fail(f"the next cell timed out after {AFTER_TIMEOUT_S} s: the kernel was not interrupted") from exc
    expect_text(after, "True", "`interrupted` in the next cell (KeyboardInterrupt raised in the sleep)")


@step("ci14_context_remove")
def context_remove(ctx: Context, obs: Observed) -> None:
    from e2b import NotFoundException

    context = ctx.state["context"]
    ctx.sandbox.remove_code_context(context)
    listed = [c.id for c in ctx.sandbox.list_code_contexts()]
    obs["listed"] = listed
    expect(context.id not in listed, f"list_code_contexts still shows {context.id} after remove_code_context")
    try:
        execution = ctx.sandbox.run_code("1", context=context)
    except NotFoundException as exc:
        obs["run_removed"] = exception_details(exc)
    else:
        obs["run_removed"] = {"text": execution.text}
        raise Fail("run_code in the removed context returned instead of raising NotFoundException")
    expect(context.id in obs["run_removed"]["message"], f"the error does not name the context: {obs['run_removed']!r}")


@step("ci15_second_path")
def second_path(ctx: Context, obs: Observed) -> None:
    path, text = f"{HOME}/e2b-bench-ci-cell.txt", "written by a cell\n"
    code = f"with open({path!r}, 'w') as f:\n    f.write({text!r})\n"
    expect_no_error(run_cell(ctx, obs, "write", code), obs, "write")
    obs["files_read"] = ctx.sandbox.files.read(path)
    expect(obs["files_read"] == text, f"files.read gave {obs['files_read']!r}, expected {text!r}")
    done = ctx.sandbox.commands.run(f"cat {path}")
    obs["cat"] = done.stdout
    expect(done.stdout == text, f"cat gave {done.stdout!r}, expected {text!r}")
    other = f"{HOME}/e2b-bench-ci-command.txt"
    ctx.sandbox.commands.run(f"printf 'from a command' > {other}")
    expect_text(run_cell(ctx, obs, "read", f"open({other!r}).read()"), "'from a command'", "the cell reading it")


step("ci16_kill")(kill_twice)


if __name__ == "__main__":
    sys.exit(main({SUITE}, packages=("e2b-code-interpreter", "e2b")))
