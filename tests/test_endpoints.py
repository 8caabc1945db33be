"""Endpoint resolution and preflight messages against real loopback servers."""

from __future__ import annotations

import re
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from loopback import closed_port, raw_tcp, serving
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from bench.endpoints import Endpoint, EndpointError, PreflightError, preflight, resolve

KEY = "e2b_0123456789abcdef0123456789abcdef01234567"

CONFIG = """
[endpoints.staging]
api_url = "https://api.staging.example.com/"
sandbox_url = "https://sandbox.staging.example.com"
key_env = "STAGING_KEY"
expectations = "expectations/staging.toml"

[endpoints.bydomain]
domain = "example.test"
"""


def endpoint_at(url: str) -> Endpoint:
    return Endpoint("probe", "toml", url, url, None, "PROBE_KEY", None)


def test_env_endpoint_uses_the_sdk_variables() -> None:
    environ = {"E2B_API_URL": "http://127.0.0.1:9/", "E2B_SANDBOX_URL": "http://127.0.0.1:9", "E2B_API_KEY": KEY}

    endpoint = resolve("env", environ=environ)

    assert (endpoint.kind, endpoint.api_url, endpoint.sandbox_url, endpoint.domain) == (
        "env",
        "http://127.0.0.1:9",
        "http://127.0.0.1:9",
        None,
    )
    assert (endpoint.key_env, endpoint.api_key(environ)) == ("E2B_API_KEY", KEY)


def test_env_endpoint_with_only_a_domain_derives_the_api_url() -> None:
    endpoint = resolve("env", environ={"E2B_DOMAIN": "example.test"})

    assert (endpoint.api_url, endpoint.sandbox_url, endpoint.domain) == (
        "https://api.example.test",
        None,
        "example.test",
    )


def test_toml_endpoint_is_read_from_its_table(tmp_path: Path) -> None:
    config = tmp_path / "endpoints.toml"
    config.write_text(CONFIG)

    staging = resolve("staging", environ={}, config_path=config)
    by_domain = resolve("bydomain", environ={}, config_path=config)

    assert (staging.kind, staging.api_url, staging.sandbox_url, staging.key_env) == (
        "toml",
        "https://api.staging.example.com",
        "https://sandbox.staging.example.com",
        "STAGING_KEY",
    )
    assert staging.expectations is not None and staging.expectations.parts[-2:] == ("expectations", "staging.toml")
    assert staging.api_key({"STAGING_KEY": "k"}) == "k"
    assert (by_domain.api_url, by_domain.sandbox_url, by_domain.domain, by_domain.key_env) == (
        "https://api.example.test",
        None,
        "example.test",
        "E2B_API_KEY",
    )


def test_unknown_endpoint_names_the_known_ones(tmp_path: Path) -> None:
    config = tmp_path / "endpoints.toml"
    config.write_text(CONFIG)

    with pytest.raises(EndpointError, match=r"unknown endpoint 'nope' \(known: bydomain, env, local, staging\)"):
        resolve("nope", environ={}, config_path=config)


TABLE_HEAD = (
    '[endpoints.staging]\napi_url = "https://api.staging.example.com"\nsandbox_url = "https://sb.example.com"\n'
)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("max_sandbox = 3", r"unknown key 'max_sandbox'; did you mean 'max_sandboxes'\?"),
        ("keyenv = 'MY_KEY'", r"unknown key 'keyenv'; did you mean 'key_env'\?"),
        ("colour = 'blue'", r"unknown key 'colour'; known keys: api_url, currency, domain, expectations, key_env"),
        (f"key = '{KEY}'", r"'key' would put a secret in a file; endpoints.toml holds no secrets"),
        (f"API_KEY = '{KEY}'", r"'API_KEY' would put a secret in a file"),
        (f"key_env = '{KEY}'", r"key_env names the environment variable holding the key .*is it the key itself\?"),
        ("key_env = 'not a name'", r"key_env names the environment variable holding the key"),
    ],
)
def test_a_mistake_in_an_endpoint_table_is_named_not_ignored(tmp_path: Path, line: str, message: str) -> None:
    config = tmp_path / "endpoints.toml"
    config.write_text(TABLE_HEAD + line + "\n")

    with pytest.raises(EndpointError, match=r"^\[endpoints.staging\] in .*endpoints.toml: " + message) as raised:
        resolve("staging", environ={}, config_path=config)
    assert KEY not in str(raised.value)  # a key pasted into the file is never repeated back


def test_a_stray_table_of_endpoints_toml_is_named(tmp_path: Path) -> None:
    config = tmp_path / "endpoints.toml"
    config.write_text(TABLE_HEAD.replace("[endpoints.", "[endpoint."))

    with pytest.raises(EndpointError, match=r"unknown table or key .endpoint.; endpoints are tables"):
        resolve("staging", environ={}, config_path=config)


def test_every_table_of_the_example_file_resolves_with_its_commented_keys_too(tmp_path: Path) -> None:
    example = (Path(__file__).resolve().parents[1] / "endpoints.toml.example").read_text()
    # every key the example shows commented out is one a table may have
    uncommented = re.sub(r"^# (\w+ = )", r"\1", example, flags=re.MULTILINE)
    config = tmp_path / "endpoints.toml"
    config.write_text(uncommented)

    names = re.findall(r"^\[endpoints\.([\w-]+)\]", example, flags=re.MULTILINE)
    endpoints = [resolve(name, environ={}, config_path=config) for name in names]

    assert uncommented.count("price_per_vcpu_second = ") == 1 and names == ["e2b-cloud", "staging"]
    assert [e.budget.max_sandboxes for e in endpoints] == [100, None]


