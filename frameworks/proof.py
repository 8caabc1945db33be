"""The proof task and symptom probes, shared by the Python framework runners.

A framework runner (`frameworks/<name>/runner.py`) describes its framework as a `Framework`: how to
open a session (an E2B backend and its sandbox, made the framework's way), run the agent once, read
a file and run a command through that backend. This module does the rest: the steps of
`frameworks/manifest.toml`, up to `attempts` tries of the proof task, the pass rule, and the
transcript (`transcript` events, which the harness writes to `<runner>.json`). The protocol (version 1)
is the Python runner kit's, sandboxes/e2b/python/runkit.py, shared with the SDK runners.

Pass rule of the proof task: a `uname` call's own result shows `Linux`, the answer's first word is
`Linux`, and a read of /home/user/proof.txt through the same backend after the answer contains the
`uname` output. It runs in the framework's pinned environment: standard library only.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import json
import os
import shlex
import sys
import time
import traceback
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "sandboxes" / "e2b" / "python"))

from runkit import Protocol, StepPlan, exit_on_sigterm, read_task

PROOF_PATH = "/home/user/proof.txt"
EXPECTED_WORD = "Linux"
EXCERPT_CHARS = 2000
DEFAULT_ATTEMPTS = 2
PROBES = {
    "fw02_exit_code": "exit 5",
    "fw03_late_output": "sleep 1; echo late",
}


@dataclass(frozen=True)
class Model:
    """The OpenAI-compatible model the agent talks to; the key is read from the variable `key_env` names."""

    base_url: str
    name: str
    key_env: str
    scripted: bool

    @property
    def key(self) -> str:
        return os.environ.get(self.key_env, "")


@dataclass
class ToolRecord:
    """One tool call as the framework ran it: what the model asked, what the tool returned."""

    name: str
    arguments: dict[str, Any]
    result: str
    error: bool = False


@dataclass
class Run:
    """One agent run: its tool calls (in order) and its final answer."""

    calls: list[ToolRecord] = field(default_factory=list)
    answer: str | None = None


@dataclass(frozen=True)
class Probe:
    """A command run straight through the framework's backend."""

    exit_code: int | None
    stdout: str
    stderr: str = ""


class Session(ABC):
    """One backend and its sandbox, opened by `Framework.session` and closed (sandbox killed) after use."""

    sandbox_id: str | None = None

    @abstractmethod
    async def ask(self, prompt: str, run: Run) -> None:
        """Run the agent on `prompt`, recording its tool calls and answer into `run` as they become known."""

    @abstractmethod
    async def read(self, path: str) -> str:
        """Read a file through the framework's backend."""

    @abstractmethod
    async def run(self, command: str) -> Probe:
        """Run a shell command through the framework's backend."""

    async def start(self) -> None:
        """Bring the backend up, where making the session does not (default: nothing more to do)."""
        return None

    async def close(self) -> None:
        """Tear the backend down and kill its sandbox (default: nothing to do)."""
        return None


class Framework(ABC):
    """What a runner says about its framework."""

    name: str
    packages: tuple[str, ...]
    # The framework's own steps beyond the shared ones: step id -> name of a Session method
    # `async (details) -> error | None`, run on the probes' session.
    extra_steps: ClassVar[Mapping[str, str]] = {}

    @property
    @abstractmethod
    def backend(self) -> str:
        """Which E2B backend runs: the framework's own (upstream) or this project's implementation."""

    @property
    def tagging(self) -> str | None:
        """How this run's sandboxes are found again, when not by the task's metadata: why not."""
        return None

    async def open(self, model: Model, metadata: dict[str, str]) -> Session:
        """A fresh session, not started yet: what the default `session` starts, yields and closes."""
        raise NotImplementedError(f"{type(self).__name__} implements neither `open` nor `session`")

    @contextlib.asynccontextmanager
    async def session(self, model: Model, metadata: dict[str, str]) -> AsyncIterator[Session]:
        """A fresh backend (and sandbox) for one attempt or for the probes; closing it kills the sandbox,
        also when starting it failed. A framework whose backend opens another way overrides this."""
        session = await self.open(model, metadata)
        try:
            await session.start()
            yield session
        finally:
            await session.close()


