"""The TLS trust of the harness's own HTTP clients (the preflight, each wire proxy, the leak sweep).

Built once per process: httpx builds it again for every client it opens, loading the whole CA bundle each
time (about 30 ms of CPU, several clients a run), though it is the same for all of them. It trusts what the
runners' SDKs trust: SSL_CERT_FILE, else SSL_CERT_DIR (both passed to the runners), else certifi's bundle,
also for the clients that ignore the rest of the environment (proxies, netrc) with `trust_env=False`."""

from __future__ import annotations

import os
import ssl
from functools import cache

import httpx


def verifying() -> ssl.SSLContext:
    """The context every harness client passes as `verify`, shared while the variables stay the same."""
    return _context(os.environ.get("SSL_CERT_FILE", ""), os.environ.get("SSL_CERT_DIR", ""))


@cache
def _context(cert_file: str, cert_dir: str) -> ssl.SSLContext:
    if cert_file:
        return ssl.create_default_context(cafile=cert_file)
    if cert_dir:
        return ssl.create_default_context(capath=cert_dir)
    return httpx.create_ssl_context(trust_env=False)  # certifi's bundle, as httpx's default