def test_local_endpoint_is_bound_once_the_server_listens() -> None:
    endpoint = resolve("local", environ={}).bound("http://127.0.0.1:4321/")

    assert (endpoint.kind, endpoint.api_url, endpoint.sandbox_url) == (
        "local",
        "http://127.0.0.1:4321",
        "http://127.0.0.1:4321",
    )
    assert endpoint.sdk_env() == {"E2B_API_URL": "http://127.0.0.1:4321", "E2B_SANDBOX_URL": "http://127.0.0.1:4321"}


def test_preflight_without_a_key_says_which_variable_to_export() -> None:
    endpoint = resolve("env", environ={})

    with pytest.raises(PreflightError) as failure:
        preflight(endpoint, None)

    assert str(failure.value).startswith("E2B_API_KEY is not set: export it with the API key of endpoint 'env'")


def test_preflight_on_a_closed_port_says_connection_refused() -> None:
    url = f"http://127.0.0.1:{closed_port()}"

    with pytest.raises(PreflightError) as failure:
        preflight(endpoint_at(url), KEY)

    assert str(failure.value) == (
        f"connection refused by {url}/v2/sandboxes: check that the endpoint is running and the port is right."
    )


def sandbox_api(status: int, body: Response | None = None) -> Starlette:
    async def listing(request: Request) -> Response:
        if request.headers.get("x-api-key") != KEY:
            return JSONResponse({"code": 401, "message": f"invalid key {request.headers.get('x-api-key')}"}, 401)
        return body if body is not None else JSONResponse([], status)

    return Starlette(routes=[Route("/sandboxes", listing), Route("/v2/sandboxes", listing)])


def test_preflight_passes_on_an_api_that_lists_sandboxes() -> None:
    with serving(sandbox_api(200)) as url:
        preflight(endpoint_at(url), KEY)


def test_preflight_on_a_rejected_key_says_authentication_failed_without_echoing_the_key() -> None:
    wrong = "e2b_ffffffffffffffffffffffffffffffffffffffff"

    with serving(sandbox_api(200)) as url, pytest.raises(PreflightError) as failure:
        preflight(endpoint_at(url), wrong)

    message = str(failure.value)
    assert message.startswith(
        f"authentication failed: the key in PROBE_KEY was rejected by {url}/v2/sandboxes (HTTP 401, "
    )
    assert wrong not in message


def test_preflight_on_a_web_page_says_the_body_is_not_json() -> None:
    page = PlainTextResponse("<html><body>Welcome to nginx!</body></html>", media_type="text/html")

    with serving(sandbox_api(200, page)) as url, pytest.raises(PreflightError) as failure:
        preflight(endpoint_at(url), KEY)

    assert str(failure.value) == (
        f"{url}/v2/sandboxes answered HTTP 200 with a non-JSON body (text/html; charset=utf-8: "
        "'<html><body>Welcome to nginx!</body></html>'): check that api_url points at an E2B API."
    )


def test_preflight_on_a_server_that_does_not_speak_http_says_so() -> None:
    with raw_tcp(b"SSH-2.0-OpenSSH_9.6\r\n") as url, pytest.raises(PreflightError) as failure:
        preflight(endpoint_at(url), KEY)

    assert str(failure.value).startswith(f"{url}/v2/sandboxes did not answer with valid HTTP (")


def test_preflight_with_https_to_a_plain_http_server_reports_a_tls_failure() -> None:
    with serving(sandbox_api(200)) as url, pytest.raises(PreflightError) as failure:
        preflight(endpoint_at(url.replace("http://", "https://")), KEY)

    assert str(failure.value).startswith(f"TLS handshake with {url.replace('http://', 'https://')}/v2/sandboxes")
    assert "check http:// vs https:// in the URL" in str(failure.value)


@contextmanager
def silent_server() -> Iterator[str]:
    """Accepts connections and never answers."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        listener.close()


def test_preflight_on_a_silent_server_reports_the_timeout() -> None:
    with silent_server() as url, pytest.raises(PreflightError) as failure:
        preflight(endpoint_at(url), KEY, timeout_s=0.3)

    assert str(failure.value) == (
        f"{url}/v2/sandboxes did not answer within 0.3s (ReadTimeout): "
        "check that the endpoint is up and reachable from this machine."
    )


def test_preflight_falls_back_to_the_v1_list_when_v2_is_missing() -> None:
    seen: list[str] = []

    async def v1(request: Request) -> Response:
        seen.append(request.url.path)
        return JSONResponse([])

    async def missing(request: Request) -> Response:
        seen.append(request.url.path)
        return JSONResponse({"code": 404, "message": "not found"}, 404)

    app = Starlette(routes=[Route("/sandboxes", v1), Route("/v2/sandboxes", missing)])
    with serving(app) as url:
        preflight(endpoint_at(url), KEY)

    assert seen == ["/v2/sandboxes", "/sandboxes"]
