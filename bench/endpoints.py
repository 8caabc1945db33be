"""Which E2B-compatible endpoint a run targets, and whether it is usable before anything runs.

An endpoint has a kind, and each kind is one `Provider` class registered in `PROVIDERS`: `local` (the
embedded server, URLs filled in once it listens), `env` (the SDK's own environment variables) or
`toml` (a named table of `endpoints.toml` in the working directory). A provider says how to resolve
the endpoint and what the harness may do with it (serve it, judge quirks, hold it to targets, spend
money on it), so no other module asks which kind it has.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import json
import os
import re
import socket
import ssl
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Literal

import httpx

from .paths import CONFIG_PATH, EXPECTATIONS_DIR
from .remote.budget import E2B_CLOUD_DOMAIN, E2B_FREE_TIER_SANDBOXES, NUMBER_KEYS, Budget, BudgetError
from .remote.slowness import scaled
from .remote.tls import verifying

DEFAULT_KEY_ENV = "E2B_API_KEY"
# The embedded server accepts the key the harness generates and exports under this name.
LOCAL_KEY_ENV = "E2B_BENCH_LOCAL_KEY"
DEFAULT_DOMAIN = "e2b.app"
PREFLIGHT_TIMEOUT_S = 5.0
ENVD_PORT = 49983  # the port of envd in a sandbox, as the SDKs address it by domain
PREFLIGHT_TEMPLATE = "base"
PREFLIGHT_CREATE_S = 30.0  # a create takes seconds on a distant endpoint (quiet host)
PREFLIGHT_SANDBOX_S = 30  # the preflight's own sandbox is killed at once; its lifetime only bounds a failed kill
PREFLIGHT_METADATA = {"e2b-bench": "preflight"}
# The key format Python e2b checks before sending a key, unless E2B_VALIDATE_API_KEY=false: the pinned
# 2.31.0 and 2.45.1 do; 2.20.3, 2.63.0 and npm e2b 2.50/2.51 send any key (read in each pinned SDK's source).
SDK_KEY_FORMAT = re.compile(r"\Ae2b_[0-9a-f]+\Z")
KEY_FORMAT_CHECKED = ((2, 31), (2, 63))  # Python e2b releases [from, to) that refuse other keys

Kind = Literal["local", "env", "toml"]


class EndpointError(Exception):
    """The endpoint name or its configuration is unusable."""


class PreflightError(Exception):
    """The endpoint failed the preflight check; the message says what to do."""


@dataclass(frozen=True)
class Endpoint:
    """Where the SDKs are pointed. Holds the NAME of the key's environment variable, never the key."""

    name: str
    kind: Kind
    api_url: str
    sandbox_url: str | None
    domain: str | None
    key_env: str
    expectations: Path | None
    budget: Budget = dataclasses.field(default_factory=Budget)  # quota and prices (endpoints.toml)

    @property
    def provider(self) -> Provider:
        return PROVIDERS[self.kind]

    def api_key(self, environ: Mapping[str, str] = os.environ) -> str | None:
        return environ.get(self.key_env) or None

    def bound(self, url: str) -> Endpoint:
        """The same endpoint served at `url` (the embedded server once it listens)."""
        return dataclasses.replace(self, api_url=url.rstrip("/"), sandbox_url=url.rstrip("/"))

    @property
    def api_url_source(self) -> str:
        """Where the user set `api_url`, named as they would look for it."""
        return {"env": "E2B_API_URL", "toml": f"api_url of [endpoints.{self.name}] in endpoints.toml"}.get(
            self.kind, "the API URL"
        )

    def sdk_env(self) -> dict[str, str]:
        """Environment variables pointing an SDK straight at this endpoint (without the key)."""
        env = {"E2B_API_URL": self.api_url}
        if self.sandbox_url is not None:
            env["E2B_SANDBOX_URL"] = self.sandbox_url
        if self.domain is not None:
            env["E2B_DOMAIN"] = self.domain
        return env


def resolve(name: str, *, environ: Mapping[str, str] = os.environ, config_path: Path = CONFIG_PATH) -> Endpoint:
    """The endpoint called `name`: a provider's own name (`local`, `env`) or a table of `config_path`."""
    provider = next((p for p in PROVIDERS.values() if p.by_name and p.kind == name), PROVIDERS["toml"])
    return provider.resolve(name, environ, config_path)


def _default_expectations(name: str) -> Path | None:
    path = EXPECTATIONS_DIR / f"{name}.toml"
    return path if path.is_file() else None


