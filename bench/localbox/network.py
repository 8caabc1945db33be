"""Egress rules of a sandbox (`PUT /sandboxes/{id}/network`), read and checked as E2B's API reads them."""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field
from typing import Any

DOMAIN = re.compile(r"^(\*\.)?([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\.)*[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$", re.I)


class NetworkError(ValueError):
    """An egress configuration E2B's API would refuse with 400."""


@dataclass(frozen=True)
class EgressRules:
    allow_out: tuple[str, ...] = ()
    deny_out: tuple[str, ...] = ()
    rules: dict[str, Any] = field(default_factory=dict)
    egress_proxy: dict[str, Any] | None = None
    internet: bool = True

    @property
    def unrestricted(self) -> bool:
        """Whether these rules let every connection out, as a sandbox without rules does."""
        return self.internet and not self.deny_out and not self.rules and self.egress_proxy is None

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> EgressRules:
        """The update's rules; an omitted member clears what it configures."""
        allow = _strings(body, "allowOut")
        deny = _strings(body, "denyOut")
        for entry in allow:
            if not (_is_network(entry) or DOMAIN.match(entry)):
                raise NetworkError(f"'allowOut' entry is neither a CIDR block, an IP address nor a domain: '{entry}'")
        for entry in deny:
            if not _is_network(entry):
                raise NetworkError(f"'denyOut' entry is not a CIDR block or an IP address: '{entry}'")
        rules = body.get("rules") or {}
        proxy = body.get("egressProxy")
        internet = body.get("allow_internet_access", True)
        if not isinstance(rules, dict) or not all(isinstance(v, list) for v in rules.values()):
            raise NetworkError("'rules' must map domains to lists of rules")
        if proxy is not None and not isinstance(proxy, dict):
            raise NetworkError("'egressProxy' must be an object")
        if not isinstance(internet, bool):
            raise NetworkError("'allow_internet_access' must be a boolean")
        return cls(tuple(allow), tuple(deny), rules, proxy, internet)


def _strings(body: dict[str, Any], key: str) -> list[str]:
    value = body.get(key) or []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise NetworkError(f"'{key}' must be a list of strings")
    return value


def _is_network(entry: str) -> bool:
    try:
        ipaddress.ip_network(entry, strict=False)
    except ValueError:
        return False
    return True
