"""A second path beside the answers: what the wire proxy looks at itself after an exchange, before its client
has the answer's end (so nothing the case does next can race it), recorded as the exchange's `probe`.

- After a lifecycle call (create, connect, timeout, resume, refresh, pause, kill) that succeeded: the sandbox as
  the control plane's GET /sandboxes/{id} reports it then (`state`, `endAt`, `startedAt`, or the status), and as
  its list (GET /v2/sandboxes) reports it (`list.*`).
- After an envd call that changed files (an upload, Filesystem Move, MakeDir, Remove): each path as `stat` in
  the sandbox sees it (size, mode, owner, group, links, mtime at full precision; `exists: false` once gone), run
  as the same user (a relative path resolves as the call's did).
- Before the first command of each sandbox and user (before it is sent: no command of the case ever sees the
  probe's): that user's environment as a login shell sees it (HOME, USER, LOGNAME, SHELL, PWD, PATH and every
  E2B_* variable) and `id`, recorded as that command's probe.

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
_CHANGES = {"/filesystem.Filesystem/Move": ("destination",), "/filesystem.Filesystem/MakeDir": ("path",),
            "/filesystem.Filesystem/Remove": ("path",)}  # fmt: skip
_MULTIPART_NAME = re.compile(rb'filename="([^"]+)"')
_ENV_NAMES = ("HOME", "USER", "LOGNAME", "SHELL", "PWD", "PATH")
STAT_FORMAT = "%s|%a|%U|%G|%h|%y|%i"
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
        # the lifetime the call asked for (a create's, a connect's, a timeout's), against what the sandbox has now;
        # a connect or resume that asked none: the lifetime the endpoint gives by default
        for prefix, shown in (("", info), ("list.", entry)):
            moment = parse_time(str(shown.get("endAt"))) if isinstance(shown, dict) else None
            if moment is None:
                continue
            if isinstance(asked, int | float) and not isinstance(asked, bool):
                found[f"{prefix}endAt_less_asked"] = round((moment - started).total_seconds() - asked, 1)
            elif match["call"] in ("connect", "resume"):
                found[f"{prefix}endAt_in"] = round((moment - started).total_seconds(), 1)
        return found

    async def before(self, method: str, url: str, headers: dict[str, str]) -> dict[str, Any]:
        """Before the call is sent: for an upload to a path given in its query, the inode of what is there
        (`{"inodes": {path: inode}}`); for a command, the first of its sandbox and user, that user's environment
        (`{"env": leaves}`: looked at before the command starts, so that no command of the case ever sees it)."""
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
        seen = (sandbox, headers.get("authorization", ""), "")
        if seen in self.seen_envs:
            return None
        self.seen_envs.add(seen)
        lines = (await self._run(sandbox, headers, ENV_SCRIPT, None)).splitlines()
        if len(lines) < 2:
            return None
        found: dict[str, Any] = {"env.user": lines[0], "env.group": lines[1]}
        for line in lines[2:]:
            name, _, value = line.partition("=")
            found[f"env.{name}"] = value
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