class Provider:
    """One kind of endpoint: how it is resolved and what the harness may do with it."""

    kind: ClassVar[Kind]
    by_name: ClassVar[bool] = False  # `--endpoint <kind>` names it (else: a table of endpoints.toml)
    embedded: ClassVar[bool] = False  # the harness serves it itself for the run
    costs_money: ClassVar[bool] = True  # every sandbox is billed: counts must be given explicitly
    has_targets: ClassVar[bool] = False  # the benchmark holds it to the project's performance targets
    quirks: ClassVar[bool] = False  # it can be told to deviate (`--profile`, `--quirk`)

    def resolve(self, name: str, environ: Mapping[str, str], config_path: Path) -> Endpoint:
        raise NotImplementedError

    def with_profile(self, endpoint: Endpoint, profile: str, quirks: list[str]) -> Endpoint:
        """The endpoint under a quirk profile, named after it and judged by its declarations."""
        if profile != "e2b" or quirks:
            raise EndpointError(
                f"--profile and --quirk apply only to the embedded endpoint (--endpoint local), "
                f"not to {endpoint.name!r}: drop them or choose --endpoint local"
            )
        return endpoint


class LocalProvider(Provider):
    """The embedded endpoint, served by the harness on loopback for the run."""

    kind = "local"
    by_name = embedded = has_targets = quirks = True
    costs_money = False

    def resolve(self, name: str, environ: Mapping[str, str], config_path: Path) -> Endpoint:
        return Endpoint("local", "local", "", None, None, LOCAL_KEY_ENV, _default_expectations("local"))

    def with_profile(self, endpoint: Endpoint, profile: str, quirks: list[str]) -> Endpoint:
        if profile == "e2b" and not quirks:
            return endpoint
        name = (f"local-{profile}" if profile != "e2b" else "local") + ("+quirks" if quirks else "")
        declared = EXPECTATIONS_DIR / f"{profile}.toml"
        expectations = declared if profile != "e2b" and declared.exists() else endpoint.expectations
        return dataclasses.replace(endpoint, name=name, expectations=expectations)


class EnvProvider(Provider):
    """The endpoint the SDK's own environment variables point at."""

    kind = "env"
    by_name = True

    def resolve(self, name: str, environ: Mapping[str, str], config_path: Path) -> Endpoint:
        return _from_environ(environ)


class NamedProvider(Provider):
    """A table `[endpoints.<name>]` of endpoints.toml."""

    kind = "toml"

    def resolve(self, name: str, environ: Mapping[str, str], config_path: Path) -> Endpoint:
        return _from_config(name, config_path)


PROVIDERS: dict[str, Provider] = {p.kind: p for p in (LocalProvider(), EnvProvider(), NamedProvider())}


def _from_environ(environ: Mapping[str, str]) -> Endpoint:
    api_url = environ.get("E2B_API_URL") or None
    sandbox_url = environ.get("E2B_SANDBOX_URL") or None
    domain = environ.get("E2B_DOMAIN") or None
    if sandbox_url is None and domain is None:
        domain = DEFAULT_DOMAIN  # what the SDK itself falls back to
    return Endpoint(
        name="env",
        kind="env",
        api_url=(api_url or f"https://api.{domain}").rstrip("/"),
        sandbox_url=sandbox_url.rstrip("/") if sandbox_url else None,
        domain=domain,
        key_env=DEFAULT_KEY_ENV,
        expectations=_default_expectations("env"),
        budget=Budget(max_sandboxes=_e2b_quota(api_url or f"https://api.{domain}")),
    )


def _from_config(name: str, config_path: Path) -> Endpoint:
    if not config_path.is_file():
        raise EndpointError(
            f"unknown endpoint {name!r}: use 'local', 'env', or define [endpoints.{name}] in {config_path} "
            f"(see endpoints.toml.example)"
        )
    try:
        with config_path.open("rb") as handle:
            document = tomllib.load(handle)
    except tomllib.TOMLDecodeError as exc:
        raise EndpointError(f"{config_path} is not valid TOML: {exc}") from exc
    stray = sorted(set(document) - {"endpoints"})
    if stray:
        raise EndpointError(f"{config_path}: unknown table or key {stray[0]!r}; endpoints are tables [endpoints.NAME]")
    tables = document.get("endpoints", {})
    table = tables.get(name)
    if not isinstance(table, dict):
        known = ", ".join(sorted(["local", "env", *tables])) or "none"
        raise EndpointError(f"unknown endpoint {name!r} (known: {known}); define [endpoints.{name}] in {config_path}")
    _check_table(table, f"[endpoints.{name}] in {config_path}")
    domain = table.get("domain")
    api_url = table.get("api_url") or (f"https://api.{domain}" if domain else None)
    if not api_url:
        raise EndpointError(f"[endpoints.{name}] in {config_path} needs api_url or domain")
    sandbox_url = table.get("sandbox_url")
    if sandbox_url is None and domain is None:
        raise EndpointError(f"[endpoints.{name}] in {config_path} needs sandbox_url or domain")
    expectations = table.get("expectations")
    try:
        budget = Budget.from_table(table, f"[endpoints.{name}] in {config_path}", _e2b_quota(api_url))
    except BudgetError as exc:
        raise EndpointError(str(exc)) from None
    return Endpoint(
        name=name,
        kind="toml",
        api_url=api_url.rstrip("/"),
        sandbox_url=sandbox_url.rstrip("/") if sandbox_url else None,
        domain=domain,
        key_env=table.get("key_env", DEFAULT_KEY_ENV),
        expectations=(config_path.parent / expectations) if expectations else _default_expectations(name),
        budget=budget,
    )


