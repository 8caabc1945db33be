"""Keep secrets off disk: every byte written under a run directory or a report passes through here."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any
from urllib.parse import quote

REDACTED = "[REDACTED]"
MIN_SECRET_LENGTH = 8

# Names compared case-insensitively: headers, JSON members, keyword arguments.
SECRET_NAMES = frozenset(
    name.lower()
    for name in (
        "X-API-KEY",
        "X-Access-Token",
        "Authorization",
        "envdAccessToken",
        "trafficAccessToken",
        "traffic_access_token",
        "e2b-traffic-access-token",
        "api_key",
        "apiKey",
        "E2B_API_KEY",
        "OPENAI_API_KEY",
        "access_token",
        "Proxy-Authorization",
        "Cookie",
        "Set-Cookie",
    )
)
# `*_TOKEN` only in upper case (environment variables): `next_token` is a pagination cursor.
_ENV_STYLE = re.compile(r"[A-Z][A-Z0-9_]*_(?:TOKEN|SECRET|PASSWORD)|(?i:[a-z][a-z0-9_]*_api_key)")

_NAME = "(?i:" + "|".join(map(re.escape, sorted(SECRET_NAMES, key=len, reverse=True))) + f")|{_ENV_STYLE.pattern}"
# A name, optionally quoted, then `:` or `=` (not `==`, a pin or a comparison), then a quoted string or one
# bare token (an optional auth scheme first). Bare tokens stop at delimiters so that JSON/HTML around them survives.
_ASSIGNMENT = re.compile(
    rf"""(?P<head>(?<![\w-])(?P<q>["']?)(?:{_NAME})(?P=q)\s*(?::|=(?!=))\s*)"""
    r"""(?P<value>"(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*'"""
    r"""|["']?(?i:(?:bearer|basic|token)\s+)?(?:\[REDACTED\]|[^\s"'<>,;&{}\[\]()\\]+))"""
)
# A package version (`0.7.1`, `2026.10.19.post1`, `1.0.0-beta.2`): never a secret, even under a secret-looking
# name (the npm package `cookie` is pinned like any other).
_VERSION = re.compile(r"v?\d+(?:\.\d+)+(?:[-+]?[A-Za-z][0-9A-Za-z]*)?(?:[-+.][0-9A-Za-z]+)*")
VERSION_MAX_LENGTH = 64
_E2B_KEY = re.compile(r"e2b_[0-9a-f]{20,}")
_QUERY_PARAM = re.compile(r"(?P<head>[?&](?:signature|access_token|key)=)(?P<value>[^&#\s\"'<>]*)")


def is_secret_name(name: str) -> bool:
    """Whether a mapping key or header name holds a secret value."""
    return name.lower() in SECRET_NAMES or _ENV_STYLE.fullmatch(name) is not None


def is_version(value: object) -> bool:
    """Whether `value` is a version string, which is left as it is under any name."""
    return isinstance(value, str) and len(value) <= VERSION_MAX_LENGTH and _VERSION.fullmatch(value) is not None


def _redact_assignment(match: re.Match[str]) -> str:
    if is_version(match["value"].strip("\"'")):
        return match[0]
    quote_char = match["value"][0]
    if quote_char in "\"'":
        return f"{match['head']}{quote_char}{REDACTED}{quote_char}"
    return f"{match['head']}{REDACTED}"


class Redactor:
    """Replaces known secret values and secret-shaped text with `[REDACTED]`."""

    def __init__(self, secrets: Iterable[str | None] = ()) -> None:
        self._secrets: set[str] = set()
        self._literal: re.Pattern[str] | None = None
        for secret in secrets:
            self.add(secret)

    def add(self, value: str | None) -> None:
        """Remember a secret value (and its URL/JSON-escaped spellings); short values are ignored."""
        if not value or len(value) < MIN_SECRET_LENGTH:
            return
        spellings = {value, quote(value, safe=""), json.dumps(value)[1:-1]}
        fresh = {spelling for spelling in spellings if len(spelling) >= MIN_SECRET_LENGTH} - self._secrets
        if not fresh:
            return
        self._secrets |= fresh
        # Longest first, so that a secret containing another one is replaced whole.
        ordered = sorted(self._secrets, key=len, reverse=True)
        self._literal = re.compile("|".join(map(re.escape, ordered)))

    def redact_text(self, text: str) -> str:
        if self._literal is not None:
            text = self._literal.sub(REDACTED, text)
        text = _E2B_KEY.sub(REDACTED, text)
        text = _ASSIGNMENT.sub(_redact_assignment, text)
        return _QUERY_PARAM.sub(lambda m: f"{m['head']}{REDACTED}", text)

    def redact_obj(self, obj: Any) -> Any:
        """A deep copy of `obj` with secret-named members and secret substrings redacted."""
        if isinstance(obj, str):
            return self.redact_text(obj)
        if isinstance(obj, dict):
            return {
                (self.redact_text(key) if isinstance(key, str) else key): (
                    REDACTED
                    if isinstance(key, str)
                    and is_secret_name(key)
                    and value not in (None, "")
                    and not is_version(value)
                    else self.redact_obj(value)
                )
                for key, value in obj.items()
            }
        if isinstance(obj, list):
            return [self.redact_obj(item) for item in obj]
        if isinstance(obj, tuple):
            return tuple(self.redact_obj(item) for item in obj)
        if isinstance(obj, int | float) and not isinstance(obj, bool):
            # A secret of digits can sit inside a number as JSON writes it: the number goes, not only its digits.
            text = repr(obj)
            return REDACTED if self.redact_text(text) != text else obj
        return obj
