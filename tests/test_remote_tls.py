"""The harness's own HTTP clients (preflight, wire proxy, leak sweep) share one TLS context and trust what the
runners trust: SSL_CERT_FILE, else certifi's bundle. Checked by handshakes with a loopback HTTPS server whose
certificate only that file vouches for."""

from __future__ import annotations

import ssl
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from loopback import serving
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from bench.endpoints import Endpoint, PreflightError, preflight
from bench.housekeeping import sweep
from bench.redaction import Redactor
from bench.remote.slowness import scaled
from bench.remote.tls import verifying
from bench.wire import WireProxy

KEY = "e2b_0123456789abcdef0123456789abcdef01234567"


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and its key."""
    directory = tmp_path_factory.mktemp("tls")
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    return cert, key


@contextmanager
def https_api(certificate: tuple[Path, Path]) -> Iterator[str]:
    """An API on loopback over TLS that lists no sandbox; yields its base URL."""

    async def listing(request: Request) -> JSONResponse:
        return JSONResponse([])

    app = Starlette(routes=[Route("/v2/sandboxes", listing), Route("/sandboxes", listing)])
    with serving(app, ssl_certfile=str(certificate[0]), ssl_keyfile=str(certificate[1])) as url:
        yield url


def endpoint_at(url: str) -> Endpoint:
    return Endpoint("tls", "toml", url, url, None, "TLS_KEY", None)


def test_every_client_of_a_process_shares_one_context_while_the_variables_stay(
    monkeypatch: pytest.MonkeyPatch, certificate: tuple[Path, Path]
) -> None:
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    default = verifying()
    assert verifying() is default
    assert default.verify_mode == ssl.CERT_REQUIRED and default.check_hostname
    monkeypatch.setenv("SSL_CERT_FILE", str(certificate[0]))
    assert verifying() is not default
    assert [c["subject"] for c in verifying().get_ca_certs()] == [((("commonName", "127.0.0.1"),),)]


def test_the_preflight_trusts_a_certificate_only_through_ssl_cert_file(
    monkeypatch: pytest.MonkeyPatch, certificate: tuple[Path, Path]
) -> None:
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    with https_api(certificate) as url:
        monkeypatch.delenv("SSL_CERT_FILE", raising=False)
        with pytest.raises(PreflightError) as failure:
            preflight(endpoint_at(url), KEY)
        expected = f"TLS handshake with {url}/v2/sandboxes failed (CERTIFICATE_VERIFY_FAILED)"
        assert str(failure.value).startswith(expected)
        monkeypatch.setenv("SSL_CERT_FILE", str(certificate[0]))
        preflight(endpoint_at(url), KEY)  # the listing answered over the verified connection: no error


def test_the_leak_sweep_trusts_a_certificate_only_through_ssl_cert_file(
    monkeypatch: pytest.MonkeyPatch, certificate: tuple[Path, Path]
) -> None:
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    with https_api(certificate) as url:
        monkeypatch.delenv("SSL_CERT_FILE", raising=False)
        with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
            sweep(url, KEY, "run-1")
        monkeypatch.setenv("SSL_CERT_FILE", str(certificate[0]))
        found = sweep(url, KEY, "run-1")
        assert (found.survivors, found.foreign) == ([], [])


def test_a_wire_proxy_forwards_to_an_endpoint_only_ssl_cert_file_vouches_for(
    monkeypatch: pytest.MonkeyPatch, certificate: tuple[Path, Path], tmp_path: Path
) -> None:
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    monkeypatch.setenv("SSL_CERT_FILE", str(certificate[0]))
    with https_api(certificate) as url, WireProxy(url, url, tmp_path / "wire.jsonl", "tls", Redactor()) as proxy:
        answer = httpx.get(f"{proxy.url}/v2/sandboxes", headers={"X-API-KEY": KEY}, timeout=scaled(10))
    assert (answer.status_code, answer.json()) == (200, [])