# The keys an endpoint's table may have (endpoints.toml.example documents each).
TABLE_KEYS = frozenset({"api_url", "sandbox_url", "domain", "key_env", "expectations", "max_sandboxes", "currency",
                        *NUMBER_KEYS})  # fmt: skip
# Keys that would hold a secret: the file is read from the working directory and often committed.
SECRET_KEYS = frozenset({"key", "api_key", "apikey", "e2b_api_key", "token", "access_token", "secret", "password"})
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
KEY_SHAPE = re.compile(r"e2b_[0-9a-f]{16,}", re.IGNORECASE)  # an E2B API key, pasted where its variable's name goes


def _check_table(table: Mapping[str, object], where: str) -> None:
    """A mistake in an endpoint's table is one sentence naming the key, never a key silently ignored."""
    for key in table:
        if key.lower() in SECRET_KEYS:
            raise EndpointError(
                f"{where}: {key!r} would put a secret in a file; endpoints.toml holds no secrets: keep the key in an "
                f'environment variable and name that variable with key_env = "NAME"'
            )
        if key not in TABLE_KEYS:
            near = difflib.get_close_matches(key, sorted(TABLE_KEYS), n=1, cutoff=0.6)
            hint = f"did you mean {near[0]!r}?" if near else f"known keys: {', '.join(sorted(TABLE_KEYS))}"
            raise EndpointError(f"{where}: unknown key {key!r}; {hint}")
    key_env = table.get("key_env")
    if key_env is not None and (
        not isinstance(key_env, str) or not ENV_NAME.fullmatch(key_env) or KEY_SHAPE.fullmatch(key_env)
    ):
        # a key pasted where the variable's name goes: say so without repeating the value
        raise EndpointError(
            f'{where}: key_env names the environment variable holding the key (e.g. "E2B_API_KEY"); its value is '
            f"not a variable name (is it the key itself? keep keys out of endpoints.toml)"
        )


def _e2b_quota(api_url: str) -> int | None:
    """E2B's own cloud has a concurrency quota (its free tier's, unless the endpoint's table says more)."""
    host = httpx.URL(api_url).host
    return E2B_FREE_TIER_SANDBOXES if host == f"api.{E2B_CLOUD_DOMAIN}" else None


# --- preflight -------------------------------------------------------------------------------------


def preflight(
    endpoint: Endpoint,
    key: str | None,
    *,
    timeout_s: float | None = None,
    python_sdks: Mapping[str, str] | None = None,
    environ: Mapping[str, str] = os.environ,
) -> None:
    """List one sandbox with the key; raise PreflightError with one actionable sentence if that fails.
    `python_sdks`: runner name -> the Python e2b version it pins, for the runs whose SDKs judge the key."""
    if not key:
        raise PreflightError(
            f"{endpoint.key_env} is not set: export it with the API key of endpoint {endpoint.name!r} "
            f"({endpoint.api_url}) or choose another endpoint with --endpoint."
        )
    refusing = key_refused_by(key, python_sdks or {}, environ)
    if refusing:
        raise PreflightError(
            f"the key in {endpoint.key_env} is not of the form e2b_<hex>, which {', '.join(refusing)} refuse "
            "before sending it ('Invalid API key format'): export E2B_VALIDATE_API_KEY=false (those SDKs read it) "
            "or leave those runners out with --runner."
        )
    timeout = scaled(PREFLIGHT_TIMEOUT_S) if timeout_s is None else timeout_s  # a busy host answers late
    with httpx.Client(timeout=timeout, trust_env=False, verify=verifying(), follow_redirects=False) as client:
        response = _list_one(client, f"{endpoint.api_url}/v2/sandboxes", key)
        if response.status_code == 404:
            response = _list_one(client, f"{endpoint.api_url}/sandboxes", key)
        _judge(endpoint, response, key)
        envd_reachable(endpoint, key, client)


