"""The control-plane REST API, as both the v1 (SDK <= 2.50) and v2 clients call it."""

from __future__ import annotations

import asyncio
import base64
import json
import re
import time
import uuid
from datetime import datetime
from typing import Any
from urllib.parse import parse_qsl, unquote

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from .admission import Admission, Refused
from .agentlink import AgentError
from .box import EGRESS_FILTER
from .network import EgressRules, Ingress, NetworkError
from .quirks import KILL_UNCONFIRMED_S
from .registry import CPU_COUNT, ENVD_VERSION, MEMORY_MB, Registry, Sandbox, utc
from .snapshots import Snapshot, SnapshotError, Snapshots
from .template import RECIPES, TemplateError

TEMPLATES = {"base": None, "code-interpreter-v1": None}  # template id -> alias
MAX_FORKS = 100
SNAPSHOT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
DEFAULT_TIMEOUT_V1 = 15
DEFAULT_TIMEOUT_V2 = 300
MAX_TIMEOUT = 24 * 3600
PAGE_LIMIT = 100
TEMPLATE_BUILD_ROUTES = (
    "/v3/templates",
    "/v2/templates",
    "/templates",
    "/v2/templates/{template_id}/builds/{build_id}",
)


# Parts of E2B's API the endpoint does not serve: each answers 501 naming the feature, never a bare 404
# (which the SDKs read as "sandbox not found").
UNIMPLEMENTED = (
    (r"(/v2)?/sandboxes/[^/]+/logs", "sandbox logs"),
    (r"/sandboxes/metrics", "metrics of several sandboxes"),
    (r"(/v\d)?/templates(/.*)?", "templates"),
    (r"/teams(/.*)?", "teams"),
    (r"/volumes(/.*)?", "volumes"),
    (r"/secrets(/.*)?", "secrets"),
    (r"/(access-tokens|api-keys)(/.*)?", "access tokens and API keys"),
    (r"/(nodes|admin)(/.*)?", "cluster administration"),
)


