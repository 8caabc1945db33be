"""The code interpreter: the HTTP server on port 49999 of every `code-interpreter-v1` sandbox.

It runs INSIDE the sandbox, on the template's own Python (standard library + Debian's jupyter_client), as
the sandbox's `user`; the endpoint never imports it. Each context is a real ipykernel process driven with
jupyter_client. The protocol is the one the `e2b-code-interpreter` SDKs speak:

- `POST /execute` {code, context_id?, language?, env_vars?} answers a stream of JSON lines, one per event:
  `{"type": "stdout"|"stderr", "text", "timestamp"}`, `{"type": "result", <format>: ..., "is_main_result"}`,
  `{"type": "error", "name", "value", "traceback"}`, `{"type": "number_of_executions", "execution_count"}`,
  and last `{"type": "end_of_execution"}`. A client that goes away interrupts its cell.
- `POST /contexts` {language?, cwd?}, `GET /contexts`, `POST /contexts/{id}/restart`, `DELETE /contexts/{id}`.
- `GET /health`.

Started by the endpoint (codeinterp.py), it prints `ready` once it listens and `kernel` once the default context's
kernel is ready (or failed). A sandbox prepared ahead of its create (a warm pool) has its server started with none
of the sandbox's env vars: the create hands them over on stdin as one JSON line `{"envs": {...}}`, which the server
sets for itself (so every kernel it starts later has them) and in the running default kernel, then prints `envs`.
As E2B's own server reads the sandbox's env vars from envd after its template's snapshot resumed.
"""

from __future__ import annotations

import json
import os
import queue
import select
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from jupyter_client.manager import KernelManager  # type: ignore[import-not-found]

PORT = 49999
DEFAULT_CWD = "/home/user"
KERNELS = {"python": "python3"}  # language -> kernel spec; the only kernel this template holds
KERNEL_START_FLAG = "--kernel-start-s="  # how long a kernel may take to start: the endpoint scales it by the
KERNEL_START_S = next(  # host's slowness (as every deadline that waits on the host) and passes it here
    (float(arg.removeprefix(KERNEL_START_FLAG)) for arg in sys.argv[1:] if arg.startswith(KERNEL_START_FLAG)), 60.0
)
POLL_S = 0.2  # how often a running cell checks that its client is still there
INTERRUPT_EVERY_S = 1.0
MAX_BODY = 16 << 20
# Display formats the SDK knows, by MIME type; anything else goes to `extra`.
FORMATS = {
    "text/plain": "text", "text/html": "html", "text/markdown": "markdown", "image/svg+xml": "svg",
    "image/png": "png", "image/jpeg": "jpeg", "application/pdf": "pdf", "text/latex": "latex",
    "application/json": "json", "application/javascript": "javascript",
}  # fmt: skip
DIED = {"type": "error", "name": "DeadKernelError", "value": "", "traceback": ""}
ENV_SET = """\
import os as _e2b_os
_e2b_saved_env = {{k: _e2b_os.environ.get(k) for k in {keys!r}}}
_e2b_os.environ.update({values!r})
"""
ENV_UPDATE = "import os as _e2b_os\n_e2b_os.environ.update({values!r})\ndel _e2b_os\n"
ENV_RESTORE = """\
for _e2b_k, _e2b_v in _e2b_saved_env.items():
    if _e2b_v is None:
        _e2b_os.environ.pop(_e2b_k, None)
    else:
        _e2b_os.environ[_e2b_k] = _e2b_v
del _e2b_k, _e2b_v, _e2b_saved_env, _e2b_os
"""