# --- the sandbox URL: where the SDKs send envd traffic ----------------------------------------------


def sandbox_url_source(endpoint: Endpoint) -> str:
    """Where the user set the sandbox URL (or the domain it is derived from), named as they would look for it."""
    table = f"of [endpoints.{endpoint.name}] in endpoints.toml"
    if endpoint.sandbox_url is not None:
        return {"env": "E2B_SANDBOX_URL", "toml": f"sandbox_url {table}"}.get(endpoint.kind, "the sandbox URL")
    return {"env": "E2B_DOMAIN", "toml": f"domain {table}"}.get(endpoint.kind, "the sandbox domain")


def envd_url(endpoint: Endpoint, sandbox_id: str) -> str | None:
    """Where envd requests of `sandbox_id` go (as the wire proxy routes them: bench/wire.py `upstream_for`)."""
    if endpoint.sandbox_url is not None:
        return endpoint.sandbox_url
    return f"https://{ENVD_PORT}-{sandbox_id}.{endpoint.domain}" if endpoint.domain else None


def envd_reachable(endpoint: Endpoint, key: str, client: httpx.Client) -> None:
    """Every URL the SDKs will use answers: the sandbox URL itself (when set), then, through one small sandbox
    created for it (and killed), that sandbox's envd port as the SDKs route it (`GET /health` with its
    `E2b-Sandbox-Id`). A transport failure is a PreflightError naming the variable; any HTTP answer is reachable
    (what envd answers is the cases' to judge). A create the endpoint refuses leaves the check to the cases."""
    if endpoint.provider.embedded:  # the harness serves both URLs itself, on the port the listing answered
        return
    source = sandbox_url_source(endpoint)
    if endpoint.sandbox_url is not None:
        _reach(client, endpoint.sandbox_url, source, {})
    try:
        created = client.post(
            f"{endpoint.api_url}/sandboxes",
            json={"templateID": PREFLIGHT_TEMPLATE, "timeout": PREFLIGHT_SANDBOX_S, "metadata": PREFLIGHT_METADATA},
            headers={"X-API-KEY": key},
            timeout=scaled(PREFLIGHT_CREATE_S),
        )
        answer = created.json() if created.status_code < 300 else {}
    except (httpx.HTTPError, ValueError):
        return
    sandbox_id = answer.get("sandboxID") if isinstance(answer, dict) else None
    if not isinstance(sandbox_id, str):
        return
    try:
        url = envd_url(endpoint, sandbox_id)
        if url is not None:
            headers = {"E2b-Sandbox-Id": sandbox_id}
            token = answer.get("envdAccessToken")
            if isinstance(token, str) and token:
                headers["X-Access-Token"] = token
            named = source if endpoint.sandbox_url is not None else f"the envd port of a sandbox ({source})"
            _reach(client, url, named, headers)
    finally:
        with contextlib.suppress(httpx.HTTPError):
            client.delete(f"{endpoint.api_url}/sandboxes/{sandbox_id}", headers={"X-API-KEY": key})


def _reach(client: httpx.Client, url: str, source: str, headers: Mapping[str, str]) -> None:
    try:
        client.get(f"{url.rstrip('/')}/health", headers=dict(headers))
    except httpx.TimeoutException as exc:
        raise PreflightError(
            f"{source} {url} is unreachable: no answer within {client.timeout.read:g}s ({type(exc).__name__}); "
            "point it at the endpoint's sandbox (envd) URL."
        ) from exc
    except httpx.HTTPError as exc:
        raise PreflightError(
            f"{source} {url} is unreachable: {_reason(exc)}; point it at the endpoint's sandbox (envd) URL."
        ) from exc


def _reason(exc: httpx.HTTPError) -> str:
    """The transport failure in a few words: the operating system's when there are some."""
    chain = _causes(exc)
    if any(isinstance(item, socket.gaierror) for item in chain):
        return "its host name does not resolve"
    if any(isinstance(item, ConnectionRefusedError) for item in chain):
        return "connection refused"
    tls = next((item for item in chain if isinstance(item, ssl.SSLError)), None)
    if tls is not None:
        return f"TLS handshake failed ({getattr(tls, 'reason', None) or tls})"
    errno = next((item for item in chain if isinstance(item, OSError) and item.errno), None)
    if errno is not None:
        return os.strerror(errno.errno).lower()  # type: ignore[union-attr, arg-type]
    return f"{type(exc).__name__}: {exc}"


