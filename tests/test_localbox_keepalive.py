"""The embedded endpoint keeps a connection between requests for as long as an SDK client pools it."""

from __future__ import annotations

import socket
import time

import pytest
from loopback import whole_response

from bench.asgi import KEEPALIVE_S
from bench.localbox import server as localbox_server
from bench.localbox.server import LocalEndpoint
from bench.remote.slowness import scaled


def test_the_endpoint_keeps_an_idle_connection_longer_than_the_sdks_pool_does() -> None:
    """A server that closes a pooled connection as the client reuses it resets that request (a create failed
    with `Connection reset by peer` under load): the client must be the one to close it."""
    from e2b.api import pool_idle_timeout  # the SDK's pooled-connection expiry (E2B_KEEPALIVE_EXPIRY)

    assert pool_idle_timeout < KEEPALIVE_S


def test_a_connection_idle_past_the_header_timeout_serves_its_next_request(
    endpoint: LocalEndpoint, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(localbox_server, "HEADER_TIMEOUT_S", 0.5)  # short, to be idle past it (the server is in-thread)
    port = int(endpoint.api_url.rsplit(":", 1)[1])
    request = f"GET /v2/sandboxes HTTP/1.1\r\nHost: 127.0.0.1\r\nX-API-Key: {endpoint.api_key}\r\n\r\n".encode()
    with socket.create_connection(("127.0.0.1", port)) as conn:
        conn.settimeout(60)
        conn.sendall(request)
        first = whole_response(conn)
        time.sleep(2 * scaled(localbox_server.HEADER_TIMEOUT_S))  # idle between requests, as a pooled connection is

        conn.sendall(request)
        second = whole_response(conn)

    assert first.startswith(b"HTTP/1.1 200 ")
    assert second.startswith(b"HTTP/1.1 200 ")