class ApiError(Exception):
    """An error answered as E2B does: `{"code": <status>, "message": ...}`."""

    def __init__(
        self, status: int, message: str, error_code: str | None = None, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.error_code = error_code
        self.headers = headers


def error_response(
    status: int, message: str, error_code: str | None = None, headers: dict[str, str] | None = None
) -> JSONResponse:
    body: dict[str, object] = {"code": status, "message": message}
    if error_code:
        body["error_code"] = error_code
    return JSONResponse(body, status_code=status, headers=headers)


def unimplemented(method: str, path: str) -> ApiError:
    feature = next((name for pattern, name in UNIMPLEMENTED if re.fullmatch(pattern, path)), "this route")
    return ApiError(501, f"{feature} ({method} {path}) is not implemented by this endpoint", "not_implemented")


async def json_body(request: Request) -> dict[str, Any]:
    raw = await request.body()
    if not raw.strip():
        return {}
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError) as exc:  # RecursionError: nested deeper than the parser goes
        raise ApiError(400, f"request body is not valid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise ApiError(400, "request body must be a JSON object")
    return body


def _int(body: dict, key: str, default: int) -> int:
    value = body.get(key, default)
    if value is None:
        return default
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ApiError(400, f"'{key}' must be a non-negative integer (seconds)")
    return min(value, MAX_TIMEOUT)


def _string_map(body: dict, key: str) -> dict[str, str]:
    value = body.get(key) or {}
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise ApiError(400, f"'{key}' must be an object of strings")
    return {str(k): v for k, v in value.items()}


# fidelity: field table and second-path checks
# Create members whose feature this endpoint does not provide: refused naming the member, never accepted and ignored.
UNPROVIDED = {"mcp": "an MCP gateway", "volumeMounts": "volumes", "iam": "workload identity"}


def _refuse_unprovided(body: dict) -> None:
    for member, feature in UNPROVIDED.items():
        if body.get(member) not in (None, {}, []):
            raise ApiError(501, f"this endpoint does not provide {feature} ('{member}')", "not_implemented")


def _refuse_unenforced(rules: EgressRules) -> None:
    """Rules this endpoint cannot enforce are refused (501), never accepted and ignored."""
    missing = rules.unenforced()
    if missing is None and not (rules.unrestricted or EGRESS_FILTER):
        missing = "egress rules here: nftables is not installed"
    if missing:
        raise ApiError(501, f"this endpoint cannot enforce {missing}", "not_implemented")


class Api:
    def __init__(self, registry: Registry) -> None:
        self.registry = registry
        self.snapshots = Snapshots(registry)
        self.admission = Admission()
        self.started_at = time.time()
        self.spawns: dict[str, list[float]] = {t: [] for t in TEMPLATES}  # built-in template -> create times
        # kill_unconfirmed quirk: killed sandbox id -> (its last detail, until when GET still answers it)
        self._unconfirmed: dict[str, tuple[dict[str, Any], float]] = {}

    def routes(self) -> list[Route]:
        return [
            Route("/sandboxes", self.create_v1, methods=["POST"]),
            Route("/v2/sandboxes", self.create_v2, methods=["POST"]),
            Route("/sandboxes", self.list_v1, methods=["GET"]),
            Route("/v2/sandboxes", self.list_v2, methods=["GET"]),
            Route("/sandboxes/{sandbox_id}", self.get_info, methods=["GET"]),
            Route("/sandboxes/{sandbox_id}", self.kill, methods=["DELETE"]),
            Route("/sandboxes/{sandbox_id}/timeout", self.set_timeout, methods=["POST"]),
            Route("/sandboxes/{sandbox_id}/refreshes", self.refresh, methods=["POST"]),
            Route("/sandboxes/{sandbox_id}/pause", self.pause, methods=["POST"]),
            Route("/sandboxes/{sandbox_id}/resume", self.resume_v1, methods=["POST"]),
            Route("/sandboxes/{sandbox_id}/connect", self.connect, methods=["POST"]),
            Route("/v2/sandboxes/{sandbox_id}/connect", self.connect, methods=["POST"]),
            Route("/sandboxes/{sandbox_id}/metrics", self.metrics, methods=["GET"]),
            Route("/sandboxes/{sandbox_id}/network", self.update_network, methods=["PUT"]),
            Route("/sandboxes/{sandbox_id}/snapshots", self.create_snapshot, methods=["POST"]),
            Route("/snapshots", self.list_snapshots, methods=["GET"]),
            Route("/templates", self.list_templates, methods=["GET"]),
            Route("/templates/aliases/{alias}", self.template_alias, methods=["GET"]),
            Route("/templates/{template_id}", self.delete_template, methods=["DELETE"]),
            Route("/sandboxes/{sandbox_id}/fork", self.fork, methods=["POST"]),
            *(Route(path, self.template_build, methods=["POST"]) for path in TEMPLATE_BUILD_ROUTES),
        ]

    # --- helpers -------------------------------------------------------------------------------
    def _refuse_options(self, call: str, body: dict) -> None:
        option = self.registry.quirks.refused_option(call, body)
        if option:
            raise ApiError(
                400, f"unsupported_option: '{option}' is not supported by this endpoint", "unsupported_option"
            )

    def _sandbox(self, request: Request) -> Sandbox:
        sandbox_id = request.path_params["sandbox_id"]
        sandbox = self.registry.get(sandbox_id)
        if sandbox is None:
            raise ApiError(404, f"sandbox \"{sandbox_id}\" doesn't exist or you don't have access to it")
        return sandbox

    def _created(self, sandbox: Sandbox, token: str, status: int) -> JSONResponse:
        return JSONResponse(_tokens(sandbox, token), status_code=status)

    def _time(self, moment: float) -> str:
        """A REST time: milliseconds, as E2B gives them (`coarse_times`: whole seconds)."""
        return utc(moment, "seconds") if self.registry.quirks.coarse_times else utc(moment)

    def _detail(self, sandbox: Sandbox, listed: bool = False) -> dict[str, Any]:
        return {
            **sandbox.summary(),
            "startedAt": self._time(sandbox.started_at),
            "endAt": self._time(
                sandbox.end_at if sandbox.reported_end_at is None or not listed else sandbox.reported_end_at
            ),
            "cpuCount": self.registry.quirks.cpu_count(CPU_COUNT),
            "memoryMB": MEMORY_MB,
            "diskSizeMB": self.registry.config.disk_size_mb,
            "metadata": sandbox.metadata,
            "state": sandbox.state,
            "allowInternetAccess": sandbox.internet,
            "lifecycle": {
                "autoResume": sandbox.auto_resume,
                "onTimeout": "pause" if sandbox.auto_pause else "kill",
            },
            **(
                {"network": network} if (network := {**(sandbox.egress.wire() or {}), **sandbox.ingress.wire()}) else {}
            ),
        }

    # --- create --------------------------------------------------------------------------------
    async def create_v1(self, request: Request) -> Response:
        return await self._create(request, DEFAULT_TIMEOUT_V1)

    async def create_v2(self, request: Request) -> Response:
        return await self._create(request, DEFAULT_TIMEOUT_V2)

    async def _create(self, request: Request, default_timeout: int) -> Response:
        body = await json_body(request)
        template = body.get("templateID") or "base"
        if not isinstance(template, str):
            raise ApiError(400, "'templateID' must be a string")
        template_id = next((t for t, alias in TEMPLATES.items() if template in (t, alias)), None)
        snapshot = self.snapshots.find(template) if template_id is None else None
        if template_id is None and snapshot is None:
            raise ApiError(404, f"template '{template}' not found")
        self._refuse_options("create", body)
        layers = snapshot.layers if snapshot else await self._template_layers(template_id or "base")
        try:
            egress = EgressRules.from_create(body)
            quirks = self.registry.quirks
            ingress = Ingress.from_create(body).without(token=quirks.ignore_traffic_token, mask=quirks.ignore_mask_host)
        except NetworkError as exc:
            raise ApiError(400, str(exc)) from exc
        _refuse_unenforced(egress)
        _refuse_unprovided(body)
        internet = body.get("allow_internet_access")
        auto_resume = body.get("autoResume") or {}
        try:
            async with self.admission.slot():
                sandbox, token = await self.registry.create(
                    template_id=template_id or snapshot.snapshot_id,  # type: ignore[union-attr]
                    alias=TEMPLATES[template_id] if template_id else None,
                    layers=layers,
                    timeout_s=_int(body, "timeout", default_timeout),
                    metadata=_string_map(body, "metadata"),
                    env_vars=_string_map(body, "envVars"),
                    internet=internet is not False,
                    auto_pause=bool(body.get("autoPause")),
                    auto_resume=bool(isinstance(auto_resume, dict) and auto_resume.get("enabled")),
                    egress=egress,
                    ingress=ingress,
                )
        except Refused as exc:
            raise ApiError(429, str(exc), headers={"Retry-After": str(exc.retry_after_s)}) from exc
        except AgentError as exc:
            raise ApiError(500, f"sandbox could not be started: {exc}") from exc
        sandbox.pause_memory = body.get("autoPauseMemory") is not False
        if template_id:
            self.spawns[template_id].append(time.time())
        return self._created(sandbox, token, 201)

    async def _template_layers(self, template_id: str) -> str | None:
        """The root a built-in template other than base boots on (built when first asked for); base boots on
        the prepared pool."""
        if template_id == "base":
            return None
        try:
            return str(await self.registry.template_root(template_id))
        except TemplateError as exc:
            raise ApiError(500, f"template '{template_id}' could not be built: {exc}") from exc

    # --- list and get --------------------------------------------------------------------------
    async def list_v1(self, request: Request) -> Response:
        found = self._filter(request, states={"running"})
        return JSONResponse([self._detail(s, listed=True) for s in found])

    async def list_v2(self, request: Request) -> Response:
        params = request.query_params
        states = {s for s in params.get("state", "").split(",") if s} or {"running", "paused"}
        unknown = states - {"running", "paused"}
        if unknown:
            raise ApiError(400, f"unknown state: {sorted(unknown)[0]}")
        found = self._filter(request, states=states)
        if params.get("order", "desc") == "asc":
            found.reverse()
        limit = self._limit(params.get("limit"))
        start = self._decode_token(params.get("nextToken"))
        page = found[start : start + limit]
        headers = {}
        if start + limit < len(found):
            headers["X-Next-Token"] = base64.urlsafe_b64encode(str(start + limit).encode()).decode()
        return JSONResponse([self._detail(s, listed=True) for s in page], headers=headers)

    def _filter(self, request: Request, states: set[str]) -> list[Sandbox]:
        params = request.query_params
        wanted = parse_metadata_query(params.get("metadata", ""))
        template = params.get("template")
        started_after = params.get("startedAfter")
        after = _parse_time(started_after) if started_after else None
        found = [
            s
            for s in self.registry.sandboxes.values()
            if s.state in states
            and all(s.metadata.get(k) == v for k, v in wanted.items())
            and (template is None or template in (s.template_id, s.alias))
            and (after is None or s.started_at >= after)
        ]
        found.sort(key=lambda s: s.started_at, reverse=True)
        return found

    @staticmethod
    def _limit(raw: str | None) -> int:
        if raw is None:
            return PAGE_LIMIT
        try:
            value = int(raw)
        except ValueError as exc:
            raise ApiError(400, "'limit' must be an integer") from exc
        if not 1 <= value <= PAGE_LIMIT:
            raise ApiError(400, f"'limit' must be between 1 and {PAGE_LIMIT}")
        return value

    @staticmethod
    def _decode_token(raw: str | None) -> int:
        if not raw:
            return 0
        try:
            return max(int(base64.urlsafe_b64decode(raw.encode()).decode()), 0)
        except ValueError as exc:
            raise ApiError(400, "invalid 'nextToken'") from exc

    async def get_info(self, request: Request) -> Response:
        ghost = self._unconfirmed.get(request.path_params["sandbox_id"])
        if ghost is not None and ghost[1] > time.monotonic() and self.registry.get(ghost[0]["sandboxID"]) is None:
            return JSONResponse(ghost[0])
        return JSONResponse(self._detail(self._sandbox(request)))

    # --- lifecycle -----------------------------------------------------------------------------
    async def kill(self, request: Request) -> Response:
        sandbox = self._sandbox(request)
        if self.registry.quirks.kill_unconfirmed:  # still reported running for a while after the kill
            self._unconfirmed = {k: v for k, v in self._unconfirmed.items() if v[1] > time.monotonic()}
            self._unconfirmed[sandbox.id] = (self._detail(sandbox), time.monotonic() + KILL_UNCONFIRMED_S)
        await self.registry.kill(sandbox.id)
        return Response(status_code=204)

    async def set_timeout(self, request: Request) -> Response:
        sandbox = self._sandbox(request)
        body = await json_body(request)
        if "timeout" not in body:
            raise ApiError(400, "'timeout' is required")
        if self.registry.quirks.timeout_keeps_endat and sandbox.reported_end_at is None:
            sandbox.reported_end_at = sandbox.end_at  # what GET goes on reporting
        sandbox.end_at = time.time() + _int(body, "timeout", 0)
        return Response(status_code=204)

    async def refresh(self, request: Request) -> Response:
        sandbox = self._sandbox(request)
        body = await json_body(request)
        sandbox.end_at = max(sandbox.end_at, time.time() + _int(body, "duration", 60))
        return Response(status_code=204)

    async def pause(self, request: Request) -> Response:
        sandbox = self._sandbox(request)
        body = await json_body(request)
        self._refuse_options("pause", body)
        if sandbox.state == "paused":
            raise ApiError(409, f"sandbox {sandbox.id} is already paused")
        await self.registry.pause(sandbox, memory=body.get("memory") is not False)
        return Response(status_code=204)

    async def resume_v1(self, request: Request) -> Response:
        sandbox = self._sandbox(request)
        body = await json_body(request)
        if sandbox.state != "paused":
            raise ApiError(409, f"sandbox {sandbox.id} is already running")
        if body.get("autoPause") is not None:  # the lifecycle this resume asks for, as a create's autoPause
            sandbox.auto_pause = bool(body["autoPause"])
        await self.registry.resume(
            sandbox, _int(body, "timeout", DEFAULT_TIMEOUT_V1), reboot=body.get("memory") is False
        )
        return self._created(sandbox, sandbox.mint_token(), 201)

    async def connect(self, request: Request) -> Response:
        sandbox = self._sandbox(request)
        body = await json_body(request)
        self._refuse_options("connect", body)
        timeout_s = _int(body, "timeout", DEFAULT_TIMEOUT_V2)
        if sandbox.state == "paused":
            await self.registry.resume(sandbox, timeout_s, reboot=body.get("memory") is False)
            return self._created(sandbox, sandbox.mint_token(), 201)
        later = time.time() + timeout_s
        if self.registry.quirks.connect_sets_lifetime:  # a fixed lifetime for every connect, whatever it asked
            later = time.time() + CONNECT_LIFETIME_S
        sandbox.end_at = later if self.registry.quirks.connect_sets_lifetime else max(sandbox.end_at, later)
        return self._created(sandbox, sandbox.mint_token(), 200)

    async def update_network(self, request: Request) -> Response:
        sandbox = self._sandbox(request)
        try:
            rules = EgressRules.from_body(await json_body(request))
        except NetworkError as exc:
            raise ApiError(400, str(exc)) from exc
        if sandbox.state != "running":
            raise ApiError(409, f"sandbox {sandbox.id} is not running")
        _refuse_unenforced(rules)
        try:
            await self.registry.set_egress(sandbox, rules)
        except AgentError as exc:
            raise ApiError(500, f"the egress rules could not be applied: {exc}") from exc
        return Response(status_code=204)

    # --- snapshots and forks -------------------------------------------------------------------
    async def create_snapshot(self, request: Request) -> Response:
        sandbox = self._sandbox(request)
        body = await json_body(request)
        name = body.get("name")
        if name is not None and (not isinstance(name, str) or not SNAPSHOT_NAME.fullmatch(name)):
            raise ApiError(400, "'name' must be 1-128 letters, digits, '-', '_' or '.'")
        if body.get("memory") is True:
            raise ApiError(501, "memory snapshots are not provided: snapshots keep the filesystem", "not_implemented")
        snapshot = await self._snapshot(sandbox, name)
        return JSONResponse(snapshot.info(), status_code=201)

    async def _snapshot(self, sandbox: Sandbox, name: str | None, listed: bool = True) -> Snapshot:
        try:
            return await self.snapshots.take(sandbox, name, listed)
        except SnapshotError as exc:
            raise ApiError(exc.status, str(exc)) from exc

    async def list_snapshots(self, request: Request) -> Response:
        params = request.query_params
        found = self.snapshots.listed(params.get("sandboxID"), params.get("name"))
        limit = self._limit(params.get("limit"))
        start = self._decode_token(params.get("nextToken"))
        headers = {}
        if start + limit < len(found):
            headers["X-Next-Token"] = base64.urlsafe_b64encode(str(start + limit).encode()).decode()
        return JSONResponse([s.info() for s in found[start : start + limit]], headers=headers)

    async def list_templates(self, request: Request) -> Response:
        """The built-in templates, public as E2B's own and ready: a create builds one on first use."""
        return JSONResponse([self._template(t) for t in TEMPLATES])

    def _template(self, template_id: str) -> dict[str, Any]:
        recipe = RECIPES[template_id]
        spawns = self.spawns[template_id]
        return {
            "templateID": template_id,
            "buildID": str(uuid.uuid5(uuid.NAMESPACE_URL, f"e2b-bench:{recipe.name}:{recipe.revision}")),
            "cpuCount": CPU_COUNT,
            "memoryMB": MEMORY_MB,
            "diskSizeMB": self.registry.config.disk_size_mb,
            "public": True,
            "aliases": [],
            "names": [template_id],
            "createdAt": utc(self.started_at),
            "updatedAt": utc(self.started_at),
            "createdBy": None,
            "lastSpawnedAt": utc(spawns[-1]) if spawns else None,
            "spawnCount": len(spawns),
            "buildCount": 1,
            "envdVersion": ENVD_VERSION,
            "buildStatus": "ready",
        }

    async def template_alias(self, request: Request) -> Response:
        """Whether a template is known by this name (E2B's `Template.exists`): a built-in one (public) or a
        named snapshot (the team's own); 404 otherwise."""
        alias = request.path_params["alias"]
        if alias in TEMPLATES:
            return JSONResponse({"templateID": alias, "public": True})
        snapshot = self.snapshots.find(alias)
        if snapshot is None or snapshot.name is None:
            raise ApiError(404, f"template alias '{alias}' not found")
        return JSONResponse({"templateID": snapshot.id, "public": False})

    async def delete_template(self, request: Request) -> Response:
        template = request.path_params["template_id"]
        if template in TEMPLATES:
            raise ApiError(400, f"template '{template}' is built in and cannot be deleted")
        if not self.snapshots.delete(template):
            raise ApiError(404, f"template '{template}' not found")
        return Response(status_code=204)

    async def fork(self, request: Request) -> Response:
        sandbox = self._sandbox(request)
        body = await json_body(request)
        count = body.get("count", 1)
        if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= MAX_FORKS:
            raise ApiError(400, f"'count' must be an integer from 1 to {MAX_FORKS}")
        timeout_s = _int(body, "timeout", DEFAULT_TIMEOUT_V1)
        snapshot = await self._snapshot(sandbox, None, listed=False)
        forks = await asyncio.gather(
            *(self._fork_one(sandbox, snapshot, timeout_s) for _ in range(count)), return_exceptions=True
        )
        results = [
            {"error": {"code": 500, "message": f"the fork could not be started: {f}"}}
            if isinstance(f, BaseException)
            else {"sandbox": f}
            for f in forks
        ]
        return JSONResponse(results, status_code=201)

    async def _fork_one(self, source: Sandbox, snapshot: Snapshot, timeout_s: int) -> dict[str, Any]:
        sandbox, token = await self.registry.create(
            template_id=source.template_id,
            alias=source.alias,
            timeout_s=timeout_s,
            metadata=dict(source.metadata),
            env_vars=dict(source.env_vars),
            internet=source.internet,
            auto_pause=source.auto_pause,
            auto_resume=source.auto_resume,
            layers=snapshot.layers,
            egress=source.egress,
            ingress=source.ingress.renewed(),
        )
        return _tokens(sandbox, token)

    async def template_build(self, request: Request) -> Response:
        await json_body(request)
        if self.registry.quirks.template_build_501:
            raise ApiError(501, "template builds are not implemented by this endpoint", "not_implemented")
        # The embedded endpoint serves the `base` template only; building others is not provided yet.
        raise ApiError(501, "the embedded endpoint cannot build templates yet (only 'base' exists)")

    async def metrics(self, request: Request) -> Response:
        sandbox = self._sandbox(request)
        if self.registry.quirks.metrics_404:
            raise ApiError(404, "metrics are not supported by this endpoint")
        start, end = (_unix_param(request, name) for name in ("start", "end"))
        now = time.time()
        outside = (end is not None and end < int(sandbox.started_at)) or (start is not None and start > now)
        if outside and not self.registry.quirks.metrics_ignore_window:
            return JSONResponse([])  # no sample of this sandbox falls in the window
        cpu, memory, disk, disk_total = await asyncio.get_running_loop().run_in_executor(None, sandbox.box.usage)
        mem_total = MEMORY_MB * 1024 * 1024
        if self.registry.quirks.metrics_in_mib:  # bytes as MiB
            memory, mem_total, disk, disk_total = (n // (1024 * 1024) for n in (memory, mem_total, disk, disk_total))
        sample = {
            "timestamp": utc(now),
            "timestampUnix": int(now),
            "cpuCount": CPU_COUNT,
            "cpuUsedPct": round(cpu, 2),
            "memUsed": memory,
            "memTotal": mem_total,
            "memCache": 0,
            "diskUsed": disk,
            "diskTotal": disk_total,
        }
        return JSONResponse([sample])


CONNECT_LIFETIME_S = 60  # the connect_sets_lifetime quirk: what connecting to a running sandbox leaves it


def _tokens(sandbox: Sandbox, envd_token: str) -> dict[str, Any]:
    """A create, connect or fork answer: the sandbox and the tokens its client needs."""
    return {**sandbox.summary(), "envdAccessToken": envd_token, "trafficAccessToken": sandbox.ingress.traffic_token}


def _unix_param(request: Request, name: str) -> int | None:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return None
    try:
        return int(raw)
    except ValueError as exc:
        raise ApiError(400, f"'{name}' must be a Unix timestamp in seconds") from exc


def parse_metadata_query(raw: str) -> dict[str, str]:
    """`metadata` is a query string inside one parameter; each key and value is encoded once more."""
    return {unquote(k): unquote(v) for k, v in parse_qsl(raw, keep_blank_values=True)}


def _parse_time(raw: str) -> float:
    try:
        return datetime.fromisoformat(raw.replace("Z", "+00:00")).timestamp()
    except ValueError as exc:
        raise ApiError(400, f"'startedAfter' is not an RFC 3339 timestamp: {raw}") from exc
