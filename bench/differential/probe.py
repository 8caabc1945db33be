"""A second path beside the answers: what the wire proxy looks at itself after an exchange, before its client
has the answer's end (so nothing the case does next can race it), recorded as the exchange's `probe`.

- After a metrics sample (GET /sandboxes/{id}/metrics) of a sandbox whose envd the run has called: what the
  sandbox itself says of the same figures (`metrics.*`: CPUs by a limited cgroup's quota, memory by the cgroup's
  limit or MemTotal, the root filesystem by `df`), held against the sample (bench/differential/agree.py).
- After a lifecycle call (create, connect, timeout, resume, refresh, pause, kill) that succeeded: the sandbox as
  the control plane's GET /sandboxes/{id} reports it then (`state`, `endAt`, `startedAt`, or the status), and as
  its list (GET /v2/sandboxes) reports it (`list.*`).
- After an envd call that changed files (an upload, Filesystem Move, MakeDir, Remove) or described one (Stat):
  each path as `stat` in the sandbox sees it (size, mode, owner, group, links, mtime at full precision; `exists:
  false` once gone), run as the same user (a relative path resolves as the call's did). An entry the answer gives
  is held against it (bench/differential/agree.py).
- Before the first command of each sandbox and user (before it is sent: no command of the case ever sees the
  probe's): that user's environment as a login shell sees it (HOME, USER, LOGNAME, SHELL, PWD, PATH and every
  E2B_* variable) and `id`, recorded as that command's probe (`env.*`); at the sandbox's first command also that
  of every other user E2B defines (root, user: `env_of_<user>.*`), whether a case runs a command as them or not.

The probes go to the endpoint directly (not through the proxy: no wire line of their own) with the credentials
the client's request carried, bounded by PROBE_S scaled by the host's slowness; a probe that fails is left out.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx

from bench.remote.slowness import scaled

from .capture import ENVELOPE, envelopes
from .policy import parse_time

PROBE_S = 5.0
GIVE_UP = 3
ENVD_PORT = "49983"
_LIFECYCLE = re.compile(
    r"^/(?:v2/)?sandboxes(?:/(?P<id>[^/]+)(?:/(?P<call>connect|timeout|resume|refreshes|pause))?)?$"
)
# the calls that change a path, or describe one (Stat: its entry is held against the probe's `stat`), by the fields
# of their request that name it
_CHANGES = {"/filesystem.Filesystem/Move": ("destination",), "/filesystem.Filesystem/MakeDir": ("path",),
            "/filesystem.Filesystem/Remove": ("path",), "/filesystem.Filesystem/Stat": ("path",)}  # fmt: skip
_MULTIPART_NAME = re.compile(rb'filename="([^"]+)"')
_ENV_NAMES = ("HOME", "USER", "LOGNAME", "SHELL", "PWD", "PATH")
STAT_FORMAT = "%s|%a|%U|%G|%h|%y|%i"
USERS = ("root", "user")  # the users E2B's sandboxes define
_METRICS = re.compile(r"^/sandboxes/(?P<id>[^/]+)/metrics$")
# What the sandbox itself says of a metrics sample's figures, one `name=value` a line: the CPU quota and the memory
# limit of its cgroup (v2, else v1) when it has one, MemTotal, and `df /` in bytes
METRICS_SCRIPT = (
    'c=$(cat /sys/fs/cgroup/cpu.max 2>/dev/null || echo "$(cat /sys/fs/cgroup/cpu*/cpu.cfs_quota_us 2>/dev/null | '
    'head -1) $(cat /sys/fs/cgroup/cpu*/cpu.cfs_period_us 2>/dev/null | head -1)"); echo "cpu=$c"; '
    "m=$(cat /sys/fs/cgroup/memory.max 2>/dev/null || cat /sys/fs/cgroup/memory/memory.limit_in_bytes 2>/dev/null); "
    'echo "memLimit=$m"; awk \'/^MemTotal:/ {printf "memInfo=%.0f\\n", $2 * 1024}\' /proc/meminfo; '
    'df -B1 --output=size,used / | awk \'NR == 2 {print "diskTotal=" $1; print "diskUsed=" $2}\''
)
NO_LIMIT = 1 << 60  # a v1 memory limit past this is none
ENV_SCRIPT = 'id -un; id -gn; env -0 | tr "\\0\\n" "\\n " | grep -E "^(E2B_[A-Za-z0-9_]*|{})=" | sort'.format(
    "|".join(_ENV_NAMES)
)

Send = Callable[..., Awaitable[httpx.Response]]


class Prober:
    """The probes of one wire proxy (one runner): which environments it has seen already."""

    def __init__(self, client: httpx.AsyncClient, api: str, envd_for: Callable[[str, str | None], str]) -> None:
        self.client = client
        self.api = api.rstrip("/")
        self.envd_for = envd_for  # (path, sandbox id) -> the upstream base URL serving it
        self.seen_envs: set[tuple[str, str, str]] = set()
        self.failures = 0  # probes in a row that failed: past GIVE_UP the proxy stops probing (an envd unlike E2B's)
        self.envd_headers: dict[str, dict[str, str]] = {}  # sandbox id -> what its envd requests carried last

    def _remember(self, headers: dict[str, str]) -> None:
        sandbox = headers.get("e2b-sandbox-id")
        if sandbox:
            self.envd_headers[sandbox] = {name: value for name, value in headers.items() if name in (
                "x-access-token", "e2b-sandbox-id", "e2b-traffic-access-token")}  # fmt: skip

    async def _metrics(self, sandbox: str) -> dict[str, Any] | None:
        """What the sandbox itself says of the figures a metrics sample gives: its CPUs (a limited cgroup's quota),
        its memory (the cgroup's limit, else MemTotal: `memFrom`), its root filesystem's size and use (`df`)."""
        out = await self._run(sandbox, self.envd_headers[sandbox], METRICS_SCRIPT, None)
        said = dict(line.partition("=")[::2] for line in out.splitlines())
        found: dict[str, Any] = {}
        quota = said.get("cpu", "").split()
        if len(quota) == 2 and quota[0].isdigit() and quota[1].isdigit() and int(quota[1]) > 0:
            found["metrics.cpuCount"] = max(1, -(-int(quota[0]) // int(quota[1])))  # a limited cgroup's CPUs
        limit = said.get("memLimit", "").strip()
        if limit.isdigit() and 0 < int(limit) < NO_LIMIT:
            found["metrics.memTotal"], found["metrics.memFrom"] = int(limit), "cgroup"
        elif said.get("memInfo", "").isdigit():
            found["metrics.memTotal"], found["metrics.memFrom"] = int(said["memInfo"]), "meminfo"
        for name in ("diskTotal", "diskUsed"):
            if said.get(name, "").isdigit():
                found[f"metrics.{name}"] = int(said[name])
        return found or None

    def _gave_up(self) -> bool:
        return self.failures >= GIVE_UP

    async def probe(
        self,
        method: str,
        url: str,
        status: int | None,
        headers: dict[str, str],
        request: bytes,
        answer: Any,
        before: dict[str, Any] | None = None,
        started: datetime | None = None,
    ) -> dict[str, Any] | None:
        """The probe's leaves for this exchange (`started`: when its request began), or None (nothing to probe,
        or the probe failed)."""
        if status is None or status >= 300 or self._gave_up():
            return None
        try:
            found = await self._probe(method, url, headers, request, answer, before, started or datetime.now(UTC))
        except (httpx.HTTPError, ValueError, KeyError, TypeError, AttributeError):
            self.failures += 1
            return None
        self.failures = 0
        return found

    async def _probe(
        self,
        method: str,
        url: str,
        headers: dict[str, str],
        request: bytes,
        answer: Any,
        before: dict[str, Any] | None,
        started: datetime,
    ) -> dict[str, Any] | None:
        path = urlsplit(url).path
        self._remember(headers)
        metrics = _METRICS.match(path) if method == "GET" else None
        if metrics is not None and metrics["id"] in self.envd_headers:
            return await self._metrics(metrics["id"])
        if not headers.get("e2b-sandbox-id") and method in ("POST", "DELETE"):
            return await self._lifecycle(method, path, headers, answer, request, started)
        sandbox = headers.get("e2b-sandbox-id")
        if sandbox is None:
            return None
        if path == "/files" and method == "POST":
            headers = _as_user(headers, parse_qs(urlsplit(url).query))
            inodes = (before or {}).get("inodes")
            return await self._stat(sandbox, headers, _upload_paths(url, headers, request), inodes)
        if path in _CHANGES:
            body = _json(request)
            return await self._stat(sandbox, headers, [str(body[name]) for name in _CHANGES[path] if body.get(name)])
        if path == "/process.Process/Start":
            return (before or {}).get("env")  # looked at before the command started
        return None

    async def _lifecycle(
        self, method: str, path: str, headers: dict[str, str], answer: Any, request: bytes, started: datetime
    ) -> dict[str, Any] | None:
        answered = datetime.now(UTC)  # the probe begins as the call's answer ends
        match = _LIFECYCLE.match(path)
        if match is None or (match["call"] is None and (match["id"] is None) == (method == "DELETE")):
            return None  # not a lifecycle call: a create is a POST without id, a kill a DELETE with one
        asked = _json(request).get("timeout") if request else None
        sandbox = match["id"] or (answer.get("sandboxID") if isinstance(answer, dict) else None)
        if not isinstance(sandbox, str) or not sandbox:
            return None
        keys = {name: value for name, value in headers.items() if name in ("x-api-key", "authorization")}
        got = await self.client.get(f"{self.api}/sandboxes/{sandbox}", headers=keys, timeout=scaled(PROBE_S))
        if got.status_code != 200:
            return {"status": got.status_code}
        info = got.json()
        found = {name: info.get(name) for name in ("state", "startedAt", "endAt") if name in info}
        # the list's view of the same sandbox (another path through the control plane)
        listed = await self.client.get(f"{self.api}/v2/sandboxes", headers=keys, timeout=scaled(PROBE_S))
        entry = next((item for item in listed.json() if item.get("sandboxID") == sandbox), None)
        if listed.status_code != 200:
            entry = None
        if isinstance(entry, dict):
            found.update({f"list.{name}": entry.get(name) for name in ("state", "startedAt", "endAt") if name in entry})
        # the lifetime the call asked for (a create's, a connect's, a timeout's), against what the sandbox has now
        # (`endAt_less_asked`: how far its start falls outside the call);
        # a connect or resume that asked none: the lifetime the endpoint gives by default
        for prefix, shown in (("", info), ("list.", entry)):
            moment = parse_time(str(shown.get("endAt"))) if isinstance(shown, dict) else None
            if moment is None:
                continue
            if isinstance(asked, int | float) and not isinstance(asked, bool):
                found[f"{prefix}endAt_less_asked"] = _outside(moment, asked, started, answered)
            elif match["call"] in ("connect", "resume"):
                found[f"{prefix}endAt_in"] = round((moment - started).total_seconds(), 1)
        return found

    async def before(self, method: str, url: str, headers: dict[str, str]) -> dict[str, Any]:
        """Before the call is sent: for an upload to a path given in its query, the inode of what is there
        (`{"inodes": {path: inode}}`); for a command, the first of its sandbox and user, that user's environment
        (`{"env": leaves}`: looked at before the command starts, so that no command of the case ever sees it)."""
        self._remember(headers)
        sandbox = headers.get("e2b-sandbox-id")
        path = urlsplit(url).path
        if method != "POST" or not sandbox or self._gave_up():
            return {}
        try:
            if path == "/process.Process/Start":
                env = await self._environment(sandbox, headers)
                return {"env": env} if env else {}
            query = parse_qs(urlsplit(url).query)
            if path != "/files" or not query.get("path") or "content-length" not in headers:
                return {}  # a streamed upload is not held back: its client may give up on a body not read
            target = query["path"][0]
            out = await self._run(
                sandbox, _as_user(headers, query), f"stat -c %i -- {_quote(target)} 2>/dev/null", None
            )
        except (httpx.HTTPError, ValueError, KeyError, TypeError, AttributeError):
            self.failures += 1
            return {}
        return {"inodes": {target: out.strip()}} if out.strip().isdigit() else {}

    async def _stat(
        self, sandbox: str, headers: dict[str, str], paths: list[str], before: dict[str, str] | None = None
    ) -> dict[str, Any] | None:
        if not paths:
            return None
        script = "; ".join(f"stat -c {_quote(STAT_FORMAT)} -- {_quote(p)} 2>/dev/null || echo gone" for p in paths)
        lines = (await self._run(sandbox, headers, script, None)).splitlines()
        found: dict[str, Any] = {}
        for index, line in enumerate(lines[: len(paths)]):
            prefix = "stat" if len(paths) == 1 else f"stat{index}"
            parts = line.split("|")
            if len(parts) != 7:
                found[f"{prefix}.exists"] = False
                continue
            size, mode, owner, group, links, mtime, inode = parts
            found.update({f"{prefix}.exists": True, f"{prefix}.size": int(size), f"{prefix}.mode": mode,
                          f"{prefix}.owner": owner, f"{prefix}.group": group, f"{prefix}.links": int(links),
                          f"{prefix}.mtime": _iso(mtime)})  # fmt: skip
            if before and paths[index] in before:  # it was there before the call: the same file, or a new one
                found[f"{prefix}.same_inode"] = before[paths[index]] == inode
        return found or None

    async def _environment(self, sandbox: str, headers: dict[str, str]) -> dict[str, Any] | None:
        """The environment of the command's user (`env.*`), and at a sandbox's first command that of every other
        user E2B defines (`env_of_<user>.*`): what a command run as them would get, whether a case runs one or not."""
        found: dict[str, Any] = {}
        seen = (sandbox, headers.get("authorization", ""), "")
        if seen not in self.seen_envs:
            self.seen_envs.add(seen)
            found.update(await self._user_environment(sandbox, headers, "env"))
        if (sandbox, "", "every user") not in self.seen_envs:
            self.seen_envs.add((sandbox, "", "every user"))
            own = _user_of(headers)
            for user in USERS:
                if user != own:
                    as_user = _as_user(headers, {"username": [user]})
                    found.update(await self._user_environment(sandbox, as_user, f"env_of_{user}"))
        return found or None

    async def _user_environment(self, sandbox: str, headers: dict[str, str], prefix: str) -> dict[str, Any]:
        lines = (await self._run(sandbox, headers, ENV_SCRIPT, None)).splitlines()
        if len(lines) < 2:
            return {}
        found: dict[str, Any] = {f"{prefix}.user": lines[0], f"{prefix}.group": lines[1]}
        for line in lines[2:]:
            name, _, value = line.partition("=")
            found[f"{prefix}.{name}"] = value
        return found

    async def _run(self, sandbox: str, headers: dict[str, str], script: str, cwd: str | None) -> str:
        """A command's stdout, run by envd as the request's user (Process/Start, Connect JSON)."""
        process: dict[str, Any] = {"cmd": "/bin/bash", "args": ["-l", "-c", script]}
        if cwd:
            process["cwd"] = cwd
        body = json.dumps({"process": process}).encode()
        sent = {name: value for name, value in headers.items() if name in ("x-access-token", "authorization",
                "e2b-sandbox-id", "e2b-traffic-access-token")}  # fmt: skip
        sent.update({"content-type": "application/connect+json", "connect-protocol-version": "1",
                     "e2b-sandbox-port": ENVD_PORT})  # fmt: skip
        base = self.envd_for("/process.Process/Start", sandbox)
        got = await self.client.post(f"{base}/process.Process/Start", content=ENVELOPE.pack(0, len(body)) + body,
                                     headers=sent, timeout=scaled(PROBE_S))  # fmt: skip
        if got.status_code != 200:
            raise ValueError(f"Process/Start answered {got.status_code}")
        out = []
        for flags, payload in envelopes(got.content):
            if flags & 2:
                break
            event = json.loads(payload).get("event", {})
            stdout = (event.get("data") or {}).get("stdout")
            if stdout:
                out.append(base64.b64decode(stdout))
        return b"".join(out).decode("utf-8", "replace")


def _outside(end: datetime, asked: float, started: datetime, answered: datetime) -> float:
    """How far the start of the lifetime asked (`end` less `asked`) falls outside the call that asked it, from its
    request to its answer (0: within; a slow create, whose sandbox starts late in it, is no difference)."""
    start = end.timestamp() - asked
    if start > answered.timestamp():
        return round(start - answered.timestamp(), 1)
    return round(min(0.0, start - started.timestamp()), 1)


def _user_of(headers: dict[str, str]) -> str | None:
    """The user a request asks to run as (envd's `Authorization: Basic base64(user:)`), or None (the default)."""
    scheme, _, encoded = headers.get("authorization", "").partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        return base64.b64decode(encoded, validate=True).decode().partition(":")[0] or None
    except (ValueError, UnicodeDecodeError):
        return None


def _as_user(headers: dict[str, str], query: dict[str, list[str]]) -> dict[str, str]:
    """An upload's user given by its query (`username`): the probes run as that user."""
    user = query.get("username")
    if not user:
        return headers
    return {**headers, "authorization": "Basic " + base64.b64encode(f"{user[0]}:".encode()).decode()}


def _quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


def _iso(stat_time: str) -> str:
    """`2026-12-06 10:42:53.123456789 +0000` -> `2026-12-06T10:42:53.123456789+0000`."""
    day, _, rest = stat_time.strip().partition(" ")
    clock, _, zone = rest.partition(" ")
    return f"{day}T{clock}{zone}"


def _json(body: bytes) -> dict[str, Any]:
    document = json.loads(body or b"{}")
    return document if isinstance(document, dict) else {}


def _first_message(body: bytes) -> Any:
    first = envelopes(body)[:1]
    if first and not first[0][0] & 1:
        return json.loads(first[0][1])
    return json.loads(body or b"{}")


def _upload_paths(url: str, headers: dict[str, str], body: bytes) -> list[str]:
    query = parse_qs(urlsplit(url).query)
    if query.get("path"):
        return query["path"][:1]
    if headers.get("content-type", "").startswith("multipart/"):
        return [name.decode("utf-8", "replace") for name in _MULTIPART_NAME.findall(body)][:8]
    return []
