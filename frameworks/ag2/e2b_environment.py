"""An E2B environment for AG2's sandbox tools, written against AG2's public sandbox interface.

AG2 1.2.1 (the newest release) ships Docker and Daytona environments but not E2B's, which exists
only on AG2's main branch (`ag2.extensions.e2b`). This is the project's own implementation of the
same public interface (`SandboxFactory` + `WorkdirAware` over a `SandboxBase`), behaving as the
upstream one is documented to: one sandbox per environment, created on first use with
`AsyncSandbox.create(template, timeout=sandbox_timeout or 300, envs=env_vars, **create_options)`
and `files.make_dir(workdir)`; every command a foreground `commands.run(shlex.join(argv),
cwd=workdir, timeout=timeout)` (no user, stdin, setsid or pty); a non-zero exit is a result, not an
error; a timeout is exit code 124; `aclose()` kills the sandbox, with an atexit fallback.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import shlex
from collections.abc import AsyncIterator
from pathlib import Path, PurePosixPath
from typing import Any

from ag2.tools.sandbox import ExecResult, SandboxBase
from e2b import AsyncSandbox, CommandExitException, TimeoutException

DEFAULT_SANDBOX_TIMEOUT = 300


class E2BSandbox(SandboxBase):
    """One E2B sandbox behind AG2's `Sandbox` protocol; created on first use."""

    def __init__(
        self,
        *,
        template: str | None,
        timeout: int,
        sandbox_timeout: int | None,
        workdir: str,
        env_vars: dict[str, str] | None,
        create_options: dict[str, Any],
    ) -> None:
        self._template = template
        self._default_timeout = timeout
        self._sandbox_timeout = sandbox_timeout or DEFAULT_SANDBOX_TIMEOUT
        self._workdir = PurePosixPath(workdir)
        self._env_vars = env_vars
        self._create_options = create_options
        self._sandbox: AsyncSandbox | None = None
        self._lock: asyncio.Lock | None = None
        self._closed = False

    @property
    def workdir(self) -> PurePosixPath:
        return self._workdir

    @property
    def host_workdir(self) -> Path | None:
        return None

    @property
    def sandbox_id(self) -> str | None:
        return self._sandbox.sandbox_id if self._sandbox is not None else None

    def __deepcopy__(self, memo: dict[int, Any]) -> E2BSandbox:
        return self  # a live remote handle: a copy is the same sandbox

    async def _ensure(self) -> AsyncSandbox:
        if self._closed:
            raise RuntimeError("E2BSandbox has been closed.")
        if self._sandbox is not None:
            return self._sandbox
        self._lock = self._lock or asyncio.Lock()
        async with self._lock:
            if self._sandbox is None:
                sandbox = await AsyncSandbox.create(
                    self._template,
                    timeout=self._sandbox_timeout,
                    envs=self._env_vars,
                    **self._create_options,
                )
                self._sandbox = sandbox
                atexit.register(self._atexit_close)
                await sandbox.files.make_dir(str(self._workdir))
        assert self._sandbox is not None
        return self._sandbox

    async def exec(
        self,
        argv: list[str],
        *,
        env: dict[str, str] | None = None,
        timeout: float | None = None,
    ) -> ExecResult:
        if not argv:
            return ExecResult(output="", exit_code=2)
        sandbox = await self._ensure()
        seconds = timeout if timeout is not None else self._default_timeout
        try:
            result = await sandbox.commands.run(shlex.join(argv), envs=env, cwd=str(self._workdir), timeout=seconds)
        except CommandExitException as exc:
            return ExecResult(output=(exc.stdout + exc.stderr).strip(), exit_code=exc.exit_code)
        except TimeoutException as exc:
            return ExecResult(output=f"Execution timed out: {exc}", exit_code=124)
        return ExecResult(output=(result.stdout + result.stderr).strip(), exit_code=result.exit_code)

    async def put_file(self, path: PurePosixPath, content: bytes) -> None:
        if path.is_absolute():
            raise ValueError(f"Absolute paths are not allowed in put_file: {path}")
        sandbox = await self._ensure()
        await sandbox.files.write(str(self._workdir / path), content)

    async def remove_file(self, path: PurePosixPath) -> None:
        if path.is_absolute():
            raise ValueError(f"Absolute paths are not allowed in remove_file: {path}")
        sandbox = await self._ensure()
        with contextlib.suppress(Exception):
            await sandbox.files.remove(str(self._workdir / path))

    async def aclose(self) -> None:
        self._closed = True
        sandbox, self._sandbox = self._sandbox, None
        if sandbox is not None:
            atexit.unregister(self._atexit_close)
            with contextlib.suppress(Exception):
                await sandbox.kill()

    def _atexit_close(self) -> None:
        with contextlib.suppress(Exception):
            asyncio.run(self.aclose())


class E2BEnvironment:
    """`SandboxFactory` for `SandboxShellTool` / `SandboxCodeTool`: every `open()` yields the one sandbox."""

    def __init__(
        self,
        *,
        template: str | None = None,
        timeout: int = 60,
        sandbox_timeout: int | None = None,
        workdir: str = "/home/user",
        env_vars: dict[str, str] | None = None,
        **create_options: Any,
    ) -> None:
        if timeout < 1:
            raise ValueError("`timeout` must be >= 1 second.")
        self._sandbox = E2BSandbox(
            template=template,
            timeout=timeout,
            sandbox_timeout=sandbox_timeout,
            workdir=workdir,
            env_vars=env_vars,
            create_options=create_options,
        )

    @property
    def workdir(self) -> PurePosixPath:
        return self._sandbox.workdir

    @property
    def sandbox(self) -> E2BSandbox:
        return self._sandbox

    @contextlib.asynccontextmanager
    async def open(self, context: Any = None) -> AsyncIterator[E2BSandbox]:
        del context  # nothing is resolved from Variables here
        await self._sandbox._ensure()
        yield self._sandbox  # the environment owns the lifecycle: nothing is closed on scope exit

    async def aclose(self) -> None:
        await self._sandbox.aclose()

    async def __aenter__(self) -> E2BEnvironment:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __deepcopy__(self, memo: dict[int, Any]) -> E2BEnvironment:
        return self  # a shared resource handle: Agent.add_tool may deepcopy the tool