class RequestError(Exception):
    """A request the server answers with an error status and a message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class ClientGone(Exception):
    """The client of a running cell closed its connection."""


class Context:
    """One kernel, its language and working directory; cells run one at a time."""

    interpreter_lock = threading.Lock()  # guards every context's pending_envs and the server's environment

    def __init__(self, language: str, cwd: str) -> None:
        self.id = str(uuid.uuid4())
        self.language = language
        self.cwd = cwd
        self.lock = threading.Lock()
        self.ready = threading.Event()
        self.failure: str | None = None
        self.manager = KernelManager(kernel_name=KERNELS[language])
        self.client: Any = None
        self.removed = False
        self.pending_envs: dict[str, str] = {}  # the sandbox's env vars handed over after its kernel started

    def describe(self) -> dict[str, str]:
        return {"id": self.id, "language": self.language, "cwd": self.cwd}

    def start(self) -> None:
        try:
            self.manager.start_kernel(cwd=self.cwd)
            self._connect()
        except Exception as exc:  # told to whoever uses the context
            self.failure = f"the {self.language} kernel did not start: {exc}"
        finally:
            self.ready.set()

    def _connect(self) -> None:
        self.client = self.manager.client()
        self.client.start_channels()
        self.client.wait_for_ready(timeout=KERNEL_START_S)

    def wait_ready(self) -> None:
        if not self.ready.wait(KERNEL_START_S) or self.failure:
            raise RequestError(500, self.failure or f"the {self.language} kernel is not ready")

    def restart(self) -> None:
        self.wait_ready()
        with self.lock:
            self.client.stop_channels()
            self.manager.restart_kernel(now=True)
            self._connect()

    def shutdown(self) -> None:
        if self.client is not None:
            self.client.stop_channels()
        if self.manager.has_kernel:
            self.manager.shutdown_kernel(now=True)

    def execute(
        self, code: str, env_vars: dict[str, str], emit: Callable[[dict], None], gone: Callable[[], bool]
    ) -> None:
        self.wait_ready()
        with self.lock:
            self._set_pending_envs()
            if env_vars:
                self._drain(self.client.execute(ENV_SET.format(keys=list(env_vars), values=env_vars), silent=True))
            try:
                # No queue of ours to abort (one cell at a time per context): with stop_on_error, a cell sent just
                # after an interrupted one could land in the kernel's abort window and be dropped unrun.
                msg_id = self.client.execute(code, store_history=True, allow_stdin=False, stop_on_error=False)
                for event in self._events(msg_id, gone):
                    emit(event)
            finally:
                if env_vars:
                    self._drain(self.client.execute(ENV_RESTORE, silent=True))
                self._drop_replies()

    def _set_pending_envs(self) -> None:
        """Set the env vars handed over since the kernel started in it, silently, before its next cell."""
        with self.interpreter_lock:
            envs, self.pending_envs = self.pending_envs, {}
        if envs:
            self._drain(self.client.execute(ENV_UPDATE.format(values=envs), silent=True))
            self._drop_replies()

    def _events(self, msg_id: str, gone: Callable[[], bool]) -> Iterator[dict]:
        """The cell's output as protocol events until the kernel is idle again; a client that goes away
        interrupts the cell (repeatedly, until the kernel is idle) and gets nothing more."""
        interrupted_at: float | None = None
        while True:
            try:
                msg = self.client.get_iopub_msg(timeout=POLL_S)
            except queue.Empty:
                msg = None
            if msg is None and not self.manager.is_alive():
                yield self._revive() if not self.removed else {**DIED, "value": "the context was removed"}
                return
            if interrupted_at is None and gone():
                interrupted_at = 0.0
            if interrupted_at is not None and time.monotonic() - interrupted_at >= INTERRUPT_EVERY_S:
                self.manager.interrupt_kernel()
                interrupted_at = time.monotonic()
            if msg is None or msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind == "status" and content["execution_state"] == "idle":
                return
            event = to_event(kind, content)
            if event is not None and interrupted_at is None:
                yield event

    def _revive(self) -> dict:
        """The kernel died mid-cell (the code ended its process): a new one takes its place."""
        process = getattr(self.manager.provisioner, "process", None)
        code = process.poll() if process is not None else None
        self.client.stop_channels()
        self.manager.restart_kernel(now=True)
        self._connect()
        return {
            **DIED,
            "value": f"the kernel died while running the cell (exit code {code}); the context has a new kernel",
        }

    def _drain(self, msg_id: str) -> None:
        while True:
            msg = self.client.get_iopub_msg(timeout=KERNEL_START_S)
            mine = msg["parent_header"].get("msg_id") == msg_id
            if mine and msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                return

    def _drop_replies(self) -> None:
        """Replies on the shell channel are not needed (iopub says it all): never let them pile up."""
        while True:
            try:
                self.client.get_shell_msg(timeout=0)
            except queue.Empty:
                return


def to_event(kind: str, content: dict) -> dict | None:
    if kind == "stream":
        return {"type": content["name"], "text": content["text"], "timestamp": time.time_ns()}
    if kind in ("execute_result", "display_data"):
        return {"type": "result", **result_fields(content.get("data", {})), "is_main_result": kind == "execute_result"}
    if kind == "error":
        return {
            "type": "error",
            "name": content["ename"],
            "value": content["evalue"],
            "traceback": "\n".join(content["traceback"]),
        }
    if kind == "execute_input":
        return {"type": "number_of_executions", "execution_count": content["execution_count"]}
    return None


def result_fields(data: dict[str, Any]) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    for mime, value in data.items():
        if mime in FORMATS:
            fields[FORMATS[mime]] = value
        else:
            extra[mime] = value
    if extra:
        fields["extra"] = extra
    return fields


class Interpreter:
    """Every context of the sandbox; one default context per language, made when first asked for."""

    def __init__(self) -> None:
        self.contexts: dict[str, Context] = {}
        self.defaults: dict[str, Context] = {}
        self.lock = threading.Lock()
        self.default_lock = threading.Lock()

    def create(self, language: str | None, cwd: str | None, default: bool = False) -> Context:
        language = language or "python"
        if language not in KERNELS:
            raise RequestError(400, f"language '{language}' is not available in this template (it has: python)")
        cwd = cwd or DEFAULT_CWD
        if not os.path.isdir(cwd):
            raise RequestError(400, f"cwd '{cwd}' is not a directory in the sandbox")
        context = Context(language, cwd)
        with self.lock:
            self.contexts[context.id] = context
            if default:
                self.defaults[language] = context
        threading.Thread(target=context.start, daemon=True).start()
        return context

    def default(self, language: str | None) -> Context:
        language = language or "python"
        with self.default_lock:  # two first cells at once still make one default context
            context = self.defaults.get(language)
            return context or self.create(language, None, default=True)

    def get(self, context_id: str) -> Context:
        context = self.contexts.get(context_id)
        if context is None:
            raise RequestError(404, f"context '{context_id}' not found")
        return context

    def remove(self, context_id: str) -> None:
        context = self.get(context_id)
        with self.lock:
            self.contexts.pop(context_id, None)
            if self.defaults.get(context.language) is context:
                del self.defaults[context.language]
        context.removed = True
        context.ready.wait(KERNEL_START_S)
        context.shutdown()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self._answer(self._get)

    def do_POST(self) -> None:
        self._answer(self._post)

    def do_DELETE(self) -> None:
        self._answer(self._delete)

    def _answer(self, route: Callable[[list[str]], object]) -> None:
        parts = [p for p in self.path.split("?", 1)[0].split("/") if p]
        try:
            answer = route(parts)
        except RequestError as exc:
            self._send(exc.status, {"error": str(exc)})
            return
        except ClientGone:
            self.close_connection = True
            return
        if answer is not None:
            self._send(200, answer)

    def _get(self, parts: list[str]) -> object:
        if parts == ["health"]:
            return "OK"
        if parts == ["contexts"]:
            return [c.describe() for c in list(self.server.interpreter.contexts.values())]
        raise RequestError(404, f"no route GET {self.path}")

    def _post(self, parts: list[str]) -> object:
        body = self._body()
        interpreter = self.server.interpreter
        if parts == ["execute"]:
            self._execute(body)
            return None
        if parts == ["contexts"]:
            return interpreter.create(_optional_str(body, "language"), _optional_str(body, "cwd")).describe()
        if len(parts) == 3 and parts[0] == "contexts" and parts[2] == "restart":
            interpreter.get(parts[1]).restart()
            return {}
        raise RequestError(404, f"no route POST {self.path}")

    def _delete(self, parts: list[str]) -> object:
        if len(parts) == 2 and parts[0] == "contexts":
            self.server.interpreter.remove(parts[1])
            return {}
        raise RequestError(404, f"no route DELETE {self.path}")

    def _body(self) -> dict[str, Any]:
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY:
            raise RequestError(413, f"request body over {MAX_BODY} bytes")
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw) if raw.strip() else {}
        except (ValueError, RecursionError) as exc:  # RecursionError: nested deeper than the parser goes
            raise RequestError(400, f"request body is not valid JSON: {exc}") from exc
        if not isinstance(body, dict):
            raise RequestError(400, "request body must be a JSON object")
        return body

    def _execute(self, body: dict[str, Any]) -> None:
        code = body.get("code")
        if not isinstance(code, str):
            raise RequestError(400, "'code' must be a string")
        env_vars = body.get("env_vars") or {}
        if not isinstance(env_vars, dict) or not all(isinstance(v, str) for v in env_vars.values()):
            raise RequestError(400, "'env_vars' must be an object of strings")
        context_id = _optional_str(body, "context_id")
        interpreter = self.server.interpreter
        context = interpreter.get(context_id) if context_id else interpreter.default(_optional_str(body, "language"))
        context.wait_ready()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-ndjson")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        lost = threading.Event()

        def emit(event: dict) -> None:
            if lost.is_set():
                return
            try:
                self._chunk(json.dumps(event).encode() + b"\n")
            except OSError:
                lost.set()

        def gone() -> bool:
            if not lost.is_set() and self._peer_closed():
                lost.set()
            return lost.is_set()

        context.execute(code, {str(k): v for k, v in env_vars.items()}, emit, gone)
        emit({"type": "end_of_execution"})
        if lost.is_set():
            raise ClientGone
        self._chunk(b"")

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _peer_closed(self) -> bool:
        sock = self.connection
        try:
            readable, _, _ = select.select([sock], [], [], 0)
            return bool(readable) and sock.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True

    def _send(self, status: int, payload: object) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def _optional_str(body: dict[str, Any], key: str) -> str | None:
    value = body.get(key)
    if value is not None and not isinstance(value, str):
        raise RequestError(400, f"'{key}' must be a string")
    return value or None


class Server(ThreadingHTTPServer):
    daemon_threads = True
    interpreter: Interpreter


def set_envs(interpreter: Interpreter, envs: dict[str, str]) -> None:
    """The sandbox's env vars, handed over after the server started: for this process (kernels started from now
    on inherit them) and, before their next cell, every kernel started already (ready or not yet)."""
    with interpreter.lock, Context.interpreter_lock:
        os.environ.update(envs)
        for context in interpreter.contexts.values():
            context.pending_envs.update(envs)


def read_commands(interpreter: Interpreter, stream: Any) -> None:
    """The endpoint's lines on stdin until it closes it: `{"envs": {...}}`, answered `envs` once set."""
    for line in stream:
        try:
            command = json.loads(line)
            envs = {str(k): str(v) for k, v in dict(command["envs"]).items()}
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            print(f"e2b-bench code interpreter: unreadable command on stdin: {exc}", file=sys.stderr, flush=True)
            continue
        set_envs(interpreter, envs)
        print("envs", flush=True)


def main() -> None:
    server = Server(("127.0.0.1", PORT), Handler)
    interpreter = server.interpreter = Interpreter()
    default = interpreter.default("python")  # its kernel starts now, so the first cell does not wait for it
    print("ready", flush=True)  # the endpoint's boot waits for this line
    threading.Thread(target=lambda: (default.ready.wait(), print("kernel", flush=True)), daemon=True).start()
    threading.Thread(target=read_commands, args=(interpreter, sys.stdin), daemon=True).start()
    server.serve_forever()


if __name__ == "__main__":
    main()