def excerpt(value: str | None) -> str | None:
    if value is None or len(value) <= EXCERPT_CHARS:
        return value
    return value[:EXCERPT_CHARS] + f"... [{len(value) - EXCERPT_CHARS} more chars]"


def one_line(text: str, limit: int = 300) -> str:
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def output_text(result: str) -> str:
    """A tool result's output: `stdout` (or `content`/`output`) when the result is a JSON object, the
    sections joined when it is a JSON array of strings."""
    try:
        parsed = json.loads(result)
    except ValueError:
        return result
    if isinstance(parsed, dict):
        for key in ("stdout", "content", "output", "result"):
            if isinstance(parsed.get(key), str):
                return str(parsed[key])
    if isinstance(parsed, list) and all(isinstance(part, str) for part in parsed):
        return "\n".join(parsed)  # sections of a result, e.g. ["STDOUT:\n...", "STDERR:\n..."]
    return result


def uname_line(text: str) -> str | None:
    """The line of `uname -a` output in `text` (the first one naming Linux)."""
    return next((line.strip() for line in text.splitlines() if EXPECTED_WORD in line), None)


def judge(run: Run, verify: dict[str, Any]) -> dict[str, Any]:
    """The pass rule, with one problem sentence per broken part (tool failures first: they are the symptoms)."""
    problems = [f"{c.name} failed: {one_line(c.result)}" for c in run.calls if c.error]
    uname_calls = [c for c in run.calls if "uname" in json.dumps(c.arguments)]
    line = next((found for c in uname_calls if (found := uname_line(output_text(c.result)))), None)
    if "error" in verify:
        problems.append(f"verify read of {PROOF_PATH} failed: {verify['error']}")
    elif line is not None and line not in verify.get("content", ""):
        problems.append(f"verify read of {PROOF_PATH} lacks the uname output: {one_line(verify.get('content', ''))!r}")
    if not uname_calls:
        problems.append("the agent never ran uname")
    elif line is None:
        shown = "; ".join(repr(one_line(c.result, 120)) for c in uname_calls)
        problems.append(f"no uname result shows {EXPECTED_WORD!r}: {shown}")
    words = (run.answer or "").split()
    answer_word = words[0].strip(".,:;!`'\"") if words else ""
    if answer_word != EXPECTED_WORD:
        problems.append(f"answer {one_line(run.answer or '', 120)!r} does not start with {EXPECTED_WORD!r}")
    return {"passed": not problems, "uname_output": line, "answer_word": answer_word, "problems": problems}


# The task's sandbox lifetime (bench/remote/lifetimes.py: longer than any step of the task may run on this host),
# set by the Runner from its task; a framework gives its sandboxes this when longer than its own choice.
_task_lifetime_s = 0


def lifetime_s(own_s: int) -> int:
    """The lifetime (seconds) a framework's sandboxes are created with: its own, or the task's when longer."""
    return max(own_s, _task_lifetime_s)


def exception_text(exc: BaseException) -> str:
    return one_line(f"{type(exc).__name__}: {exc}", 600)