def _list_one(client: httpx.Client, url: str, key: str) -> httpx.Response:
    try:
        return client.get(url, params={"limit": 1}, headers={"X-API-KEY": key, "Accept": "application/json"})
    except httpx.TimeoutException as exc:
        raise PreflightError(
            f"{url} did not answer within {client.timeout.read:g}s ({type(exc).__name__}): "
            "check that the endpoint is up and reachable from this machine."
        ) from exc
    except httpx.HTTPError as exc:
        raise PreflightError(_transport_failure(url, exc)) from exc


def _transport_failure(url: str, exc: httpx.HTTPError) -> str:
    chain = _causes(exc)
    if any(isinstance(item, socket.gaierror) for item in chain):
        return f"cannot resolve the host of {url} (DNS lookup failed): check the URL or domain spelling and DNS."
    if any(isinstance(item, ConnectionRefusedError) for item in chain):
        return f"connection refused by {url}: check that the endpoint is running and the port is right."
    tls = next((item for item in chain if isinstance(item, ssl.SSLError)), None)
    if tls is not None:
        reason = getattr(tls, "reason", None) or str(tls)
        return (
            f"TLS handshake with {url} failed ({reason}): check http:// vs https:// in the URL, "
            "or point SSL_CERT_FILE at the endpoint's CA certificate."
        )
    if isinstance(exc, httpx.RemoteProtocolError | httpx.ProtocolError):
        return f"{url} did not answer with valid HTTP ({exc}): check that the URL points at an E2B API."
    return f"request to {url} failed ({type(exc).__name__}: {exc}): check the URL and the network."


def _judge(endpoint: Endpoint, response: httpx.Response, key: str) -> None:
    url = str(response.request.url.copy_with(query=None))
    status = response.status_code
    if status in (401, 403):
        raise PreflightError(
            f"authentication failed: the key in {endpoint.key_env} was rejected by {url} (HTTP {status}, "
            f"{_excerpt(response, key)}): check that it is a valid key for this endpoint."
        )
    if status in (404, 405, 501) and endpoint.api_url.endswith("/v1"):
        raise PreflightError(
            f"{endpoint.api_url} has no sandbox list (HTTP {status}): the SDKs add their own versioned paths "
            f"(/v2/sandboxes), so drop the trailing /v1 from {endpoint.api_url_source}."
        )
    if status == 404:
        raise PreflightError(
            f"{endpoint.api_url} has neither /v2/sandboxes nor /sandboxes (HTTP 404): "
            "check that api_url points at the E2B API, not at a sandbox or a web page."
        )
    if status >= 400:
        raise PreflightError(
            f"{url} answered HTTP {status} ({_excerpt(response, key)}): the endpoint is unhealthy, retry later "
            "or ask its operators."
        )
    try:
        listing = json.loads(response.content)
    except ValueError:
        kind = response.headers.get("content-type", "no content type")
        raise PreflightError(
            f"{url} answered HTTP {status} with a non-JSON body ({kind}: {_excerpt(response, key)}): "
            "check that api_url points at an E2B API."
        ) from None
    if not isinstance(listing, list):
        raise PreflightError(
            f"{url} answered HTTP {status} with JSON that is not a sandbox list ({_excerpt(response, key)}): "
            "check that api_url points at an E2B API."
        )


def key_refused_by(key: str, python_sdks: Mapping[str, str], environ: Mapping[str, str] = os.environ) -> list[str]:
    """The runners (by name) whose pinned Python e2b refuses `key` before sending it."""
    if SDK_KEY_FORMAT.match(key) or environ.get("E2B_VALIDATE_API_KEY", "true").lower() == "false":
        return []
    low, high = KEY_FORMAT_CHECKED
    return sorted(name for name, version in python_sdks.items() if low <= _release(version) < high)


def _release(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version)[:2])


def _excerpt(response: httpx.Response, key: str, limit: int = 120) -> str:
    # A server may echo the key it rejected; the message must not.
    text = " ".join(response.content[:1000].decode("utf-8", errors="replace").replace(key, "[REDACTED]").split())
    return repr(text[:limit] + ("..." if len(text) > limit else ""))


def _causes(exc: BaseException) -> list[BaseException]:
    chain: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in chain:
        chain.append(current)
        current = current.__cause__ or current.__context__
    return chain
