"""One framework runner through `e2b-bench run frameworks`, for the framework test modules after the first wave.

Each module runs its own runner (`--runner NAME`) faithful and against `b3os-beta`, with request bodies in
the wire log (`--wire-bodies`), so what the framework's E2B backend really sent can be asserted.
"""

from __future__ import annotations

import contextlib
import json
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvicorn
from run_cli import e2b_bench, only_run_dir
from test_frameworks import FrameworkRun

from bench import asgi
from bench.model.server import ScriptedModel, Transcript
from bench.results import read_run
from bench.runners.catalog import available_runners
from bench.runners.manifest import load_steps

WIRE_BODY_BYTES = "4096"


def runner_of(family: str) -> str:
    """The one runner of a framework's folder."""
    (name,) = [name for name, r in available_runners().items() if r.spec.family == family]
    return name


@dataclass(frozen=True)
class SingleRun(FrameworkRun):
    """A run of one framework runner."""

    runner: str
    family: str

    def steps(self) -> list[str]:
        return [s.id for s in load_steps("frameworks", self.family)]

    def own_case(self, step: str) -> Any:
        return self.case(self.runner, step)

    def own_transcript(self) -> dict[str, Any]:
        return self.transcript(self.runner)

    def wire(self) -> list[dict[str, Any]]:
        lines = (self.run.path / "wire" / f"{self.runner}.jsonl").read_text().splitlines()
        return [json.loads(line) for line in lines]

    def processes(self) -> list[dict[str, Any]]:
        """The `process` member of each process Start the SDK sent, in order (bodies cut short are left out)."""
        found = []
        for e in self.wire():
            if e["url"].endswith("process.Process/Start"):
                with contextlib.suppress(ValueError):
                    found.append(json.loads(e["request_body"])["process"])
        return found

    def creates(self) -> list[dict[str, Any]]:
        """The sandbox creations the runner's SDK sent, bodies decoded."""
        return [
            {**e, "body": json.loads(e["request_body"])}
            for e in self.wire()
            if e["method"] == "POST" and e["url"].endswith("/sandboxes")
        ]


def run_framework(family: str, results: Path, *args: str, env: dict[str, str] | None = None) -> SingleRun:
    runner = runner_of(family)
    done = e2b_bench(
        "run", "frameworks", "--runner", runner, "--wire-bodies", WIRE_BODY_BYTES, "--results-dir", str(results),
        *args, env=env, timeout=1800,
    )  # fmt: skip
    return SingleRun(done, read_run(only_run_dir(results)), runner, family)


class KeyCheck:
    """ASGI wrapper around the scripted model standing in for a real one: refuses (401) any request
    without `Authorization: Bearer <key>` and remembers, in memory only, each request and whether it had it."""

    def __init__(self, app: Any, key: str) -> None:
        self.app, self.key = app, key
        self.requests: list[tuple[str, str, bool]] = []  # method, path, authorized

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            authorized = dict(scope["headers"]).get(b"authorization") == f"Bearer {self.key}".encode()
            self.requests.append((scope["method"], scope["path"], authorized))
            if not authorized:
                await send({"type": "http.response.start", "status": 401, "headers": []})
                await send({"type": "http.response.body", "body": b'{"error": {"message": "bad key"}}'})
                return
        await self.app(scope, receive, send)


@dataclass(frozen=True)
class RealModelRun:
    """A proof task run through `--model-base-url/--model/--model-key-env` against a key-checking model."""

    run: SingleRun
    base_url: str
    model: str
    key: str
    check: KeyCheck
    transcript: Transcript


def run_with_real_model(family: str, results: Path) -> RealModelRun:
    key_env, key, model = "E2B_BENCH_TEST_MODEL_KEY", "sk-test-real-model-" + secrets.token_hex(8), "bench-real-model"
    transcript = Transcript()
    check = KeyCheck(ScriptedModel(transcript, model), key)
    sockets = [asgi.bind("127.0.0.1", 0)]
    server = uvicorn.Server(uvicorn.Config(check, lifespan="off", log_level="warning", access_log=False))
    base_url = f"http://127.0.0.1:{sockets[0].getsockname()[1]}/v1"
    options = ("--model-base-url", base_url, "--model", model, "--model-key-env", key_env, "-k", "fw01_proof_task")
    with asgi.in_thread(server, sockets, "key-checking-model"):
        run = run_framework(family, results, *options, env={key_env: key})
    return RealModelRun(run, base_url, model, key, check, transcript)


def files_holding(root: Path, text: str) -> list[Path]:
    """Every file under `root` whose bytes contain `text`."""
    return [p for p in root.rglob("*") if p.is_file() and text.encode() in p.read_bytes()]
