"""The unmodified `e2b-code-interpreter` SDK against the embedded endpoint's `code-interpreter-v1` template."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator

import httpx
import pytest
from e2b import NotFoundException, SandboxException, TimeoutException
from e2b_code_interpreter import OutputMessage, Sandbox

from bench.localbox.registry import SETTLE_MAX_S
from bench.localbox.server import LocalEndpoint, LocalServer
from bench.localbox.template import TemplateError, ensure_template
from bench.remote.slowness import scaled

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def ci(endpoint: LocalEndpoint) -> Iterator[Sandbox]:
    ensure_template(name="code-interpreter-v1")  # the explicit prepare step: a cold build is not a create's
    sbx = Sandbox.create(timeout=300, envs={"SANDBOX_WIDE": "from-create"})
    try:
        yield sbx
    finally:
        sbx.kill()


def test_state_persists_across_cells_and_the_last_expression_is_the_main_result(ci: Sandbox) -> None:
    ci.run_code("counter = 40")
    ci.run_code("counter += 1")
    execution = ci.run_code("counter + 1")

    assert [(r.text, r.is_main_result) for r in execution.results] == [("42", True)]
    assert execution.error is None
    assert isinstance(execution.execution_count, int) and execution.execution_count >= 3


def test_stdout_and_stderr_stream_to_callbacks_in_order(ci: Sandbox) -> None:
    seen: list[tuple[str, bool]] = []

    def record(message: OutputMessage) -> None:
        seen.append((message.line, message.error))

    execution = ci.run_code(
        "import sys, time\nprint('one', flush=True)\ntime.sleep(0.2)\nprint('two', file=sys.stderr, flush=True)",
        on_stdout=record,
        on_stderr=record,
    )

    assert seen == [("one\n", False), ("two\n", True)]
    assert (execution.logs.stdout, execution.logs.stderr) == (["one\n"], ["two\n"])


def test_a_matplotlib_figure_is_a_png_display_result(ci: Sandbox) -> None:
    execution = ci.run_code("import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()")

    assert len(execution.results) == 1
    figure = execution.results[0]
    assert figure.is_main_result is False
    assert figure.png is not None and base64.b64decode(figure.png).startswith(PNG_MAGIC)
    assert figure.text is not None and figure.text.startswith("<Figure size")


def test_a_pandas_dataframe_is_an_html_and_text_result(ci: Sandbox) -> None:
    execution = ci.run_code("import pandas as pd\npd.DataFrame({'city': ['Oslo', 'Lima'], 'n': [7, 9]})")

    (frame,) = execution.results
    assert frame.is_main_result is True
    assert frame.html is not None and "<table" in frame.html and "<td>Oslo</td>" in frame.html
    assert frame.text is not None and frame.text.split() == ["city", "n", "0", "Oslo", "7", "1", "Lima", "9"]


def test_an_error_carries_name_value_and_traceback_and_the_context_lives_on(ci: Sandbox) -> None:
    failed = ci.run_code("def explode():\n    raise KeyError('missing')\nexplode()")
    after = ci.run_code("'still here'")

    assert failed.error is not None
    assert (failed.error.name, failed.error.value) == ("KeyError", "'missing'")
    assert "explode" in failed.error.traceback and "KeyError" in failed.error.traceback
    assert failed.results == []
    assert [r.text for r in after.results] == ["'still here'"]


def test_cells_run_as_user_in_home_with_the_sandbox_envs(ci: Sandbox) -> None:
    execution = ci.run_code("import os, getpass\n(getpass.getuser(), os.getcwd(), os.environ['SANDBOX_WIDE'])")

    assert [r.text for r in execution.results] == ["('user', '/home/user', 'from-create')"]


def test_env_vars_hold_for_one_execution_only(ci: Sandbox) -> None:
    during = ci.run_code("import os\nos.environ.get('ONE_CELL')", envs={"ONE_CELL": "set", "SANDBOX_WIDE": "over"})
    shell = ci.run_code("!echo $ONE_CELL", envs={"ONE_CELL": "in-shell"})
    after = ci.run_code("(os.environ.get('ONE_CELL'), os.environ['SANDBOX_WIDE'])")

    assert [r.text for r in during.results] == ["'set'"]
    assert shell.logs.stdout == ["in-shell\r\n"]  # IPython runs `!` commands on a pty
    assert [r.text for r in after.results] == ["(None, 'from-create')"]


def test_files_a_cell_writes_are_seen_by_commands_and_files_and_back(ci: Sandbox) -> None:
    ci.run_code("open('from_cell.txt', 'w').write('written by a cell\\n')")
    ci.files.write("/home/user/from_files.txt", "written through files\n")

    by_command = ci.commands.run("cat /home/user/from_cell.txt && stat -c %U /home/user/from_cell.txt")
    by_files = ci.files.read("/home/user/from_cell.txt")
    by_cell = ci.run_code("open('/home/user/from_files.txt').read()")

    assert by_command.stdout == "written by a cell\nuser\n"
    assert by_files == "written by a cell\n"
    assert [r.text for r in by_cell.results] == ["'written through files\\n'"]


def test_contexts_have_their_own_state_and_cwd_and_can_be_restarted_and_removed(ci: Sandbox) -> None:
    context = ci.create_code_context(cwd="/tmp", language="python")
    ci.run_code("secret = 'ctx'", context=context)
    ci.run_code("secret = 'default'")

    in_context = ci.run_code("import os\n(secret, os.getcwd())", context=context)
    listed = {c.id: (c.language, c.cwd) for c in ci.list_code_contexts()}
    ci.restart_code_context(context)
    restarted = ci.run_code("import os\n('secret' in globals(), os.getcwd())", context=context)
    ci.remove_code_context(context)
    remaining = {c.id for c in ci.list_code_contexts()}

    assert (context.language, context.cwd) == ("python", "/tmp")
    assert [r.text for r in in_context.results] == ["('ctx', '/tmp')"]
    assert listed[context.id] == ("python", "/tmp")
    assert [r.text for r in restarted.results] == ["(False, '/tmp')"]
    assert context.id not in remaining and len(remaining) == len(listed) - 1
    with pytest.raises(NotFoundException):
        ci.run_code("1", context=context)


def test_a_timeout_interrupts_the_cell_and_the_context_is_free_at_once(ci: Sandbox) -> None:
    cell = "import time\ntry:\n    time.sleep(120)\nexcept KeyboardInterrupt:\n    interrupted = True\n    raise"

    with pytest.raises(TimeoutException):
        ci.run_code(cell, timeout=1)
    # Had the kernel not been interrupted, this would wait for the sleep and then fail with a NameError.
    after = ci.run_code("interrupted")

    assert [r.text for r in after.results] == ["True"]


@pytest.mark.parametrize(
    ("request_kwargs", "message"),
    [
        ({"language": "r"}, "language 'r' is not available in this template"),
        ({"cwd": "/no/such/dir"}, "cwd '/no/such/dir' is not a directory in the sandbox"),
    ],
)
def test_a_context_this_template_cannot_give_is_refused_with_the_reason(
    ci: Sandbox, request_kwargs: dict[str, str], message: str
) -> None:
    before = {c.id for c in ci.list_code_contexts()}

    with pytest.raises(SandboxException) as refused:
        ci.create_code_context(**request_kwargs)  # type: ignore[arg-type]

    assert "400" in str(refused.value) and message in str(refused.value)
    assert {c.id for c in ci.list_code_contexts()} == before


def test_a_cell_that_ends_its_kernel_gets_an_error_and_the_context_a_new_kernel(ci: Sandbox) -> None:
    context = ci.create_code_context()
    ci.run_code("kept = 1", context=context)

    died = ci.run_code("import os\nos._exit(3)", context=context)
    after = ci.run_code("'kept' in globals()", context=context)
    ci.remove_code_context(context)

    assert died.error is not None and died.error.name == "DeadKernelError"
    assert "exit code 3" in died.error.value
    assert [r.text for r in after.results] == ["False"]


def test_a_cell_reaches_neither_the_endpoint_nor_the_host(ci: Sandbox, endpoint: LocalEndpoint) -> None:
    port = int(endpoint.api_url.rsplit(":", 1)[1])
    probe = (
        "import socket\nrefused = []\n"
        f"for host in ('127.0.0.1', '10.0.2.2'):\n"
        "    try:\n"
        f"        socket.create_connection((host, {port}), timeout=3).close()\n"
        "    except OSError as exc:\n"
        "        refused.append(type(exc).__name__)\n"
        "len(refused)"
    )

    execution = ci.run_code(probe)

    assert execution.error is None
    assert [r.text for r in execution.results] == ["2"]


def test_a_cold_boot_restarts_the_server_with_fresh_kernels_and_kept_files(endpoint: LocalEndpoint) -> None:
    sbx = Sandbox.create(timeout=120)
    try:
        sbx.run_code("lost = 'memory'\nopen('kept.txt', 'w').write('on disk')")
        sbx.pause()
        sbx.connect(on_resume="reboot")

        after = sbx.run_code("('lost' in globals(), open('kept.txt').read())")
        servers = sbx.commands.run("pgrep -c -u user -f 'e2b-bench-code-interprete[r]'")
    finally:
        sbx.kill()

    assert [r.text for r in after.results] == ["(False, 'on disk')"]
    assert servers.stdout == "1\n"  # one server, as the sandbox's user


def test_a_sandbox_made_from_a_snapshot_runs_its_own_server(ci: Sandbox) -> None:
    ci.run_code("open('/home/user/snapped.txt', 'w').write('in the snapshot')\nsnapped_in_memory = True")
    snapshot = ci.create_snapshot()
    child = Sandbox.create(template=snapshot.snapshot_id, timeout=120)
    try:
        execution = child.run_code("(open('/home/user/snapped.txt').read(), 'snapped_in_memory' in globals())")
    finally:
        child.kill()
        Sandbox.delete_snapshot(snapshot.snapshot_id)

    assert [r.text for r in execution.results] == ["('in the snapshot', False)"]


def test_the_api_lists_both_built_in_templates_and_still_refuses_unknown_ones(
    ci: Sandbox, endpoint: LocalEndpoint
) -> None:
    headers = {"X-API-KEY": endpoint.api_key}

    listed = httpx.get(f"{endpoint.api_url}/templates", headers=headers)
    unknown = httpx.post(f"{endpoint.api_url}/sandboxes", json={"templateID": "code-interpreter-v9"}, headers=headers)

    assert listed.status_code == 200
    templates = {t["templateID"]: t for t in listed.json()}
    assert set(templates) == {"base", "code-interpreter-v1"}
    assert templates["code-interpreter-v1"]["spawnCount"] >= 1
    assert templates["code-interpreter-v1"]["buildStatus"] == "ready"
    assert (unknown.status_code, unknown.json()["message"]) == (404, "template 'code-interpreter-v9' not found")


def _jupyter(ci: Sandbox, endpoint: LocalEndpoint, method: str, path: str, body: object = None) -> httpx.Response:
    headers = {"E2b-Sandbox-Id": ci.sandbox_id, "E2b-Sandbox-Port": "49999"}
    return httpx.request(method, f"{endpoint.sandbox_url}{path}", json=body, headers=headers, timeout=60)


def test_execute_streams_one_json_line_per_event_and_ends_with_end_of_execution(
    ci: Sandbox, endpoint: LocalEndpoint
) -> None:
    answer = _jupyter(
        ci,
        endpoint,
        "POST",
        "/execute",
        {"code": "print('out')\nfrom IPython.display import display, JSON\ndisplay(JSON({'k': 1}))\n6 * 7"},
    )

    lines = [json.loads(line) for line in answer.text.splitlines()]
    assert answer.status_code == 200 and answer.headers["content-type"] == "application/x-ndjson"
    assert [line["type"] for line in lines] == [
        "number_of_executions",
        "stdout",
        "result",
        "result",
        "end_of_execution",
    ]
    assert isinstance(lines[0]["execution_count"], int)
    assert lines[1]["text"] == "out\n" and isinstance(lines[1]["timestamp"], int)
    assert lines[2] == {
        "type": "result",
        "text": "<IPython.core.display.JSON object>",
        "json": {"k": 1},
        "is_main_result": False,
    }
    assert lines[3] == {"type": "result", "text": "42", "is_main_result": True}


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "message"),
    [
        (
            "POST",
            "/execute",
            {"code": "1", "context_id": "no-such-context"},
            404,
            "context 'no-such-context' not found",
        ),
        ("POST", "/execute", {"code": 1}, 400, "'code' must be a string"),
        ("POST", "/execute", {"code": "1", "env_vars": {"A": 1}}, 400, "'env_vars' must be an object of strings"),
        ("DELETE", "/contexts/no-such-context", None, 404, "context 'no-such-context' not found"),
        ("GET", "/nowhere", None, 404, "no route GET /nowhere"),
    ],
)
def test_the_server_answers_bad_requests_with_a_status_and_the_reason(
    ci: Sandbox, endpoint: LocalEndpoint, method: str, path: str, body: object, status: int, message: str
) -> None:
    answer = _jupyter(ci, endpoint, method, path, body)

    assert (answer.status_code, answer.json()) == (status, {"error": message})


def test_health_answers_ok(ci: Sandbox, endpoint: LocalEndpoint) -> None:
    answer = _jupyter(ci, endpoint, "GET", "/health")

    assert (answer.status_code, answer.json()) == (200, "OK")


def test_a_server_told_to_prepare_an_unknown_template_says_which_exist() -> None:
    with pytest.raises(TemplateError) as refused:
        LocalServer(templates=("code-interpreter-v9",))

    assert (
        str(refused.value) == "there is no built-in template 'code-interpreter-v9' (known: base, code-interpreter-v1)"
    )


def test_the_code_interpreters_port_follows_the_traffic_token_rules(endpoint: LocalEndpoint) -> None:
    ensure_template(name="code-interpreter-v1")
    sbx = Sandbox.create(timeout=120, network={"allow_public_traffic": False})
    try:
        ran = sbx.run_code("6 * 7").results[0].text  # the SDK sends the sandbox's traffic token itself
        port = {"E2b-Sandbox-Id": sbx.sandbox_id, "E2b-Sandbox-Port": "49999"}
        without = httpx.get(f"{endpoint.sandbox_url}/health", headers=port)
        with_token = httpx.get(
            f"{endpoint.sandbox_url}/health",
            headers={**port, "e2b-traffic-access-token": sbx.traffic_access_token or ""},
        )
    finally:
        sbx.kill()

    assert ran == "42"
    assert (without.status_code, without.json()["code"]) == (403, 403)
    assert with_token.status_code == 200


@pytest.mark.parametrize("ready", [True, False], ids=["ready", "still-being-prepared"])
def test_a_create_takes_a_sandbox_kept_warm_and_its_env_vars_reach_every_kernel(
    endpoint: LocalEndpoint, ready: bool
) -> None:
    """E2B's template snapshots its server running: a create's first cell waits for no server or kernel. Here a
    sandbox is kept warm (its server listening, its kernel ready) and the create hands it its env vars; a create
    that finds one still being prepared takes it (its env vars reach the kernel that was starting too)."""
    ensure_template(name="code-interpreter-v1")
    api = httpx.Client(base_url=endpoint.api_url, headers={"X-API-KEY": endpoint.api_key}, timeout=None)
    template = "code-interpreter-v1"
    emptied = api.post("/e2b-bench/pool", json={"warm": {template: 0}, "within_s": min(scaled(60), SETTLE_MAX_S)})
    within_s = min(scaled(180), SETTLE_MAX_S) if ready else 0
    settled = api.post("/e2b-bench/pool", json={"warm": {template: 1}, "within_s": within_s}).json()
    sbx = Sandbox.create(timeout=120, envs={"WARM_WIDE": "given at create"})
    try:
        after = api.get("/e2b-bench/pool").json()
        first = sbx.run_code("import os\nos.environ['WARM_WIDE']")
        shell = sbx.run_code("!echo $WARM_WIDE")
        context = sbx.create_code_context()
        in_new_kernel = sbx.run_code("import os\nos.environ['WARM_WIDE']", context=context)
        kernels = sbx.commands.run("pgrep -c -u user -f ipykernel_launcher")
    finally:
        sbx.kill()
        api.close()

    none_yet = {"size": 0, "ready": 0}  # what the pool route says of it before the template's first create too
    assert emptied.json()["warm"].get(template, none_yet) == none_yet
    assert settled["settled"] is ready, settled  # not yet: the create came while it was being prepared
    assert settled["warm"] == {template: {"size": 1, "ready": int(ready)}}
    assert after["served"] == {**settled["served"], "prepared": settled["served"]["prepared"] + 1}  # none made for it
    assert [r.text for r in first.results] == ["'given at create'"]
    assert first.execution_count == 1  # the env vars were set silently: the user's first cell is the kernel's first
    assert shell.logs.stdout == ["given at create\r\n"]
    assert [r.text for r in in_new_kernel.results] == ["'given at create'"]
    assert kernels.stdout == "2\n"