class Runner:
    """Runs the requested steps of one framework and reports them (JSON lines on the original stdout)."""

    def __init__(self, framework: Framework, task: dict[str, Any]) -> None:
        self.framework = framework
        self.task = task
        options = dict(task.get("options") or {})
        model = options.get("model") or {}
        self.model = Model(
            base_url=str(model.get("base_url", "")),
            name=str(model.get("name", "")),
            key_env=str(model.get("key_env", "")),
            scripted=bool(model.get("scripted", False)),
        )
        self.prompt = str(options.get("prompt", ""))
        self.attempts = max(1, int(options.get("attempts", DEFAULT_ATTEMPTS)))
        # `e2b-bench repro`: the tool calls of a recorded transcript, sent straight through the backend (no model)
        self.replay: list[dict[str, Any]] | None = options.get("replay")
        global _task_lifetime_s
        _task_lifetime_s = int(options.get("sandbox_timeout_s") or 0)
        self.metadata = dict(task["metadata"])
        tag = next(iter(self.metadata))
        self.transcript: dict[str, Any] = {
            "framework": framework.name,
            "runner": task.get("runner"),
            "backend": framework.backend,
            "sandbox_tagging": framework.tagging or f"metadata {{{tag!r}: <run id>}}",
            "model": {"base_url": self.model.base_url, "name": self.model.name, "scripted": self.model.scripted},
            "task": self.prompt,
            "attempts": [],
            "probes": {},
            "sandboxes": [],
        }
        self.protocol = Protocol()  # anything a framework prints goes to stderr, never into the protocol
        self._stack = contextlib.AsyncExitStack()
        self._probe_session: Session | None = None

    def emit(self, event: dict[str, Any]) -> None:
        self.protocol.emit(event)

    def emit_transcript(self) -> None:
        self.emit({"type": "transcript", "transcript": self.transcript})

    @contextlib.asynccontextmanager
    async def _session(self) -> AsyncIterator[Session]:
        async with self.framework.session(self.model, self.metadata) as session:
            try:
                yield session
            finally:
                if session.sandbox_id and session.sandbox_id not in self.transcript["sandboxes"]:
                    self.transcript["sandboxes"].append(session.sandbox_id)

    async def proof_task(self, details: dict[str, Any]) -> str | None:
        """Up to `attempts` agent runs, each on a fresh sandbox; the error of the last, or None once one passes."""
        error = None
        for number in range(1, self.attempts + 1):
            run, verify, record = Run(), {}, {"attempt": number}
            started = time.perf_counter()
            try:
                async with self._session() as session:
                    try:
                        if self.replay is not None:
                            await replay(session, self.replay, run)
                        else:
                            await session.ask(self.prompt, run)
                    except Exception as exc:  # a framework that gives up is an observed behaviour
                        record["error"] = exception_text(exc)
                        record["traceback"] = excerpt("".join(traceback.format_exception(exc)[-4:]))
                    try:
                        verify = {"content": excerpt(await session.read(PROOF_PATH))}
                    except Exception as exc:
                        verify = {"error": exception_text(exc)}
                    record["sandbox_id"] = session.sandbox_id
            except Exception as exc:  # opening or closing the session
                record.setdefault("error", exception_text(exc))
                verify = verify or {"error": "not read: the session failed"}
            verdict = judge(run, verify)
            if "error" in record:
                verdict["problems"].insert(0, f"the agent run raised {one_line(record['error'])}")
                verdict["passed"] = False
            record.update(
                tool_calls=[{**asdict(c), "result": excerpt(c.result)} for c in run.calls],
                answer=run.answer,
                verify_read=verify,
                verdict=verdict,
                duration_ms=round((time.perf_counter() - started) * 1000, 1),
            )
            self.transcript["attempts"].append(record)
            self.emit_transcript()
            details.update(attempt=number, answer=run.answer, verify_read=verify, problems=verdict["problems"])
            if verdict["passed"]:
                return None
            error = f"attempt {number}/{self.attempts}: " + "; ".join(verdict["problems"])
        return error

    async def probe(self, step: str, session: Session, details: dict[str, Any]) -> str | None:
        command = PROBES[step]
        try:
            probe = await session.run(command)
        except Exception as exc:
            details["raised"] = exception_text(exc)
            return f"`{command}` raised {exception_text(exc)}"
        details.update(command=command, exit_code=probe.exit_code, stdout=probe.stdout, stderr=probe.stderr)
        if step == "fw02_exit_code" and probe.exit_code != 5:
            return f"`{command}` reported as exit code {probe.exit_code} (expected 5)"
        if step == "fw03_late_output" and probe.stdout.strip() != "late":
            return f"no output from `{command}`: stdout {probe.stdout!r} (expected 'late'), exit code {probe.exit_code}"
        return None

    async def steps(self) -> None:
        """The task's steps in order; the kit reports prerequisites that did not pass."""
        async with contextlib.AsyncExitStack() as self._stack:
            plan = StepPlan(self.protocol, self.task)
            for step in plan:
                plan.report(step, *await self.run_step(step))
                self.emit_transcript()

    async def run_step(self, step: str) -> tuple[str, str | None, dict[str, Any]]:
        details: dict[str, Any] = {}
        try:
            if step == "fw01_proof_task":
                error = await self.proof_task(details)
            elif step in PROBES or step in self.framework.extra_steps:
                if self._probe_session is None:  # the probes share one session
                    self._probe_session = await self._stack.enter_async_context(self._session())
                if step in PROBES:
                    error = await self.probe(step, self._probe_session, details)
                else:
                    error = await getattr(self._probe_session, self.framework.extra_steps[step])(details)
                self.transcript["probes"][step] = details
            else:
                return "error", f"runner has no implementation of step {step}", {}
        except Exception as exc:
            error = exception_text(exc)
            details["traceback"] = excerpt("".join(traceback.format_exception(exc)[-4:]))
        return ("fail" if error else "pass"), error, details


# A code agent's step may end with its answer tool; replayed, the answer is printed like any output.
ANSWER_TOOL = "def final_answer(answer):\n    print(answer)\n\n"


async def replay(session: Session, calls: list[dict[str, Any]], run: Run) -> None:
    """Recorded tool calls through the framework's backend: a command (`command`/`cmd`, or `code` run by python3)
    with `session.run`, a write (`path`/`file_path` + `content`) as a shell redirect, a read with `session.read`.
    The recorded uname line in a later call becomes this sandbox's (the model wrote what it saw); the answer is
    its first word."""
    recorded = next((line for c in calls if (line := uname_line(output_text(str(c.get("result") or ""))))), None)
    seen: str | None = None
    for call in calls:
        args = dict(call.get("arguments") or {})
        text = {k: v for k, v in args.items() if isinstance(v, str)}
        if recorded and seen:
            text = {k: v.replace(recorded, seen) for k, v in text.items()}
        command = text.get("command") or text.get("cmd")
        if command is None and "code" in text:
            command = "python3 -c " + shlex.quote(ANSWER_TOOL + text["code"])
        path = text.get("path") or text.get("file_path")
        if command is not None:
            probe = await session.run(command)
            result, error = probe.stdout + probe.stderr, probe.exit_code not in (0, None)
        elif path is not None and "content" in text:
            probe = await session.run(f"printf '%s\\n' {shlex.quote(text['content'])} > {shlex.quote(path)}")
            result, error = probe.stdout + probe.stderr, probe.exit_code not in (0, None)
        elif path is not None:
            result, error = await session.read(path), False
        else:
            continue
        seen = seen or uname_line(result)
        run.calls.append(ToolRecord(str(call.get("name")), args, result, error))
    run.answer = seen.split()[0] if seen else None


def versions(packages: tuple[str, ...]) -> dict[str, str]:
    found = {}
    for package in packages:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            found[package] = importlib.metadata.version(package)
    return found


async def kill_sandboxes(ids: list[str]) -> dict[str, str]:
    """Kill whatever the sessions left alive (they kill their own; this is the safety net)."""
    from e2b import AsyncSandbox

    report = {}
    for sandbox_id in ids:
        try:
            report[sandbox_id] = "killed" if await AsyncSandbox.kill(sandbox_id) else "already gone"
        except Exception as exc:
            report[sandbox_id] = exception_text(exc)
    return report


def main(make: Callable[[], Framework]) -> int:
    """The runner's entry point: read the task, say hello, run the steps, report clean-up in the footer."""
    exit_on_sigterm()
    task = read_task()
    framework = make()
    runner = Runner(framework, task)
    runner.protocol.hello(
        str(task["runner"]), versions(framework.packages), framework=framework.name, backend=framework.backend
    )

    async def run() -> dict[str, str]:
        try:
            await runner.steps()
        finally:
            cleanup = await kill_sandboxes(runner.transcript["sandboxes"])
        return cleanup

    cleanup = asyncio.run(run())
    runner.transcript["cleanup"] = cleanup
    runner.emit_transcript()
    runner.protocol.footer(True, cleanup=cleanup)
    return 0
